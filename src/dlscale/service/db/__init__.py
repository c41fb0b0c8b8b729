"""The service's database: engines for SQLite (default) and PostgreSQL, Alembic migrations run
from code, and the session factory every request and the scheduler loop open transactions on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, exc, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from dlscale.errors import UserError, one_line

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Any fixed number: PostgreSQL's advisory lock that serializes migrations and job numbering.
PG_LOCK_KEY = 0x646C7363  # "dlsc"
SQLITE_BUSY_TIMEOUT_MS = 10_000


def default_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir).expanduser().resolve() / 'service.db'}"


def safe_url(url: str) -> str:
    """The URL as it may be printed: any password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except exc.ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL (readers never block the writer), foreign keys and a
    busy timeout on every connection, and its folder made."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        raise UserError(f"database URL {safe_url(url)}: not a valid URL") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    try:
        # The scheduler thread and request threads share the pool; each connection is used by
        # one thread at a time, which is all that SQLite's check_same_thread guards.
        args = {"check_same_thread": False} if sqlite else {}
        engine = create_engine(parsed, connect_args=args, pool_pre_ping=not sqlite)
    except (exc.NoSuchModuleError, exc.ArgumentError, ImportError) as error:
        raise UserError(f"database URL {safe_url(url)}: {one_line(error)}") from None
    if sqlite:
        _sqlite_setup(engine)
    return engine


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # Python's sqlite3 would BEGIN lazily (deferred) on the first write; we BEGIN ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        # IMMEDIATE takes the write lock at BEGIN, waiting up to busy_timeout. A deferred
        # transaction that reads and then writes fails at once (SQLITE_BUSY, no waiting) when
        # another writer committed in between: two submits numbering their jobs would race.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def serialize(connection: Connection) -> None:
    """Hold the database's one writer lock until this transaction ends (PostgreSQL: an advisory
    lock; SQLite already holds it from BEGIN IMMEDIATE)."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})


def sessions(engine: Engine) -> sessionmaker:
    """The session factory; objects stay readable after commit (routes return them)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def _reachable(engine: Engine) -> Iterator[None]:
    """Connection failures as one line naming the database (never its password)."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError) as error:
        reason = one_line(str(error.orig) if error.orig is not None else str(error))
        password = engine.url.password
        if password:
            reason = reason.replace(str(password), "***")
        where = engine.url.render_as_string(hide_password=True)
        raise UserError(f"database {where}: {reason}") from None


def _alembic(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema up to `revision`, in one transaction (both databases have transactional
    DDL); concurrent starts (a server and an admin command) take turns."""
    with _reachable(engine), engine.begin() as connection:
        serialize(connection)
        command.upgrade(_alembic(connection), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    with _reachable(engine), engine.begin() as connection:
        serialize(connection)
        command.downgrade(_alembic(connection), revision)
