"""The service over HTTP, in process, on SQLite and on PostgreSQL: every route authenticated,
tenants isolated (404), files served by id only, hostile input refused with a 4xx, and the
server healthy afterwards. Jobs move through a fake executor (no training here; the real job
processes are tested in test_lifecycle.py)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from dlscale import api
from dlscale.errors import UserError
from dlscale.service import admin
from dlscale.service.app import create_app
from dlscale.service.config import ServiceConfig
from tests.service.fakes import FakeExecutor
from tests.service.specs import TINY

JOB_ID = "0123456789abcdef"
PUBLIC = {("/api/health", "get"), ("/api/login", "post"), ("/login", "get")}


@dataclass
class Harness:
    client: TestClient
    state: object
    fake: FakeExecutor
    data_dir: Path
    db_url: str | None

    def user(self, name, tenant, role="editor", scope="write", **quota):
        admin.create_user(self.data_dir, self.db_url, name, False)
        with contextlib.suppress(UserError):  # made by an earlier user of the same tenant
            admin.create_tenant(self.data_dir, self.db_url, tenant, **quota)
        admin.add_member(self.data_dir, self.db_url, tenant, name, role)
        token = admin.issue_token(self.data_dir, self.db_url, name, scope, None)
        return {"Authorization": f"Bearer {token}"}

    def submit(self, headers, spec=TINY, files=(), **fields):
        parts = [("spec", ("spec.yaml", spec.encode() if isinstance(spec, str) else spec))]
        parts += [("files", (name, data)) for name, data in files]
        return self.client.post("/api/jobs", headers=headers, files=parts, data=fields)


@pytest.fixture(params=["sqlite", "postgresql"])
def web(request, tmp_path):
    url = None if request.param == "sqlite" else request.getfixturevalue("pg_url")
    config = ServiceConfig(
        data_dir=tmp_path / "data",
        db_url=url,
        cpu_slots=2,
        max_body_bytes=1 << 20,
        failed_auth_limit=5,
    )
    fake = FakeExecutor()
    app = create_app(config, run_scheduler=False, executor=fake)
    state = app.state.service
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield Harness(client, state, fake, config.data_dir, url)


def _routes(app) -> list[tuple[str, str]]:
    paths = app.openapi()["paths"]
    return [(path, method) for path, ops in paths.items() for method in ops]


def _fill(path: str, **values) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), JOB_ID), path)


def test_every_route_but_health_and_login_answers_401_without_credentials(web):
    routes = _routes(web.client.app)
    assert set(routes) >= PUBLIC, "the open routes exist"
    assert len(routes) >= 20  # the API and the pages, read from the app's own schema
    for path, method in routes:
        if (path, method) in PUBLIC:
            continue
        answer = web.client.request(method.upper(), _fill(path))
        assert answer.status_code == 401, (method, path, answer.status_code)
    assert web.client.get("/api/health").json() == {"status": "ok"}
    assert web.client.post("/api/login", json={"name": "x", "password": "y"}).status_code == 401
    nul = web.client.post("/api/login", json={"name": "x\u0000", "password": "y\u0000"})
    assert nul.status_code == 401  # PostgreSQL refuses NUL in text: never a 500


def test_bad_tokens_and_logins_are_limited_and_audited(web):
    alice = web.user("alice", "lab")
    for _ in range(5):
        assert (
            web.client.get("/api/me", headers={"Authorization": "Bearer dls_nope"}).status_code
            == 401
        )
    limited = web.client.get("/api/me", headers={"Authorization": "Bearer dls_nope"})
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    # A valid token from the same address still passes: one user's bad tokens lock no one out.
    assert web.client.get("/api/me", headers=alice).status_code == 200
    for _ in range(5):
        assert web.client.post("/api/login", json={"name": "a", "password": "b"}).status_code == 401
    assert web.client.post("/api/login", json={"name": "a", "password": "b"}).status_code == 429
    assert web.client.post("/api/login", json={"name": "x", "password": "b"}).status_code == 401
    with web.state.maker.begin() as db:
        denied = db.execute(text("select count(*) from audit where outcome = 'denied'")).scalar()
    assert denied == 11  # the refused (429) attempts are not audited again


def test_the_database_holds_no_token_password_or_session_in_clear(web):
    headers = web.user("alice", "lab")
    token = headers["Authorization"].split()[1]
    password = admin.create_user(web.data_dir, web.db_url, "carol", False)
    login = web.client.post("/api/login", json={"name": "carol", "password": password})
    assert login.status_code == 200
    session = login.cookies.get("dlscale_session")
    assert "httponly" in login.headers["set-cookie"].lower()
    assert "samesite=strict" in login.headers["set-cookie"].lower()
    assert web.client.get("/api/me", headers=headers).json()["user"] == "alice"
    secrets_ = [token, token.split("_")[-1], password, session]
    with web.state.engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(text(f"select * from {table}")):
                for value in row:
                    for secret in secrets_:
                        assert secret not in str(value), f"{table} holds a secret in clear"


def test_a_session_needs_the_csrf_header_to_change_anything(web):
    web.user("alice", "lab")
    password = admin.create_user(web.data_dir, web.db_url, "dan", False)
    admin.add_member(web.data_dir, web.db_url, "lab", "dan", "editor")
    login = web.client.post("/api/login", json={"name": "dan", "password": password})
    csrf = login.json()["csrf"]
    files = [("spec", ("spec.yaml", TINY.encode()))]
    refused = web.client.post("/api/jobs", files=files)
    assert refused.status_code == 403 and "x-csrf-token" in refused.json()["detail"]
    wrong = web.client.post("/api/jobs", files=files, headers={"X-CSRF-Token": "x" + csrf})
    assert wrong.status_code == 403
    assert (
        web.client.post("/api/jobs", files=files, headers={"X-CSRF-Token": csrf}).status_code == 201
    )


def test_another_tenants_job_is_not_found_on_every_route_and_stays_untouched(web):
    alice, bob = web.user("alice", "lab-a"), web.user("bob", "lab-b", role="owner")
    job_id = web.submit(alice).json()["id"]
    web.state.loop.tick()  # starts it (the fake job ends at once)
    web.state.loop.tick()  # sees it ended
    before = web.client.get(f"/api/jobs/{job_id}", headers=alice).json()
    assert before["state"] == "succeeded"
    artifact = web.client.get(f"/api/jobs/{job_id}/artifacts", headers=alice).json()[0]["id"]
    job_routes = [
        (p, m) for p, m in _routes(web.client.app) if "{job_id}" in p and p.startswith("/api")
    ]
    assert len(job_routes) >= 8
    for path, method in job_routes:
        theirs = web.client.request(
            method.upper(), _fill(path, job_id=job_id, artifact_id=artifact), headers=bob
        )
        nobody = web.client.request(
            method.upper(), _fill(path, job_id="f" * 16, artifact_id=artifact), headers=bob
        )
        assert theirs.status_code == nobody.status_code == 404, (method, path)
        assert theirs.json() == nobody.json()
    after = web.client.get(f"/api/jobs/{job_id}", headers=alice).json()
    assert after == before
    assert [j["id"] for j in web.client.get("/api/jobs", headers=bob).json()] == []


def test_artifacts_are_served_by_id_never_by_path(web):
    alice = web.user("alice", "lab")
    job_id = web.submit(alice).json()["id"]
    web.state.loop.tick()  # starts it (the fake job ends at once)
    web.state.loop.tick()  # sees it ended
    listing = web.client.get(f"/api/jobs/{job_id}/artifacts", headers=alice).json()
    names = {a["name"] for a in listing}
    assert {"run/run.json", "result.json"} <= names or {"run.json", "result.json"} <= names
    one = next(a for a in listing if a["name"].endswith("run.json"))
    got = web.client.get(f"/api/jobs/{job_id}/artifacts/{one['id']}", headers=alice)
    assert (
        got.status_code == 200
        and got.content == json.dumps({"final": {"val_accuracy": 0.5}}).encode()
    )
    hostile = [
        "../../etc/passwd",
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "run.json%00",
        "run%2Frun.json",
        "....//....//etc/passwd",
        "%252e%252e%252fetc%252fpasswd",
        one["name"],
    ]
    for name in hostile:
        answer = web.client.get(f"/api/jobs/{job_id}/artifacts/{name}", headers=alice)
        assert answer.status_code == 404, name
        assert b"root:" not in answer.content
    # A symlink planted where a listed artifact was is not followed.
    planted = web.data_dir / "jobs" / job_id / one["name"]
    planted.unlink()
    planted.symlink_to("/etc/passwd")
    answer = web.client.get(f"/api/jobs/{job_id}/artifacts/{one['id']}", headers=alice)
    assert answer.status_code == 404 and b"root:" not in answer.content


# Nine levels of nine aliases each: 9**9 (387 million) nodes once expanded.
BOMB = "l0: &l0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 9)
)


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (BOMB, "YAML nodes"),
        (
            "a:\n" + "".join("  " * i + f"  k{i}:\n" for i in range(60)) + "  " * 61 + "v: 1\n",
            "deeper",
        ),
        (b"name: t\nmodel: {name: mlp}\xff\xfe\n", "not UTF-8"),
        (TINY.replace("{name: digits}", "{name: npz, path: /etc/passwd}"), "not a path inside"),
        (TINY.replace("{name: digits}", "{name: npz, path: ../../x.npz}"), "leaves the job"),
        (TINY.replace("name: mlp,", "name: 'subprocess:getoutput',"), "names code outside"),
        # The attack that once ran `os.system` in the server: bytes become no model name.
        (TINY.replace("name: mlp,", "name: !!binary b3M6c3lzdGVt,"), "tag !!binary is not"),
        (TINY + "note: !!timestamp 2001-12-14\n", "tag !!timestamp is not"),
        (TINY + "note: !!set {a, b}\n", "tag !!set is not"),
        (TINY + "note: !!python/object/apply:os.system [id]\n", "tag !!python/object"),
        ("a: " + "[" * 1000 + "]" * 1000 + "\n", "deeper"),  # a RecursionError (500) once
        (TINY + "note: 1" + "0" * 5000 + "\n", "a number of 5001 characters"),
        ("- just\n- a list\n", "expected a YAML mapping"),
        ("name: [unclosed\n", "spec:"),
        (TINY.replace("seed: 3", "seed: abc"), "seed: expected a whole number"),
        (TINY.replace("seed: 3", "seed: [1]"), "seed: expected a whole number"),
    ],
)
def test_hostile_specs_are_refused_with_one_line_and_the_server_stays_healthy(web, spec, expected):
    alice = web.user("alice", "lab")
    answer = web.submit(alice, spec)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert expected in detail and "\n" not in detail
    assert list((web.data_dir / "jobs").iterdir()) == []  # nothing left behind
    assert web.client.get("/api/health").status_code == 200


def test_uploads_over_the_limit_and_hostile_archives_are_refused(web):
    alice = web.user("alice", "lab")
    big = web.submit(alice, files=[("big.npz", b"0" * (2 << 20))])
    assert big.status_code == 413
    for member in ("../evil.txt", "/abs.txt", "a/../../evil.txt"):
        archive = _zip({member: b"x"})
        answer = web.client.post(
            "/api/jobs",
            headers=alice,
            files=[("spec", ("spec.yaml", TINY.encode())), ("archive", ("data.zip", archive))],
        )
        assert answer.status_code == 422, member
    assert not (web.data_dir.parent / "evil.txt").exists()
    assert list((web.data_dir / "jobs").iterdir()) == []
    for name in ("../x.npz", ".hidden"):
        assert web.submit(alice, files=[(name, b"x")]).status_code == 422
    assert web.client.get("/api/health").status_code == 200


def test_an_invalid_spec_answers_the_clis_one_line_message(web, tmp_path):
    alice = web.user("alice", "lab")
    bad = TINY.replace("name: mlp,", "name: no_such_model,")
    local = tmp_path / "bad.yaml"
    local.write_text(bad)
    with pytest.raises(UserError) as cli:
        api.validate(local)
    answer = web.submit(alice, bad)
    assert answer.status_code == 422
    assert answer.json()["detail"] == str(cli.value).replace(f"{local}: ", "spec.yaml: ")


def test_a_job_that_can_never_run_is_refused_at_submit_with_the_reason(web):
    alice = web.user("alice", "lab", cpu_slots=1)
    four = TINY.replace("device: cpu", "device: cpu\nstrategy: {name: ddp, workers: 4}")
    answer = web.submit(alice, four)
    assert answer.status_code == 422 and "can never run" in answer.json()["detail"]
    assert "machine has 2" in answer.json()["detail"] or "quota is 1" in answer.json()["detail"]
    cuda = TINY.replace("device: cpu", "device: cuda")
    answer = web.submit(alice, cuda)
    assert answer.status_code == 422 and "no GPUs" in answer.json()["detail"]


def test_roles_and_scopes(web):
    web.user("alice", "lab")
    viewer = web.user("vera", "lab", role="viewer")
    reader = web.user("rob", "lab", scope="read")
    assert web.submit(viewer).status_code == 403
    assert web.submit(reader).status_code == 403
    assert web.client.get("/api/jobs", headers=reader).status_code == 200


def test_queued_jobs_say_why_they_wait_and_quotas_hold_at_every_poll(web):
    web.fake.finish = False
    alice = web.user("alice", "lab-a", max_concurrent_jobs=1)
    bob = web.user("bob", "lab-b")
    a1, a2 = (web.submit(alice).json()["id"] for _ in range(2))
    b1, b2 = (web.submit(bob).json()["id"] for _ in range(2))
    web.state.loop.tick()
    states = {
        j: web.client.get(f"/api/jobs/{j}", headers=h).json()
        for j, h in [(a1, alice), (a2, alice), (b1, bob), (b2, bob)]
    }
    assert [states[j]["state"] for j in (a1, a2, b1, b2)] == [
        "starting",
        "queued",
        "starting",
        "queued",
    ]
    assert states[a2]["reason"] == "tenant at max_concurrent_jobs 1/1"
    assert "free cpu slots" in states[b2]["reason"] or "behind" in states[b2]["reason"]
    queue = web.client.get("/api/queue", headers=alice).json()
    assert [t["name"] for t in queue["tenants"]] == ["lab-a"]  # only the caller's tenants
    assert queue["tenants"][0]["waiting"][0]["id"] == a2
    for _ in range(6):  # jobs end one by one; never more than the quota and the machine allow
        running = [j for j in (a1, a2, b1, b2) if web.fake.probe(web.data_dir / "jobs" / j).alive]
        assert len(running) <= 2 and sum(j in running for j in (a1, a2)) <= 1
        if running:
            web.fake.end(web.data_dir / "jobs" / running[0], "succeeded")
        web.state.loop.tick()
    assert web.fake.started == [a1, b1, a2, b2] or web.fake.started == [a1, b1, b2, a2]


def test_cancel_of_a_queued_job_is_immediate_and_a_running_one_is_signalled(web):
    web.fake.finish = False
    alice = web.user("alice", "lab", max_concurrent_jobs=1)
    running, queued = (web.submit(alice).json()["id"] for _ in range(2))
    web.state.loop.tick()
    answer = web.client.post(f"/api/jobs/{queued}/cancel", headers=alice).json()
    assert answer["state"] == "cancelled"
    answer = web.client.post(f"/api/jobs/{running}/cancel", headers=alice).json()
    assert answer["cancel_requested"] and running in web.fake.cancelled
    web.state.loop.tick()
    job = web.client.get(f"/api/jobs/{running}", headers=alice).json()
    assert job["state"] == "cancelled"
    assert [e["state"] for e in job["events"]][-1] == "cancelled"
    assert queued not in web.fake.started


def test_a_job_whose_process_never_claims_it_is_tried_three_times_then_failed(web):
    alice = web.user("alice", "lab")
    tries = []
    web.fake.start = lambda folder, limits: tries.append(Path(folder).name) or 1  # no claim
    web.state.config.start_grace_s = 0.0
    job_id = web.submit(alice).json()["id"]
    for _ in range(6):
        web.state.loop.tick()
    job = web.client.get(f"/api/jobs/{job_id}", headers=alice).json()
    assert job["state"] == "failed" and "never started" in job["message"]
    assert tries == [job_id] * 3


def test_a_seed_of_null_is_drawn_and_odd_archives_and_offsets_are_4xx_not_500(web):
    alice = web.user("alice", "lab")
    drawn = web.submit(alice, TINY.replace("seed: 3", "seed: null"))
    assert drawn.status_code == 201 and isinstance(drawn.json()["seed"], int)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("data.npz", bytes(range(256)) * 64)
    damaged = bytearray(buffer.getvalue())
    damaged[40:60] = b"\xff" * 20  # inside the deflated data: it no longer inflates
    answer = web.client.post(
        "/api/jobs",
        headers=alice,
        files=[
            ("spec", ("spec.yaml", TINY.encode())),
            ("archive", ("data.zip", bytes(damaged))),
        ],
    )
    assert answer.status_code == 422 and "archive" in answer.json()["detail"]
    job_id = drawn.json()["id"]
    web.state.loop.tick()
    web.state.loop.tick()
    for after in ("99999999999999999999999", str(2**63 - 1), "-5", "x"):
        stream = web.client.get(
            f"/api/jobs/{job_id}/logs",
            headers=alice,
            params={"follow": "false", "after": after} if after != "x" else {"follow": "false"},
        )
        assert stream.status_code == 200 and "event: end" in stream.text, after
    huge = web.client.get(
        f"/api/jobs/{job_id}/logs",
        params={"follow": "false"},
        headers={**alice, "Last-Event-ID": "9" * 30},
    )
    assert huge.status_code == 200 and "event: end" in huge.text


def test_a_job_cancelled_before_its_process_claims_it_can_never_run(web):
    alice = web.user("alice", "lab")
    web.fake.start = lambda folder, limits: 1  # a process still starting: nothing claimed yet
    job_id = web.submit(alice).json()["id"]
    web.state.loop.tick()
    assert web.client.post(f"/api/jobs/{job_id}/cancel", headers=alice).json()["cancel_requested"]
    web.state.loop.tick()
    assert web.client.get(f"/api/jobs/{job_id}", headers=alice).json()["state"] == "cancelled"
    # The server took the job's claim: a process arriving late finds it taken and exits.
    assert (web.data_dir / "jobs" / job_id / "claimed").exists()


def test_jobs_that_can_never_run_are_refused_at_submit_as_dlscale_train_refuses_them(web):
    """Once, 1,000 loader workers and a model needing 149 GiB were queued and failed later."""
    alice = web.user("alice", "lab")
    workers = web.submit(alice, TINY.replace("device: cpu", "device: cpu\nloader: {workers: 1000}"))
    assert workers.status_code == 422, workers.text
    assert "would start 1001 processes here" in workers.json()["detail"]
    huge = TINY.replace("hidden: [16]", "hidden: [100000, 100000, 100000]")
    answer = web.submit(alice, huge)
    assert answer.status_code == 422, answer.text
    assert "can never run in the slots it asks for" in answer.json()["detail"]
    assert list((web.data_dir / "jobs").iterdir()) == []


def test_a_tenants_waiting_jobs_are_limited(web):
    alice = web.user("alice", "lab", max_queued_jobs=2)
    for _ in range(2):
        assert web.submit(alice).status_code == 201  # no tick: they wait
    third = web.submit(alice)
    assert third.status_code == 429 and "2 jobs waiting" in third.json()["detail"]
    assert "retry-after" in third.headers
    web.state.loop.tick()  # both start: the queue is free again
    assert web.submit(alice).status_code == 201


def test_one_address_trying_a_password_on_many_names_is_limited(web):
    """Once one address tried one password on 40 names and got 40 × 401."""
    answers = [
        web.client.post("/api/login", json={"name": f"user{i}", "password": "guess"}).status_code
        for i in range(40)
    ]
    limit = web.state.config.address_limit
    assert answers[:limit] == [401] * limit
    assert set(answers[limit:]) == {429}


def test_a_cancelled_job_keeps_no_waiting_reason(web):
    web.fake.finish = False
    alice = web.user("alice", "lab", max_concurrent_jobs=1)
    web.submit(alice)
    waiting = web.submit(alice).json()["id"]
    web.state.loop.tick()
    assert web.client.get(f"/api/jobs/{waiting}", headers=alice).json()["reason"]
    web.client.post(f"/api/jobs/{waiting}/cancel", headers=alice)
    job = web.client.get(f"/api/jobs/{waiting}", headers=alice).json()
    assert job["state"] == "cancelled" and job["reason"] == ""
    listed = web.client.get("/api/jobs", headers=alice).json()
    assert next(j for j in listed if j["id"] == waiting)["reason"] == ""


def test_the_job_list_comes_a_page_at_a_time(web):
    alice = web.user("alice", "lab")
    made = [web.submit(alice).json()["id"] for _ in range(5)]
    seen, before = [], None
    while True:
        params = {"limit": 2, **({"before": before} if before else {})}
        page = web.client.get("/api/jobs", headers=alice, params=params)
        assert page.status_code == 200 and len(page.json()) <= 2
        seen += [job["id"] for job in page.json()]
        before = page.headers.get("x-next-before")
        if before is None:
            break
        assert 'rel="next"' in page.headers["link"]
    assert seen == made[::-1]  # newest first, each once
    for bad in ({"limit": 0}, {"limit": 5000}, {"before": "f" * 16}, {"before": "../x"}):
        assert web.client.get("/api/jobs", headers=alice, params=bad).status_code == 422


def test_deleting_a_job_frees_it_at_once_or_after_it_stops(web):
    web.fake.finish = False
    alice = web.user("alice", "lab", storage_bytes=1 << 30)
    viewer = web.user("vera", "lab", role="viewer")
    bob = web.user("bob", "other")
    running, queued = (web.submit(alice).json()["id"] for _ in range(2))
    web.state.config.cpu_slots = 1
    web.state.loop.machine = type(web.state.loop.machine)(1)
    web.state.loop.tick()
    assert web.client.delete(f"/api/jobs/{running}", headers=viewer).status_code == 403
    assert web.client.delete(f"/api/jobs/{running}", headers=bob).status_code == 404
    gone = web.client.delete(f"/api/jobs/{queued}", headers=alice)
    assert gone.status_code == 200 and gone.json()["deleted"]
    assert not (web.data_dir / "jobs" / queued).exists()
    assert web.client.get(f"/api/jobs/{queued}", headers=alice).status_code == 404
    later = web.client.delete(f"/api/jobs/{running}", headers=alice)
    assert later.status_code == 202 and later.json()["delete_requested"]
    assert running in web.fake.cancelled  # cancelled first...
    web.state.loop.tick()  # ...it ends, and is deleted
    web.state.loop.tick()
    assert web.client.get(f"/api/jobs/{running}", headers=alice).status_code == 404
    assert not (web.data_dir / "jobs" / running).exists()
    with web.state.maker.begin() as db:
        audited = db.execute(text("select action from audit where action = 'delete'")).all()
    assert len(audited) == 2


def test_a_disabled_user_is_shut_out_at_once_and_admins_change_tenants(web):
    admin_headers = web.user("root", "ops")
    admin.create_user(web.data_dir, web.db_url, "boss", True)
    token = admin.issue_token(web.data_dir, web.db_url, "boss", "write", None)
    boss = {"Authorization": f"Bearer {token}"}
    alice = web.user("alice", "lab")
    job_id = web.submit(alice).json()["id"]
    assert (
        web.client.post(
            "/api/admin/users/alice/disable", headers=admin_headers, json={"disabled": True}
        ).status_code
        == 403
    )
    off = web.client.post("/api/admin/users/alice/disable", headers=boss, json={"disabled": True})
    assert off.status_code == 200 and off.json()["disabled"]
    assert web.client.get("/api/me", headers=alice).status_code == 401
    assert (
        web.client.post(
            "/api/admin/users/boss/disable", headers=boss, json={"disabled": True}
        ).status_code
        == 422
    )
    web.client.post("/api/admin/users/alice/disable", headers=boss, json={"disabled": False})
    assert web.client.get(f"/api/jobs/{job_id}", headers=alice).status_code == 200
    changed = web.client.patch(
        "/api/admin/tenants/lab",
        headers=boss,
        json={"weight": 3, "storage_bytes": 1000, "cpu_slots": None},
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["weight"] == 3 and changed.json()["storage_bytes"] == 1000
    bad = web.client.patch("/api/admin/tenants/lab", headers=boss, json={"weight": -1})
    assert bad.status_code == 422
    assert (
        web.client.patch("/api/admin/tenants/nope", headers=boss, json={"weight": 2}).status_code
        == 404
    )
    password = web.client.post("/api/admin/users/alice/password", headers=boss).json()["password"]
    assert (
        web.client.post("/api/login", json={"name": "alice", "password": password}).status_code
        == 200
    )
    removed = web.client.delete("/api/admin/tenants/lab/members/alice", headers=boss)
    assert removed.status_code == 200
    assert web.client.get(f"/api/jobs/{job_id}", headers=alice).status_code == 404
    with web.state.maker.begin() as db:
        actions = [
            row[0]
            for row in db.execute(text("select action from audit where actor = 'boss' order by id"))
        ]
    assert actions == [
        "disable user",
        "enable user",
        "set tenant",
        "reset password",
        "remove member",
    ]


def test_a_full_disk_at_submit_is_the_servers_fault_not_the_clients(web, monkeypatch):
    """The server's own write failing (a full disk) is no 422 blaming the spec, and names no
    path of the server's; nothing of the job is left behind."""
    from dlscale.atomic import WriteFailed
    from dlscale.service import layout

    alice = web.user("alice", "lab")

    def full(path, record):
        raise WriteFailed(f"cannot write {path}: no space left on device")

    monkeypatch.setattr(layout, "write_json_atomic", full)
    answer = web.submit(alice)
    assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
    assert str(web.data_dir) not in answer.text and "could not store the job" in answer.text
    assert not list((web.data_dir / "jobs").glob("*"))
    assert web.client.get("/api/jobs", headers=alice).json() == []


def test_a_job_whose_state_cannot_be_written_fails_and_frees_its_slots(web):
    from dlscale.atomic import WriteFailed

    alice = web.user("alice", "lab")

    def full(folder, limits):
        raise WriteFailed(f"cannot write {folder}/state.json: no space left on device")

    web.fake.start = full
    job_id = web.submit(alice).json()["id"]
    web.state.loop.tick()
    job = web.client.get(f"/api/jobs/{job_id}", headers=alice).json()
    assert job["state"] == "failed" and "could not start its process" in job["message"]
    assert job_id in web.fake.released
