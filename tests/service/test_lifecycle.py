"""A real server with real job processes: a job trains what `dlscale train` trains, reruns are
bit-identical, sweep and profile jobs run, logs resume by Last-Event-ID, and a server killed
with -9 mid-job comes back to finish every job exactly once, in order, cancels kept."""

from __future__ import annotations

import json
import socket
import time

import pytest

from dlscale import api
from tests.conftest import EXAMPLES, torch_threads
from tests.service.live import LiveServer, wait_for_state

SPEC = """\
name: tiny
model: {name: mlp, kwargs: {hidden: [32]}}
data: {name: digits}
batch_size: 64
epochs: EPOCHS
optimizer: {name: sgd, lr: 0.1}
device: cpu
seed: 5
checkpoint: {every_steps: 20, keep_last: 2}
"""
SWEEP = SPEC.replace("EPOCHS", "1") + "sweep: {grid: {optimizer.lr: [0.05, 0.1]}}\n"


def submit(client, spec: str, **fields) -> str:
    answer = client.post("/api/jobs", files=[("spec", ("spec.yaml", spec.encode()))], data=fields)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def events(client, job_id: str, **params) -> list[tuple[int, str, str]]:
    """(id, event, data) of a finished job's log stream."""
    found, current = [], {}
    with client.stream(
        "GET",
        f"/api/jobs/{job_id}/logs",
        params={"follow": "false", **params},
        headers=params.pop("headers", {}),
    ) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if not line:
                if current:
                    found.append(
                        (int(current.get("id", -1)), current.get("event"), current.get("data"))
                    )
                current = {}
                continue
            key, _, value = line.partition(": ")
            current[key] = value
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("svc") / "data", cpu_slots=2).start()
    yield live
    live.stop()


@pytest.mark.slow
@pytest.mark.heavy
def test_a_job_trains_what_dlscale_train_trains_and_a_rerun_is_bit_identical(server, tmp_path):
    _, token = server.user("alice", "lab")
    client = server.client(token)
    spec = SPEC.replace("EPOCHS", "2")
    job_id = submit(client, spec)
    job = wait_for_state(client, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job
    local = tmp_path / "spec.yaml"
    local.write_text(spec)
    with torch_threads(1):  # the job's one CPU slot
        record = api.train(local, out_dir=tmp_path / "run")
    assert job["result"]["weights_sha256"] == api.weights_digest(tmp_path / "run")
    for key in ("val_loss", "val_accuracy", "train_loss"):
        assert job["result"]["metrics"][key] == getattr(record.final, key), key
    repro = job["reproduction"]
    assert repro["seed"] == 5 and repro["weights_sha256"] == job["result"]["weights_sha256"]
    assert len(repro["data_sha256"]) == 64 and repro["environment"]["torch"]
    # The log: complete, resumable from any event id without gap or repeat.
    stream = events(client, job_id)
    assert stream[-1][1] == "end" and stream[-1][2] == "succeeded"
    lines = [e for e in stream if e[1] == "log"]
    assert len(lines) >= 3
    middle = lines[len(lines) // 2][0]
    resumed = [
        e for e in events(client, job_id, headers={"Last-Event-ID": str(middle)}) if e[1] == "log"
    ]
    assert resumed == lines[len(lines) // 2 + 1 :]
    # A rerun: the same bytes and seed, and the page says the weights are bit-identical.
    again = client.post(f"/api/jobs/{job_id}/rerun")
    assert again.status_code == 201
    rerun = wait_for_state(client, again.json()["id"], ("succeeded", "failed", "cancelled"))
    assert rerun["state"] == "succeeded" and rerun["rerun_of"] == job_id
    assert rerun["reproduction"]["reproduces"] == {"job": job_id, "identical": True}
    assert f"bit-identical to job {job_id}" in rerun["message"]


@pytest.mark.slow
@pytest.mark.heavy
def test_sweep_and_profile_jobs_run(server):
    _, token = server.user("sam", "lab-s")
    client = server.client(token)
    sweep_id = submit(client, SWEEP, kind="sweep")
    profile_id = submit(client, SPEC.replace("EPOCHS", "1"), kind="profile")
    for job_id in (sweep_id, profile_id):
        job = wait_for_state(client, job_id, ("succeeded", "failed", "cancelled"))
        assert job["state"] == "succeeded", job
    names = {a["name"] for a in client.get(f"/api/jobs/{sweep_id}/artifacts").json()}
    assert any(n.endswith("results.json") for n in names), names
    names = {a["name"] for a in client.get(f"/api/jobs/{profile_id}/artifacts").json()}
    assert any(n.endswith("profile.json") for n in names), names


def test_an_upload_over_the_limit_is_refused_before_its_body_is_read(server):
    _, token = server.user("uma", "lab-u")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + b"Content-Type: multipart/form-data; boundary=x\r\n"
            + b"Content-Length: 10000000000\r\n\r\n"  # 10 GB promised, none sent
        )
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    assert server.client(None).get("/api/health").status_code == 200


# The tenant's own model, uploaded with the job: a linear layer that takes its time over every
# step (sleeping, not computing), so a job lasts as long as the test needs whatever the machine.
# With `hold`, a training step waits until the test puts a file named `release` into the job's
# folder (its working directory): the job is running, for certain, until the test lets it end.
# Its validation (read-only folder) never waits. Waiting changes no number: the weights are
# those of the same spec without `hold`.
SLOW_MODEL = b"""
import os
import time

from torch import nn


class Slow(nn.Module):
    def __init__(self, features, num_classes, seconds, hold):
        super().__init__()
        self.linear = nn.Linear(features, num_classes)
        self.seconds = seconds
        self.hold = hold and os.access(".", os.W_OK)

    def forward(self, x):
        while self.hold and not os.path.exists("release"):
            time.sleep(0.05)
        time.sleep(self.seconds)
        return self.linear(x.flatten(1))


def build(num_classes=10, seconds=0.0, hold=False):
    return Slow(64, num_classes, seconds, hold)
"""
SLOW_SPEC = SPEC.replace(
    "{name: mlp, kwargs: {hidden: [32]}}",
    "{name: 'inputs.slow:build', kwargs: {seconds: 0.04, hold: HOLD}}",
)


def submit_slow(client, epochs: int, seed: int, hold: bool = False) -> str:
    spec = SLOW_SPEC.replace("EPOCHS", str(epochs)).replace("seed: 5", f"seed: {seed}")
    spec = spec.replace("HOLD", "true" if hold else "false")
    files = [("spec", ("spec.yaml", spec.encode())), ("files", ("slow.py", SLOW_MODEL))]
    answer = client.post("/api/jobs", files=files)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_server_killed_mid_job_finishes_every_job_once_in_order_and_keeps_a_cancel(tmp_path):
    live = LiveServer(tmp_path / "data", cpu_slots=2).start()
    try:
        _, token = live.user("alice", "lab")
        client = live.client(token)
        first = submit_slow(client, 2, 5, hold=True)  # held until after the crash
        doomed = submit_slow(client, 20, 6)  # ~20 s of steps: cancelled, then the crash
        wait_for_state(client, first, ("running",))
        wait_for_state(client, doomed, ("running",))
        deadline = time.monotonic() + 120
        while not client.get(f"/api/jobs/{doomed}/metrics").json():  # an epoch: a checkpoint
            assert time.monotonic() < deadline, "no epoch finished"
            time.sleep(0.2)
        cancel = client.post(f"/api/jobs/{doomed}/cancel").json()
        assert cancel["cancel_requested"]
        queued = [submit_slow(client, 2, 7), submit_slow(client, 2, 8)]
        queued.append(submit_slow(client, 2, 5))  # `first`'s spec unheld: its weights to match
        assert client.get(f"/api/jobs/{first}").json()["state"] == "running"
        live.kill9()
        time.sleep(1.0)
        live.start()
        (live.data_dir / "jobs" / first / "release").touch()  # it ran across the crash
        final = {
            j: wait_for_state(client, j, ("succeeded", "failed", "cancelled"), 300)
            for j in [first, doomed, *queued]
        }
    finally:
        live.stop()
    assert final[first]["state"] == "succeeded", final[first]
    assert final[doomed]["state"] == "cancelled", final[doomed]
    for job_id in queued:
        job = final[job_id]
        assert job["state"] == "succeeded", job
        assert [e["state"] for e in job["events"]].count("starting") == 1, job["events"]
        log = (live.data_dir / "jobs" / job_id / "log.txt").read_text()
        assert log.count("starting job") <= 1
    started = [final[j]["started_at"] for j in queued]
    assert started == sorted(started), "queued jobs started in the order they were submitted"
    uninterrupted = final[queued[-1]]["result"]["weights_sha256"]
    assert final[first]["result"]["weights_sha256"] == uninterrupted
    checkpoints = list((live.data_dir / "jobs" / doomed / "run").rglob("*.pt"))
    assert checkpoints, "a cancelled job keeps its last checkpoint"
    assert (
        json.loads((live.data_dir / "jobs" / doomed / "result.json").read_text())["state"]
        == "cancelled"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "module", "minimum_accuracy"),
    # The GPT's ceiling is ~46%: each token of its Markov chain has two likely successors.
    [
        pytest.param("own-model.yaml", "mynet.py", 0.93, marks=pytest.mark.heavy),
        pytest.param("transformers-gpt2.yaml", "hf_gpt2.py", 0.40, marks=pytest.mark.heavy),
    ],
)
def test_the_tenants_own_code_examples_train_on_the_service(
    server, example, module, minimum_accuracy
):
    """examples/service: a custom module, and a transformers model built from its config, each
    uploaded with its spec and imported in the job's sandbox as inputs.NAME."""
    _, token = server.user(f"own-{module.split('.')[0]}", "lab-own")
    client = server.client(token)
    folder = EXAMPLES / "service"
    files = [
        ("spec", (example, (folder / example).read_bytes())),
        ("files", (module, (folder / "inputs" / module).read_bytes())),
    ]
    answer = client.post("/api/jobs", files=files)
    assert answer.status_code == 201, answer.text
    job = wait_for_state(client, answer.json()["id"], ("succeeded", "failed", "cancelled"), 300)
    assert job["state"] == "succeeded", job
    assert job["result"]["metrics"]["val_accuracy"] >= minimum_accuracy
