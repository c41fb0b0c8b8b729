"""A finished job's model deployed in the training service: served from its own sandbox on a
Unix socket, reached only with its tenant's tokens, its body passed unread, stopped by cancel.

One trained job and one deployment (on one server, under a data folder deep enough that the
socket's absolute path would not fit a socket address) are shared by the tests of this module;
they run in the order written, the cancel after the others but the storage quota's, which
needs the tenant to have no job running (and ends the deployment itself where the slow cancel
test was left out)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from starlette.requests import Request
from typer.testing import CliRunner

from dlscale.api.inference import load_predictor
from dlscale.cli.main import app
from dlscale.service import admin
from dlscale.service.deploy import refusal
from dlscale.service.layout import MODEL, SOCKET
from dlscale.service.model_proxy import MAX_BODY_BYTES, NotServed, open_socket, read_body
from dlscale.serving.inputs import MAX_BODY_BYTES as ENGINE_MAX_BODY_BYTES
from tests.service.live import LiveServer, wait_for_state
from tests.service.specs import TINY

ENDED = ("succeeded", "failed", "cancelled")
runner = CliRunner()


def cli(*args: str, token: str, live: LiveServer):
    return runner.invoke(app, list(args), env={"DLSCALE_TOKEN": token, "DLSCALE_SERVER": live.url})


def last_line(result) -> str:
    return result.stdout.strip().splitlines()[-1]


def submit(client, spec: str, **fields) -> str:
    answer = client.post("/api/jobs", files=[("spec", ("spec.yaml", spec.encode()))], data=fields)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def wait_until_serving(client, job_id: str, timeout_s: float = 180.0) -> dict:
    """The deployment's /health once its engine answers (503 while it loads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = client.get(f"/api/jobs/{job_id}/model/health")
        if answer.status_code == 200:
            return answer.json()
        assert answer.status_code == 503, answer.text
        assert client.get(f"/api/jobs/{job_id}").json()["state"] not in ENDED
        time.sleep(0.3)
    raise AssertionError(f"deployment {job_id} never answered")


def answers_are_predicts_and_only_the_tenants(deployed) -> None:
    """The tenant's answers are Predictor.predict's on the same inputs; another tenant gets the
    404 of a job that does not exist, a request without a token 401."""
    live, alice, bob = deployed["live"], deployed["alice"], deployed["bob"]
    served, trained, info = deployed["served"], deployed["trained"], deployed["info"]
    samples = np.random.default_rng(0).random((7, *info["input_shape"]), dtype=np.float32)
    answer = alice.post(f"/api/jobs/{served}/predict", json={"inputs": samples.tolist()})
    assert answer.status_code == 200, answer.text
    got = answer.json()["predictions"]
    run = live.data_dir / "jobs" / trained / "run"
    expected = load_predictor(run, device="cpu").predict(torch.from_numpy(samples))
    assert [p["class"] for p in got] == expected.classes
    assert [p["confidence"] for p in got] == pytest.approx(expected.confidence, rel=1e-5)
    for client, status in ((bob, 404), (live.client(None), 401)):
        assert client.post(f"/api/jobs/{served}/predict", json={"inputs": []}).status_code == status
        assert client.get(f"/api/jobs/{served}/model/health").status_code == status
        assert client.get(f"/api/jobs/{served}/model/metrics").status_code == status
        assert client.post(f"/api/jobs/{trained}/deploy").status_code == status


def cancel_and_see_the_engine_end(deployed) -> Path:
    """Cancel the deployment: it ends cancelled, its engine gone with its socket; its folder."""
    live, alice, served = deployed["live"], deployed["alice"], deployed["served"]
    folder = live.data_dir / "jobs" / served
    assert alice.post(f"/api/jobs/{served}/cancel").status_code == 200
    job = wait_for_state(alice, served, ENDED)
    assert job["state"] == "cancelled", job
    assert job["message"] == "cancelled: the model is no longer served"
    assert not os.path.lexists(folder / SOCKET)  # the engine removed it on its way out
    return folder


def route_says_the_model_is_no_longer_served(deployed) -> None:
    alice, served = deployed["alice"], deployed["served"]
    answer = alice.post(f"/api/jobs/{served}/predict", json={"inputs": [[0.0]]})
    assert answer.status_code == 409, answer.text
    assert answer.json()["detail"] == (
        f"job {served} has ended (cancelled): its model is no longer served"
    )


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    # jobs/<16 hex>/serve.sock under this is past the 107 bytes a socket address holds.
    deep = tmp_path_factory.mktemp("deploy") / ("d" * 80) / "data"
    assert len(str(deep / "jobs" / ("0" * 16) / SOCKET)) > 107
    live = LiveServer(deep, cpu_slots=2).start()
    try:
        _, alice_token = live.user("alice", "lab-a")
        _, bob_token = live.user("bob", "lab-b")
        alice = live.client(alice_token)
        trained = submit(alice, TINY)
        job = wait_for_state(alice, trained, ENDED)
        assert job["state"] == "succeeded", job
        deployed = cli(
            "remote", "deploy", trained, "--precision", "fp32", token=alice_token, live=live
        )
        assert deployed.exit_code == 0, deployed.output
        served = {"id": last_line(deployed)}
        job = alice.get(f"/api/jobs/{served['id']}").json()
        assert (job["cpu_slots"], job["gpu_slots"]) == (1, 0)
        info = wait_until_serving(alice, served["id"])
        yield {
            "live": live,
            "alice": alice,
            "alice_token": alice_token,
            "bob_token": bob_token,
            "bob": live.client(bob_token),
            "trained": trained,
            "served": served["id"],
            "info": info,
        }
    finally:
        live.stop()


@pytest.mark.slow
def test_the_tenant_gets_the_predictions_predict_gives_and_no_one_else_reaches_the_model(deployed):
    live, alice = deployed["live"], deployed["alice"]
    served, trained, info = deployed["served"], deployed["trained"], deployed["info"]
    assert info["input_shape"] and info["num_classes"] == 10 and info["engine"] == "plain"
    job = alice.get(f"/api/jobs/{served}").json()
    assert job["kind"] == "serve-model" and job["state"] == "running"
    assert job["reproduction"]["deploys"] == trained
    # The dashboard shows it as it shows any job: its kind and state; its page says how to ask
    # it and offers no Rerun (a deployment is made again from its train job).
    for page in ("/", f"/jobs/{served}"):
        shown = alice.get(page)
        assert shown.status_code == 200 and "serve-model" in shown.text and "running" in shown.text
    assert 'id="rerun-button"' not in shown.text and 'id="cancel-button"' in shown.text
    assert f"/api/jobs/{served}/predict" in shown.text
    assert f"dlscale remote predict {served}" in shown.text
    assert 'id="rerun-button"' in alice.get(f"/jobs/{trained}").text
    answers_are_predicts_and_only_the_tenants(deployed)
    # Hostile bodies: the engine in the sandbox refuses each in one line; the server stays up.
    hostile = {
        b"not json {": 400,
        b'{"inputs": [[1, 2, 3]]}': 422,
        b"[" * 100_000 + b"]" * 100_000: 400,
        json.dumps({"inputs": [[0.0] * 64], "run": "/etc/passwd"}).encode(): 400,
    }
    for body, status in hostile.items():
        answer = alice.post(f"/api/jobs/{served}/predict", content=body)
        assert answer.status_code == status, (body[:40], answer.text)
        assert isinstance(answer.json()["error"], str) and "\n" not in answer.json()["error"]
    assert live.client(None).get("/api/health").status_code == 200
    # The engine counted what reached it: 1 answered, 4 refused, 7 samples.
    metrics = alice.get(f"/api/jobs/{served}/model/metrics", params={"format": "json"}).json()
    assert metrics["requests_by_status"] == {"200": 1, "400": 3, "422": 1}, metrics
    assert metrics["samples"] == 7
    text = alice.get(f"/api/jobs/{served}/model/metrics")
    assert text.headers["content-type"].startswith("text/plain")


def test_the_engine_sees_its_own_folder_only_and_cannot_change_its_model(deployed):
    """Looked at through the sandbox's own root (/proc/PID/root walks its mount namespace):
    the job it deploys, the database and every other job are not there; model/ is read-only."""
    live, served, trained = deployed["live"], deployed["served"], deployed["trained"]
    record = json.loads((live.data_dir / "sandboxes" / f"{served}.json").read_text())
    inside = Path(f"/proc/{record['init']}/root")
    folder = live.data_dir / "jobs" / served
    assert (inside / str(folder).lstrip("/") / SOCKET).exists()
    for hidden in (live.data_dir / "jobs" / trained, live.data_dir / "service.db"):
        assert not (inside / str(hidden).lstrip("/")).exists(), hidden
    with pytest.raises(OSError) as refused:
        (inside / str(folder / MODEL / "run.json").lstrip("/")).write_text("{}")
    assert refused.value.errno == errno.EROFS


def test_the_remote_cli_asks_the_model_and_says_each_refusal_in_one_line(deployed, tmp_path):
    live, alice, served = deployed["live"], deployed["alice"], deployed["served"]
    shape = deployed["info"]["input_shape"]
    samples = np.random.default_rng(1).random((3, *shape), dtype=np.float32).tolist()
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"inputs": samples}))
    said = cli("remote", "predict", served, str(inputs), token=deployed["alice_token"], live=live)
    assert said.exit_code == 0, said.output
    rows = [line.split() for line in said.stdout.strip().splitlines()[1:]]
    direct = alice.post(f"/api/jobs/{served}/predict", json={"inputs": samples}).json()
    assert [int(r[1]) for r in rows] == [p["class"] for p in direct["predictions"]]
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"inputs": [[1, 2]]}')
    refused = cli("remote", "predict", served, str(wrong), token=deployed["alice_token"], live=live)
    assert refused.exit_code == 2 and "the model refused the inputs" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    foreign = cli("remote", "predict", served, str(inputs), token=deployed["bob_token"], live=live)
    assert foreign.exit_code == 1 and f"job {served} not found" in foreign.stderr
    again = cli("remote", "deploy", served, token=deployed["alice_token"], live=live)
    assert again.exit_code == 2 and "only a train job" in again.stderr


def test_a_body_over_the_limit_is_refused_before_it_is_read(deployed):
    live, served = deployed["live"], deployed["served"]
    assert MAX_BODY_BYTES == ENGINE_MAX_BODY_BYTES  # the server refuses what the engine would
    # Declared too long: 413 with not one byte of the body sent (the server answers first).
    with socket.create_connection(("127.0.0.1", live.port), timeout=30) as raw:
        raw.sendall(
            f"POST /api/jobs/{served}/predict HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {deployed['alice'].headers['authorization']}\r\n"
            f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode()
        )
        head = raw.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    metrics = deployed["alice"].get(f"/api/jobs/{served}/model/metrics", params={"format": "json"})
    assert "413" not in metrics.json()["requests_by_status"]  # it never reached the engine


def test_a_deployment_is_refused_for_a_job_with_no_model_or_bad_options(deployed):
    alice, served, trained = deployed["alice"], deployed["served"], deployed["trained"]
    refusals = {
        (served, "cpu", "fp32"): (422, "only a train job"),
        (trained, "tpu", "fp32"): (422, "device: 'tpu' is not one of cpu, cuda"),
        (trained, "cuda", "int8"): (422, "int8 runs on the CPU only"),
        (trained, "cpu", "fp8"): (422, "precision: 'fp8'"),
        ("0123456789abcdef", "cpu", "fp32"): (404, "job not found"),
    }
    for (job_id, device, precision), (status, said) in refusals.items():
        answer = alice.post(
            f"/api/jobs/{job_id}/deploy", data={"device": device, "precision": precision}
        )
        assert answer.status_code == status and said in answer.json()["detail"], answer.text
    # A train job that has not succeeded, over HTTP: while it is queued, starts or runs, then
    # cancelled.
    serving = [job["id"] for job in alice.get("/api/jobs").json() if job["kind"] == "serve-model"]
    long = submit(alice, TINY.replace("epochs: 1", "epochs: 10000"))
    answer = alice.post(f"/api/jobs/{long}/deploy", data={"device": "cpu", "precision": "fp32"})
    assert answer.status_code == 409, answer.text
    assert re.fullmatch(
        f"job {long} is (queued|starting|running): only a succeeded job's model can be deployed",
        answer.json()["detail"],
    )
    assert alice.post(f"/api/jobs/{long}/cancel").status_code == 200
    assert wait_for_state(alice, long, ENDED)["state"] == "cancelled"
    answer = alice.post(f"/api/jobs/{long}/deploy", data={"device": "cpu", "precision": "fp32"})
    assert answer.status_code == 409 and answer.json()["detail"] == (
        f"job {long} is cancelled: only a succeeded job's model can be deployed"
    )
    listed = alice.get("/api/jobs").json()
    assert [job["id"] for job in listed if job["kind"] == "serve-model"] == serving  # none made
    # Each state by the rule the route takes (pure: no job need fail for it).
    for state in ("failed", "cancelled", "running", "queued"):
        status, said = refusal("train", state, trained)
        assert status == 409 and said == (
            f"job {trained} is {state}: only a succeeded job's model can be deployed"
        )
    assert refusal("train", "succeeded", trained) is None
    # A train job asked for predictions.
    answer = alice.post(f"/api/jobs/{trained}/predict", json={"inputs": [[0.0]]})
    assert answer.status_code == 409 and "deploy it first" in answer.json()["detail"]


@pytest.mark.slow
def test_a_server_killed_while_a_model_serves_finds_it_again_once_back(deployed):
    """The engine runs in its sandbox as any job does, so it outlives the server; the server
    back up adopts it and the tenant's predictions go on, from the same engine."""
    live, served, info = deployed["live"], deployed["served"], deployed["info"]
    samples = np.random.default_rng(1).random((3, *info["input_shape"]), dtype=np.float32)
    body = {"inputs": samples.tolist()}
    before = deployed["alice"].post(f"/api/jobs/{served}/predict", json=body)
    assert before.status_code == 200, before.text
    sandbox = live.data_dir / "sandboxes" / f"{served}.json"
    engine = json.loads(sandbox.read_text())["init"]
    live.kill9()
    live.start()
    alice = live.client(deployed["alice_token"])  # the old client's connections died with it
    after = alice.post(f"/api/jobs/{served}/predict", json=body)
    assert after.status_code == 200, after.text
    assert after.json()["predictions"] == before.json()["predictions"]
    assert json.loads(sandbox.read_text())["init"] == engine  # adopted, not started again
    job = alice.get(f"/api/jobs/{served}").json()
    assert job["state"] == "running"
    assert [e["state"] for e in job["events"]].count("starting") == 1, job["events"]
    deployed["alice"] = alice


@pytest.mark.slow
def test_cancel_ends_the_engine_and_the_route_then_says_so(deployed):
    live, served = deployed["live"], deployed["served"]
    cancel_and_see_the_engine_end(deployed)
    assert not (live.data_dir / "sandboxes" / f"{served}.json").exists()  # its sandbox is gone
    route_says_the_model_is_no_longer_served(deployed)


def test_a_deployment_past_the_tenants_storage_quota_is_refused_and_leaves_nothing(deployed):
    """Over HTTP: a copy that would pass the storage left is refused as it copies (422), a
    tenant already at its quota before any copy (409); neither leaves a job or a folder.

    Run once the tenant has no job running: a tenant at its quota has its running jobs stopped
    (service.md), and the deployment the tests before share would be one of them. The cancel's
    test ends it first; under `-m "not slow"` that test is left out, so this one ends it."""
    live, alice, trained = deployed["live"], deployed["alice"], deployed["trained"]
    if alice.get(f"/api/jobs/{deployed['served']}").json()["state"] not in ENDED:
        cancel_and_see_the_engine_end(deployed)
    running = [job["id"] for job in alice.get("/api/jobs").json() if job["state"] not in ENDED]
    assert running == [], "the tenant's running jobs would be stopped at its quota"
    jobs = live.data_dir / "jobs"
    before = sorted(p.name for p in jobs.iterdir())
    listed = len(alice.get("/api/jobs").json())
    model = sum(p.stat().st_size for p in (jobs / trained / "run").rglob("*") if p.is_file())
    tenants = admin.tenants(live.data_dir, None)
    (used,) = [t["storage_used"] for t in tenants if t["name"] == "lab-a"]
    try:
        admin.set_tenant(live.data_dir, None, "lab-a", storage_bytes=used + model // 2)
        answer = alice.post(f"/api/jobs/{trained}/deploy")
        assert answer.status_code == 422, answer.text
        assert "the model's files pass the tenant's storage quota" in answer.json()["detail"]
        admin.set_tenant(live.data_dir, None, "lab-a", storage_bytes=used)
        answer = alice.post(f"/api/jobs/{trained}/deploy")
        assert answer.status_code == 409, answer.text
        assert "tenant lab-a is at its storage quota" in answer.json()["detail"]
    finally:
        admin.set_tenant(live.data_dir, None, "lab-a", storage_bytes=None)
    assert sorted(p.name for p in jobs.iterdir()) == before
    assert len(alice.get("/api/jobs").json()) == listed


def test_the_server_connects_only_to_a_socket_itself_never_through_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(elsewhere))
        listener.listen()
        folder = tmp_path / "job"
        folder.mkdir()
        with pytest.raises(NotServed) as missing:
            open_socket(folder, None)
        assert missing.value.status == 503
        (folder / SOCKET).symlink_to(elsewhere)  # a job pointing the server at another socket
        with pytest.raises(NotServed) as linked:
            open_socket(folder, None)
        assert linked.value.status == 502
        (folder / SOCKET).unlink()
        os.link(elsewhere, folder / SOCKET)  # a real socket, but not of the job's uid
        with pytest.raises(NotServed) as foreign:
            open_socket(folder, os.getuid() + 1)
        assert foreign.value.status == 502
        fd = open_socket(folder, os.getuid())  # its own: reached through /proc/self/fd
        try:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)


def test_a_streamed_body_is_read_only_up_to_the_limit():
    """Without a declared length (or past a larger --max-body-bytes), the route stops reading
    at the limit: 17 chunks of 1 MiB are asked for out of the 64 a client would send."""
    chunk = bytes(1 << 20)
    asked = []

    async def receive():
        asked.append(1)
        return {"type": "http.request", "body": chunk, "more_body": len(asked) < 64}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    with pytest.raises(NotServed) as refused:
        asyncio.run(read_body(Request(scope, receive)))
    assert refused.value.status == 413
    assert len(asked) == MAX_BODY_BYTES // len(chunk) + 1 == 17
