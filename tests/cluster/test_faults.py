"""Faults across hosts: host-b's cable pulled for good or for 20 s, its Ray node killed, a worker
on it stopped. Each ends in one line naming the host and worker (or, for a short outage, the run
goes on), leaves no worker process on any host, and `--resume` then ends with the weights of
the uninterrupted run, as after a local kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dlscale import api
from dlscale.jobspec import parse_spec
from tests.cluster.conftest import BIN, clean_environment, same_weights
from tests.cluster.testbed import Testbed

SPEC = {
    "name": "faults",
    "model": {"name": "lenet"},
    "data": {"name": "digits", "image_size": 28},
    "batch_size": 32,
    "steps": 400,
    "device": "cpu",
    "seed": 0,
    "optimizer": {"name": "sgd", "lr": 0.05},
    "checkpoint": {"every_steps": 50, "keep_last": 20},
    "strategy": {"name": "ddp", "workers": 2, "timeout_s": 30},
}
WORKER = "_RayWorker"  # what a worker actor's process is called


@pytest.fixture(scope="module")
def pair():
    """host-a (the head, where the user types) and host-b, one CPU each: one worker on each."""
    with Testbed(hosts=2, cpus_per_host=1) as bed:
        bed.start_ray(str(BIN / "ray"), env=clean_environment())
        yield bed
    assert not bed.leftovers()


@pytest.fixture(autouse=True)
def both_nodes_up(pair):
    """Each test starts with both Ray nodes alive, whatever the one before it left."""
    pair.link(1, up=True)
    ended = pair.ray[1].poll() is not None  # its node killed: the head may not know it yet
    if ended or pair.alive() != sorted(host.address for host in pair.hosts):
        pair.restart_ray(1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """Its run.json, beside those of the interrupted runs."""
    out = tmp_path_factory.mktemp("whole") / "run"
    return api.train(parse_spec(SPEC), out_dir=out).to_json()


def workers_on(bed, index: int) -> list[int]:
    """The worker processes host `index` still runs."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    mine = set(bed.pids(index))
    found = [line.split(None, 1) for line in listing.splitlines() if WORKER in line]
    return [int(pid) for pid, _ in found if int(pid) in mine]


def start(bed, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "run"
    argv = [str(BIN / "dlscale"), "train", str(path), "--cluster", "ray"]
    argv += ["--address", bed.address, "--out", str(out), *extra]
    log = open(tmp_path / "output.txt", "a")  # noqa: SIM115
    process = bed.popen(0, argv, stdout=log, stderr=subprocess.STDOUT, env=clean_environment())
    return process, out


def after_first_checkpoint(out: Path, process: subprocess.Popen, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while not list(out.glob("checkpoints/*")):
        assert process.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    time.sleep(2)


def ended(process: subprocess.Popen, tmp_path: Path, limit_s: float = 240) -> tuple[int, str]:
    try:
        code = process.wait(timeout=limit_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return code, (tmp_path / "output.txt").read_text()


def no_worker_left(bed, limit_s: float = 90) -> None:
    """Within `limit_s` (a cut-off worker ends itself once its heartbeats have got nowhere for
    a minute), no host runs a worker of the job."""
    deadline = time.monotonic() + limit_s
    while any(workers_on(bed, i) for i in range(len(bed.hosts))):
        assert time.monotonic() < deadline, [workers_on(bed, i) for i in range(len(bed.hosts))]
        time.sleep(1)


def resumes_exactly(bed, tmp_path: Path, uninterrupted: dict) -> None:
    process, out = start(bed, tmp_path, "--resume")
    code, output = ended(process, tmp_path, 300)
    assert code == 0, output[-3000:]
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed"
    same_weights(uninterrupted, record)


def one_line_naming_host_b(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert "host-b (10.77.0.2)" in errors[0], errors[0]
    return errors[0]


def test_the_cable_pulled_for_good(pair, tmp_path: Path, uninterrupted: dict):
    process, out = start(pair, tmp_path)
    after_first_checkpoint(out, process)
    pair.link(1, up=False)
    try:
        code, output = ended(process, tmp_path)
        assert code != 0
        one_line_naming_host_b(output)
        no_worker_left(pair)
    finally:
        pair.link(1, up=True)
    pair.restart_ray(1)
    resumes_exactly(pair, tmp_path, uninterrupted)


def test_host_b_ray_node_killed(pair, tmp_path: Path, uninterrupted: dict):
    process, out = start(pair, tmp_path)
    after_first_checkpoint(out, process)
    pair.kill_ray(1)
    code, output = ended(process, tmp_path)
    assert code != 0
    one_line_naming_host_b(output)
    no_worker_left(pair)
    pair.restart_ray(1)
    resumes_exactly(pair, tmp_path, uninterrupted)


def test_a_worker_on_host_b_stopped(pair, tmp_path: Path, uninterrupted: dict):
    process, out = start(pair, tmp_path)
    after_first_checkpoint(out, process)
    (stopped,) = workers_on(pair, 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        code, output = ended(process, tmp_path)
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert code != 0
    line = one_line_naming_host_b(output)
    assert "stopped responding" in line
    no_worker_left(pair)
    resumes_exactly(pair, tmp_path, uninterrupted)


def test_the_cable_out_for_20_seconds(pair, tmp_path: Path, uninterrupted: dict):
    """Either the run rides out the outage, or it ends as a lost host does; then resumes."""
    process, out = start(pair, tmp_path)
    after_first_checkpoint(out, process)
    pair.link(1, up=False)
    time.sleep(20)
    pair.link(1, up=True)
    code, output = ended(process, tmp_path)
    if code == 0:
        record = json.loads((out / "run.json").read_text())
        assert record["status"] == "completed"
        return
    one_line_naming_host_b(output)
    no_worker_left(pair)
    if pair.hosts[1].address not in (pair.alive() or []):
        pair.restart_ray(1)
    resumes_exactly(pair, tmp_path, uninterrupted)
