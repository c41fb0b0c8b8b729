"""The service's database, on SQLite and PostgreSQL: migrations both ways, identities and their
credentials (stored only as digests), job states and their events, tenant isolation, the queue's
order, cancellation, artifacts, and the admin verbs on a data dir."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from dataclasses import dataclass

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, select, text

from dlscale.errors import UserError
from dlscale.service import admin, auth, jobstore, store
from dlscale.service.db import default_url, downgrade, make_engine, migrate, sessions
from dlscale.service.db.models import Base, Job, Token, WebSession
from tests.conftest import interrupt_next_create

TABLES = {
    "users",
    "tenants",
    "memberships",
    "tokens",
    "web_sessions",
    "jobs",
    "job_events",
    "artifacts",
    "audit",
}


@dataclass
class Db:
    engine: Engine
    maker: object
    key: bytes
    url: str


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path):
    url = default_url(tmp_path) if request.param == "sqlite" else request.getfixturevalue("pg_url")
    engine = make_engine(url)
    migrate(engine)
    yield Db(engine, sessions(engine), auth.load_secret(tmp_path), url)
    engine.dispose()


def people(db: Db, *names: str, tenant: str = "lab", role: str = "editor"):
    """Users (made if new) who are members of `tenant` (made if new)."""
    made = []
    with db.maker.begin() as s:
        if store.tenant_named(s, tenant) is None:
            store.create_tenant(s, tenant)
        for name in names:
            user, _ = store.create_user(s, name)
            store.add_member(s, tenant, user, role)
            made.append(user)
    return made


def submit(db: Db, user, tenant: str = "lab", spec: str = "epochs: 1\n") -> Job:
    with db.maker.begin() as s:
        owner = store.tenant_named(s, tenant)
        fields = {"kind": "train", "spec_text": spec, "seed": 7, "cpu_slots": 1, "gpu_slots": 0}
        return jobstore.new_job(s, tenant=owner, user=user, **fields)


def test_migrations_go_up_down_and_up_again_and_match_the_models(db):
    assert set(inspect(db.engine).get_table_names()) >= TABLES
    with db.engine.connect() as connection:  # the migration creates what the models declare
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    downgrade(db.engine)
    assert not TABLES & set(inspect(db.engine).get_table_names())
    migrate(db.engine)
    assert set(inspect(db.engine).get_table_names()) >= TABLES


def test_users_tenants_and_members(db):
    alice, bob = people(db, "alice", "bob")
    with db.maker.begin() as s:
        store.add_member(s, "lab", "bob", "owner")  # a second add changes the role
        store.create_tenant(s, "other", weight=2.5, cpu_slots=2, storage_bytes=10**12)
        store.add_member(s, "other", "alice", "viewer")
        assert store.roles(s, alice) == {"lab": "editor", "other": "viewer"}
        assert store.roles(s, bob) == {"lab": "owner"}
        assert [u.name for u in store.users(s)] == ["alice", "bob"]
        assert store.tenants(s)[1].storage_bytes == 10**12
        assert store.tenant_named(s, "other").weight == 2.5 and store.tenant_named(s, "x") is None
    bad = [
        (lambda s: store.create_user(s, "alice"), "already exists"),
        (lambda s: store.create_user(s, "../x"), "user name"),
        (lambda s: store.create_tenant(s, "lab"), "already exists"),
        (lambda s: store.create_tenant(s, "t2", weight=0), "weight"),
        (lambda s: store.create_tenant(s, "t3", storage_bytes=-1), "storage_bytes"),
        (lambda s: store.add_member(s, "nope", "alice", "editor"), "no tenant named 'nope'"),
        (lambda s: store.add_member(s, "lab", "nobody", "editor"), "no user named 'nobody'"),
        (lambda s: store.add_member(s, "lab", "alice", "boss"), "role 'boss'"),
    ]
    for call, words in bad:
        with pytest.raises(UserError, match=words), db.maker.begin() as s:
            call(s)
    with db.maker.begin() as s:
        assert [t.name for t in store.tenants(s)] == ["lab", "other"]


def wait_until_blocked(engine, thread: threading.Thread) -> None:
    """Start `thread` and return once a session waits on a lock (its insert, on the first's
    unique index). pg_stat_activity is read once per transaction: a watcher that stayed in its
    first one saw that moment for ever, and the suite hung here whenever its first look came
    before the block. So the first look is taken before the thread starts, as the worst case."""
    waiting = text("select count(*) from pg_stat_activity where wait_event_type = 'Lock'")
    with engine.connect() as watcher:
        watcher.execute(waiting)
        thread.start()
        deadline = time.monotonic() + 60
        while thread.is_alive():
            watcher.rollback()  # a fresh look each time
            if watcher.execute(waiting).scalar():
                return
            assert time.monotonic() < deadline, "the second insert never waited on the first"
            time.sleep(0.01)


def test_a_name_taken_by_a_concurrent_transaction_is_a_user_error(db):
    """The second insert waits on the first's unique index (PostgreSQL) or write lock (SQLite)
    and must end as "already exists", not as a database error."""
    first = db.maker()
    first.begin()
    store.create_user(first, "twin")  # flushed, not committed
    outcome = []

    def second():
        try:
            with db.maker.begin() as s:
                store.create_user(s, "twin")
            outcome.append("created")
        except Exception as exc:  # recorded: the assertion below names what it was
            outcome.append(exc)

    thread = threading.Thread(target=second)
    try:
        if db.engine.dialect.name != "postgresql":
            thread.start()
        else:  # let it pass the name check and block on insert
            wait_until_blocked(db.engine, thread)
    finally:  # the second ends once the first does, whatever happened above
        first.commit()
        first.close()
        thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], UserError), outcome
    assert str(outcome[0]) == "user 'twin' already exists"


def test_tokens_authenticate_only_while_valid(db):
    (alice,) = people(db, "alice")
    with db.maker.begin() as s:
        good = store.issue_token(s, db.key, alice, "read")
        expiring = store.issue_token(s, db.key, alice, "write", expires_s=3600)
        revoked = store.issue_token(s, db.key, alice)
        expired = store.issue_token(s, db.key, alice)
        stale = s.scalar(select(Token).where(Token.prefix == auth.parse_token(expired)))
        stale.expires_at = time.time() - 1
        assert store.revoke_token(s, auth.parse_token(revoked))
    prefix, secret = good.split("_")[1:]
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    with db.maker.begin() as s:
        user, token = store.authenticate_token(s, db.key, good)
        assert (user.name, token.scope, token.last_used_at is not None) == ("alice", "read", True)
        assert store.authenticate_token(s, db.key, expiring)[1].scope == "write"
        for wrong in (
            f"dls_{prefix}_{flipped}",  # right prefix, wrong secret
            f"dls_00000000_{secret}",  # unknown prefix
            good[:-1],  # malformed
            good + "x",
            "",
            "Bearer " + good,
            revoked,
            expired,
        ):
            assert store.authenticate_token(s, db.key, wrong) is None, wrong
        assert store.authenticate_token(s, b"another server's key".ljust(32), good) is None
        listed = store.tokens(s)
    assert [t["revoked"] for t in listed] == [False, False, True, False]
    assert all("digest" not in t for t in listed)
    with pytest.raises(UserError, match="scope"), db.maker.begin() as s:
        store.issue_token(s, db.key, alice, "admin")


def test_the_database_holds_no_credential_in_clear(db):
    people(db, "alice")
    with db.maker.begin() as s:
        user, password = store.create_user(s, "carol", admin=True)
        token = store.issue_token(s, db.key, user)
        session_id, csrf = store.open_session(s, db.key, user)
        assert store.check_login(s, "carol", password).name == "carol"
    secrets_ = [token, token.split("_")[-1], password, session_id, csrf]
    with db.engine.connect() as connection:
        for table in inspect(connection).get_table_names():
            for row in connection.execute(text(f"select * from {table}")):
                for value in row:
                    for secret in secrets_:
                        assert secret not in str(value), f"{table} holds a secret in clear"


def test_sessions_csrf_and_login(db):
    (alice,) = people(db, "alice")
    with db.maker.begin() as s:
        _, password = store.create_user(s, "dan")
        assert store.check_login(s, "dan", password).name == "dan"
        assert store.check_login(s, "dan", password + "x") is None
        assert store.check_login(s, "nobody", password) is None
        session_id, csrf = store.open_session(s, db.key, alice)
        stale_id, _ = store.open_session(s, db.key, alice, ttl_s=3600)
        stale = s.scalar(select(WebSession).order_by(WebSession.id.desc()).limit(1))
        stale.expires_at = time.time() - 1
    with db.maker.begin() as s:
        user, web_session = store.session_of(s, db.key, session_id)
        assert user.name == "alice"
        assert store.check_csrf(db.key, web_session, csrf)
        for wrong in ("", None, csrf[:-1], session_id):
            assert not store.check_csrf(db.key, web_session, wrong)
        assert store.session_of(s, db.key, stale_id) is None
        assert store.session_of(s, db.key, session_id[:-1]) is None
        store.close_session(s, db.key, session_id)
    with db.maker.begin() as s:
        assert store.session_of(s, db.key, session_id) is None
        store.open_session(s, db.key, alice)  # sweeps the expired one out
        assert len(s.scalars(select(WebSession)).all()) == 1


def test_job_states_move_only_as_the_contract_allows_with_one_event_each(db):
    (alice,) = people(db, "alice")
    job = submit(db, alice, spec="name: x\n")
    assert (job.state, job.started_at) == ("queued", None)
    assert job.spec_sha256 == hashlib.sha256(b"name: x\n").hexdigest()
    with db.maker.begin() as s:
        row = s.get(Job, job.id)
        for state in ("starting", "running", "succeeded"):
            jobstore.transition(s, row, state, f"now {state}")
        assert row.started_at is not None and row.ended_at >= row.started_at
        assert row.message == "now succeeded"
    for state, illegal in [("queued", "running"), ("queued", "succeeded"), ("running", "queued")]:
        other = submit(db, alice)
        with db.maker.begin() as s:
            row = s.get(Job, other.id)
            if state == "running":
                jobstore.transition(s, row, "starting")
                jobstore.transition(s, row, "running")
            with pytest.raises(ValueError, match=f"{state} -> {illegal}"):
                jobstore.transition(s, row, illegal)
    with db.maker.begin() as s:
        row = s.get(Job, job.id)
        for after in ("running", "failed", "cancelled", "queued"):  # an ended job stays ended
            with pytest.raises(ValueError):
                jobstore.transition(s, row, after)
        events = jobstore.job_events(s, job.id)
        assert [e.state for e in events] == ["queued", "starting", "running", "succeeded"]
        assert [e.state for e in jobstore.job_events(s, job.id, after_id=events[1].id)] == [
            "running",
            "succeeded",
        ]


def test_a_job_is_invisible_outside_its_tenants(db):
    alice, bob = people(db, "alice", "bob")
    (eve,) = people(db, "eve", tenant="rivals")
    ours, theirs = submit(db, alice), submit(db, eve, tenant="rivals")
    with db.maker.begin() as s:
        assert jobstore.visible_job(s, bob, ours.id)[1] == "editor"
        assert jobstore.visible_job(s, eve, ours.id) is None
        assert jobstore.visible_job(s, alice, theirs.id) is None
        assert jobstore.visible_job(s, alice, "no-such-job") is None
        assert [j.id for j in jobstore.jobs_of(s, alice)] == [ours.id]
        assert [j.id for j in jobstore.jobs_of(s, eve, "rivals")] == [theirs.id]
        assert jobstore.jobs_of(s, eve, "lab") == []


def test_the_queue_keeps_submit_order_even_under_concurrent_submits(db):
    alice, bob = people(db, "alice", "bob")
    first = [submit(db, alice), submit(db, bob), submit(db, alice)]
    with db.maker.begin() as s:
        jobstore.transition(s, s.get(Job, first[1].id), "starting")
        assert [j.id for j in jobstore.queued_jobs(s)] == [first[0].id, first[2].id]
        assert [j.id for j in jobstore.active_jobs(s)] == [first[1].id]
        assert [j.id for j in jobstore.jobs_of(s, alice)] == [j.id for j in reversed(first)]
    failures = []

    def submit_some():
        try:
            for _ in range(3):
                submit(db, alice)
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)

    threads = [threading.Thread(target=submit_some) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with db.maker.begin() as s:
        assert [j.seq for j in jobstore.queued_jobs(s)] == [1, 3, *range(4, 22)]


def test_cancel_stops_a_queued_job_and_asks_a_running_one(db):
    (alice,) = people(db, "alice")
    queued, running, done = submit(db, alice), submit(db, alice), submit(db, alice)
    with db.maker.begin() as s:
        for job, path in ((running, ("starting", "running")), (done, ("starting", "failed"))):
            for state in path:
                jobstore.transition(s, s.get(Job, job.id), state)
    with db.maker.begin() as s:
        rows = [s.get(Job, j.id) for j in (queued, running, done)]
        assert [jobstore.request_cancel(s, row) for row in rows] == [True, True, False]
        assert [jobstore.request_cancel(s, row) for row in rows] == [False, False, False]
        assert [(r.state, r.cancel_requested) for r in rows] == [
            ("cancelled", False),
            ("running", True),
            ("failed", False),
        ]
        assert rows[0].ended_at is not None
        events = [(e.state, e.message) for e in jobstore.job_events(s, running.id)]
        assert events[-1] == ("running", "cancel requested")
        assert len(jobstore.job_events(s, done.id)) == 3


def test_artifacts_are_reached_by_opaque_ids_of_their_own_job(db):
    (alice,) = people(db, "alice")
    job, other = submit(db, alice), submit(db, alice)
    with db.maker.begin() as s:
        old = jobstore.set_artifacts(s, job, [("run/model.pt", 10, "a" * 64)])
        listed = [("run/model.pt", 12, "b" * 64), ("log.txt", 3, "c" * 64)]
        rows = jobstore.set_artifacts(s, job, listed)
        s.get(Job, job.id).bytes, s.get(Job, other.id).bytes = 100, 23
    with db.maker.begin() as s:
        assert [(a.name, a.size) for a in jobstore.artifacts_of(s, job)] == [
            ("log.txt", 3),
            ("run/model.pt", 12),
        ]
        assert jobstore.artifact(s, job, old[0].id) is None  # replaced, not kept
        found = jobstore.artifact(s, job, rows[0].id)
        assert (found.name, found.sha256) == ("run/model.pt", "b" * 64)
        assert jobstore.artifact(s, other, rows[0].id) is None
        assert len({a.id for a in rows}) == 2 and all("model" not in a.id for a in rows)
        assert jobstore.storage_used(s, store.tenants(s)[0]) == 123


def test_admin_verbs_on_a_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    password = admin.create_user(None, None, "root", True)  # the default data dir
    data = tmp_path / "home" / "service"
    assert (data / "service.db").is_file()
    assert admin.create_tenant(data, None, "lab", max_concurrent_jobs=2) == (
        "tenant lab: weight 1, max concurrent jobs 2"
    )
    assert admin.add_member(data, None, "lab", "root", "owner") == "root is owner in tenant lab"
    token = admin.issue_token(data, None, "root", "read", "12h")
    assert stat.S_IMODE((data / "secret").stat().st_mode) == 0o600
    engine = make_engine(default_url(data))
    with sessions(engine).begin() as s:
        user, row = store.authenticate_token(s, auth.load_secret(data), token)
        assert (user.is_admin, row.scope) == (True, "read")
        assert row.expires_at - row.created_at == pytest.approx(12 * 3600)
        assert store.check_login(s, "root", password) is not None
        assert [e.action for e in store.audit_log(s)][:2] == ["issue token", "add member"]
    engine.dispose()
    for call, words in [
        (lambda: admin.create_user(data, None, "root"), "user 'root' already exists"),
        (lambda: admin.issue_token(data, None, "root", "write", "soon"), "duration 'soon'"),
        (lambda: admin.issue_token(data, None, "ghost", "write", None), "no user named 'ghost'"),
        (lambda: admin.revoke_token(data, None, "00000000"), "no token with prefix"),
    ]:
        with pytest.raises(UserError, match=words):
            call()
    assert admin.revoke_token(data, None, token.split("_")[1]).endswith("revoked")


def test_the_secret_is_private_and_stable(tmp_path):
    key = auth.load_secret(tmp_path / "data")
    path = tmp_path / "data" / "secret"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.load_secret(tmp_path / "data") == key
    assert list(path.parent.iterdir()) == [path]  # no staging file left behind
    os.chmod(path, 0o644)
    with pytest.raises(UserError, match="chmod 600"):
        auth.load_secret(tmp_path / "data")
    os.chmod(path, 0o600)
    path.write_bytes(b"short")
    with pytest.raises(UserError, match="holds 5 bytes"):
        auth.load_secret(tmp_path / "data")


def test_a_stop_as_the_secret_is_staged_leaves_no_staging_file(tmp_path, monkeypatch):
    """SIGTERM at a server's first start, landing as the staging file is created (raised as
    `open` returns): nothing half-made stays in the data folder, and the next start makes it."""
    (tmp_path / "data").mkdir()
    interrupt_next_create(monkeypatch, within=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        auth.load_secret(tmp_path / "data")
    assert list((tmp_path / "data").iterdir()) == []
    assert len(auth.load_secret(tmp_path / "data")) == 32


def test_bad_database_urls_are_one_line_errors_without_the_password(tmp_path):
    with pytest.raises(UserError, match="not a valid URL"):
        make_engine("not a url")
    with pytest.raises(UserError, match="nosuchdb"):
        make_engine("nosuchdb://x")
    missing = tmp_path / "no-socket-here"
    url = f"postgresql+psycopg://bob:hunter2@/db?host={missing}&port=1"
    with pytest.raises(UserError) as caught:
        migrate(make_engine(url))
    message = str(caught.value)
    assert "hunter2" not in message and "bob:***@" in message and "\n" not in message


def test_tokens_passwords_and_durations_are_well_formed():
    text_, prefix = auth.new_token()
    assert auth.parse_token(text_) == prefix and text_.count("_") == 2 and len(text_) == 56
    for bad in ("dls_ABCDEF12_" + "a" * 43, "dls_abcdef12_" + "a" * 42, "xyz", None):
        assert auth.parse_token(bad) is None
    hashed = auth.hash_password("correct horse")
    assert auth.verify_password(hashed, "correct horse")
    assert not auth.verify_password(hashed, "wrong horse")
    assert not auth.verify_password("not a hash", "correct horse")
    assert len(auth.new_password()) == 20 and auth.new_password() != auth.new_password()
    assert [auth.parse_duration(d) for d in ("30d", "12h", "90m", "3600s", "1.5h")] == [
        2592000,
        43200,
        5400,
        3600,
        5400,
    ]
    for bad in ("", "0d", "-1h", "12", "1w", "h"):
        with pytest.raises(UserError, match="duration"):
            auth.parse_duration(bad)
    assert auth.role_at_least("owner", "editor") and not auth.role_at_least("viewer", "editor")
    assert not auth.role_at_least(None, "viewer")
