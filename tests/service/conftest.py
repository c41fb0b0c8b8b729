"""A throwaway PostgreSQL for the service's tests: one cluster per test session on a private
Unix socket (no TCP port), a fresh database per test as `pg_url`."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("DLSCALE_PG_BIN", "/usr/lib/postgresql/15/bin"))
# Only names the socket file (.s.PGSQL.5432) in our own folder: nothing listens on TCP.
PG_PORT = 5432


def _as_postgres(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user then."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _check_installed() -> None:
    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL binaries not found in {PG_BIN}: run `make system-deps`")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("no 'postgres' user to run PostgreSQL as root: run `make system-deps`")


@pytest.fixture(scope="session")
def pg_cluster():
    """(socket folder, port) of a running cluster, stopped and removed at the end."""
    _check_installed()
    base = Path(tempfile.mkdtemp(prefix="dlscale-pg-"))
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        for path in (base, sockets):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    run = {"check": True, "capture_output": True, "text": True}
    options = (
        f"-p {PG_PORT} -k {sockets} -c listen_addresses='' "
        # A test database need not survive a power cut: skip the disk flushes.
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    pg_ctl = _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data)])
    try:
        initdb = [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N"]
        subprocess.run(_as_postgres(initdb), **run)
        log = base / "server.log"
        subprocess.run([*pg_ctl, "-o", options, "-l", str(log), "-w", "start"], **run)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc.stderr or exc.stdout}")
    try:
        yield sockets, PG_PORT
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster, request):
    """A URL to an empty database of its own, dropped after the test."""
    import psycopg

    sockets, port = pg_cluster
    readable = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40]
    name = f"t_{readable}_{secrets.token_hex(4)}"  # PostgreSQL names: 63 bytes at most
    admin = {"host": str(sockets), "port": port, "user": "postgres", "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://postgres@/{name}?host={sockets}&port={port}"
    with psycopg.connect(**admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
