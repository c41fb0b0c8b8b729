"""The job process and its folder: a job trains in its sandbox what `api.train` trains
(bit-identical weights), runs once however often it is started, cancels to a kept checkpoint
with no process left behind, fails in one line; and the folder hands out only its own regular
files with one link, its log line by line."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale import api
from dlscale.errors import UserError
from dlscale.service import cgroups, layout
from dlscale.service.config import ServiceConfig
from dlscale.service.executor import Executor, Probe
from dlscale.service.layout import job_dir, list_artifacts, open_artifact, tail, write_job
from dlscale.train import provenance
from tests.conftest import alive, children, default_sigint, torch_threads, worker_pids

SPEC = """\
name: tiny
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: EPOCHS
optimizer: {name: sgd, lr: 0.1}
device: cpu
seed: 3
"""
JOB_ID = "0123456789abcdef"


def new_job(tmp_path: Path, spec: str, kind: str = "train", inputs=None) -> Path:
    folder = job_dir(tmp_path / "data", JOB_ID)
    job = {"id": JOB_ID, "kind": kind, "seed": 3, "spec_file": "spec.yaml"}
    return write_job(folder, job, spec, inputs)


def sandboxed(tmp_path: Path) -> Executor:
    """The server's executor: jobs in bubblewrap, each in a cgroup of its own."""
    return Executor(tmp_path / "sandboxes", cgroups.detect())


def plain(tmp_path: Path) -> Executor:
    """An executor for probing folders (and --unsafe-single-user's plain processes)."""
    return Executor(tmp_path / "sandboxes", None, sandboxed=False)


def start(executor: Executor, folder: Path, cpus: int = 1) -> int:
    """Start the job as the server does: its folder handed to its uid, its slots' limits."""
    limits = ServiceConfig(data_dir=folder.parent.parent, cpu_slots=2).limits(
        cpus, 0, folder.name, None
    )
    executor.prepare(folder, limits.uid)
    return executor.start(folder, limits)


def runner_of(pid: int) -> int:
    """The job's runner, inside the sandbox started as `pid`."""
    for child in descendants(pid):
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"dlscale.service.runner" in argv and not argv[0].endswith(b"bwrap"):
            return child
    raise AssertionError("no runner")


def wait_until(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def wait_ended(executor: Executor, folder: Path) -> dict:
    wait_until(lambda: (p := executor.probe(folder)).result is not None and not p.alive)
    executor.reap()
    return executor.probe(folder).result


def run_runner(folder: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dlscale.service.runner", str(folder)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


# ------------------------------------------------------------------ the job process


@pytest.mark.slow
def test_a_train_job_trains_what_api_train_trains_and_runs_only_once(tmp_path):
    spec = SPEC.replace("EPOCHS", "2")
    folder = new_job(tmp_path, spec)
    executor = sandboxed(tmp_path)
    start(executor, folder)
    result = wait_ended(executor, folder)
    assert result["state"] == "succeeded", (folder / "log.txt").read_text()
    # The reference: the same spec trained in this process, into another folder.
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "spec.yaml").write_text(spec)
    with torch_threads(1):  # the job's one CPU slot
        record = api.train(tmp_path / "ref" / "spec.yaml", out_dir=tmp_path / "ref" / "run")
    assert result["weights_sha256"] == api.weights_digest(tmp_path / "ref" / "run")
    assert len(result["weights_sha256"]) == 64
    run_json = json.loads((folder / "run" / "run.json").read_text())
    assert result["metrics"] == run_json["final"]
    assert result["metrics"]["val_loss"] == record.final.val_loss
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert metrics == run_json["epochs"] and [m["epoch"] for m in metrics] == [1, 2]
    assert result["data_sha256"] == provenance.data_digest(folder / "spec.yaml")
    assert result["environment"]["torch"] == torch.__version__
    log = (folder / "log.txt").read_text()
    assert log.count("starting job") == 1 and "epoch 2" in log and "Traceback" not in log
    # Started again (a server that crashed before it recorded the start): nothing runs.
    before = (folder / "result.json").read_bytes()
    again = run_runner(folder)
    assert again.returncode == 0 and "already started once" in again.stdout
    assert (folder / "result.json").read_bytes() == before
    assert (folder / "log.txt").read_text() == log
    # Its artifacts: the run folder's files and the log, each with its own bytes' sha256.
    listed = {name: (size, digest) for name, size, digest in list_artifacts(folder)}
    assert {"log.txt", "metrics.jsonl", "result.json", "run/run.json"} <= set(listed)
    assert any(name.startswith("run/checkpoints/step-") for name in listed)
    assert not {"job.json", "spec.yaml", "claimed", "pid", "runner.lock"} & set(listed)
    data = (folder / "run" / "run.json").read_bytes()
    assert listed["run/run.json"] == (len(data), hashlib.sha256(data).hexdigest())
    assert executor.release(folder)["oom_kills"] == 0  # its cgroup, read and removed


def test_a_job_whose_lock_is_held_is_left_to_its_runner(tmp_path):
    folder = new_job(tmp_path, SPEC.replace("EPOCHS", "1"))
    fd = os.open(folder / "runner.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        probe = plain(tmp_path).probe(folder)
        assert probe.alive and not probe.claimed and probe.result is None
        started = run_runner(folder)
    finally:
        os.close(fd)
    assert started.returncode == 0 and "another process" in started.stdout
    assert not (folder / "claimed").exists()
    assert plain(tmp_path).probe(folder) == Probe(alive=False, claimed=False, result=None)


@pytest.mark.slow
def test_cancel_stops_the_job_keeps_a_checkpoint_and_leaves_no_process(tmp_path):
    spec = SPEC.replace("EPOCHS", "500") + (
        "strategy: {name: ddp, workers: 2}\ncheckpoint: {every_steps: 5, keep_last: 1}\n"
    )
    folder = new_job(tmp_path, spec)
    executor = sandboxed(tmp_path)
    pid = start(executor, folder, cpus=2)
    wait_until(lambda: list((folder / "run" / "checkpoints").glob("step-*.pt")))
    assert executor.probe(folder).alive
    assert os.getsid(pid) == pid != os.getsid(0)  # its own session: a server crash spares it
    runner = runner_of(pid)
    trainers = worker_pids(runner)
    assert len(trainers) == 2, "ddp runs its workers as processes of their own"
    helpers = set(descendants(runner)) - set(trainers)
    assert executor.cancel(folder)
    result = wait_ended(executor, folder)
    wait_until(lambda: not alive(pid))
    assert result["state"] == "cancelled", result
    kept = result["message"].split("kept: ")[1]
    assert kept.startswith("run/checkpoints/step-") and (folder / kept).is_file()
    assert [w for w in trainers if alive(w)] == []  # stopped with the job, not after it
    # The fork server and resource tracker go with the sandbox's PID namespace.
    wait_until(lambda: not any(alive(p) for p in helpers), timeout_s=60)
    assert not executor.cancel(folder)  # nothing left to signal
    usage = executor.release(folder)
    assert usage["oom_kills"] == 0 and usage["peak_memory_bytes"] > 100 << 20
    assert not any(
        p.exists()
        for p in cgroups.JobCgroup(executor.hierarchy, f"dlscale-job-{JOB_ID}").folders.values()
    )


def test_a_spec_that_fails_at_run_time_fails_in_one_line(tmp_path):
    spec = SPEC.replace("EPOCHS", "1").replace("{name: digits}", "{name: npz, path: inputs/d.npz}")
    folder = new_job(tmp_path, spec, inputs={"d.npz": b"not yet"})
    (folder / "inputs" / "d.npz").unlink()  # gone between submission and start
    ended = run_runner(folder)
    assert ended.returncode == 1
    result = json.loads((folder / "result.json").read_text())
    assert result["state"] == "failed" and "d.npz" in result["message"]
    assert "\n" not in result["message"] and result["weights_sha256"] is None
    assert "Traceback" not in ended.stdout + ended.stderr


def test_a_job_gone_without_a_result_is_named_with_its_last_log_line(tmp_path):
    folder = new_job(tmp_path, SPEC)
    (folder / "claimed").touch()
    (folder / "log.txt").write_text("step 1\nstep 2 loss 0.5\n\n")
    probe = plain(tmp_path).probe(folder)
    assert probe.claimed and not probe.alive and probe.result is None
    message = plain(tmp_path).lost_message(folder)
    assert "result.json" in message and message.endswith("its log ends: step 2 loss 0.5")


# ------------------------------------------------------------------ digests


def test_the_weights_digest_covers_names_dtypes_shapes_and_bytes():
    from dlscale.train.provenance import state_digest

    state = {"b": torch.arange(4.0), "a": torch.ones(2, 2, dtype=torch.bfloat16)}
    same = {"a": state["a"].clone(), "b": state["b"].clone()}
    assert state_digest(state) == state_digest(same)  # key order does not matter
    flipped = {**same, "b": same["b"].clone()}
    flipped["b"][3] = torch.nextafter(flipped["b"][3], torch.tensor(10.0))  # one ulp
    assert state_digest(flipped) != state_digest(state)
    assert state_digest({**same, "b": same["b"].reshape(2, 2)}) != state_digest(state)
    assert state_digest({**same, "b": same["b"].double()}) != state_digest(state)


def test_the_data_digest_of_files_follows_their_bytes(tmp_path, monkeypatch):
    x = np.zeros((20, 4), dtype=np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    spec = tmp_path / "spec.yaml"
    npz = SPEC.replace("EPOCHS", "1")
    spec.write_text(npz.replace("{name: digits}", "{name: npz, path: d.npz}"))
    first = provenance.data_fingerprint(spec)
    assert first["files"] == 1 and not first["partial"]
    x[0, 0] = 1.0
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    assert provenance.data_digest(spec) != first["sha256"]
    monkeypatch.setattr(provenance, "DATA_HASH_LIMIT_BYTES", 10)  # big data: named, sized, dated
    assert provenance.data_fingerprint(spec)["partial"]


# ------------------------------------------------------------------ the folder


def test_only_the_jobs_own_regular_files_are_listed_or_opened(tmp_path):
    folder = new_job(tmp_path, SPEC)
    run = folder / "run"
    (run / "sub").mkdir(parents=True)
    (run / "model.txt").write_text("weights")
    (run / "sub" / "b.txt").write_text("b")
    (run / "passwd").symlink_to("/etc/passwd")
    (run / "outside").symlink_to(tmp_path)  # a folder link: not walked into
    os.mkfifo(run / "pipe")
    (tmp_path / "secret.txt").write_text("secret")
    (run / "linked").symlink_to(tmp_path / "secret.txt")
    names = [name for name, _, _ in list_artifacts(folder)]
    assert names == ["run/model.txt", "run/sub/b.txt"]
    with open_artifact(folder, "run/sub/b.txt") as handle:
        assert handle.read() == b"b"
    (folder / "log.txt").write_text("hello\n")
    assert [n for n, _, _ in list_artifacts(folder)][-1] == "log.txt"
    refused = [
        "run/passwd",
        "run/linked",
        "run/pipe",
        "run/outside/secret.txt",
        "run/../spec.yaml",
        "../secret.txt",
        "/etc/passwd",
        str(folder / "run" / "model.txt"),
        "run/model.txt\x00",
        "spec.yaml",
        "job.json",
        "run",
        "run/",
        "",
    ]
    for name in refused:
        with pytest.raises(FileNotFoundError):
            open_artifact(folder, name)
    # A folder on the path swapped for a link after listing is refused too.
    os.rename(run / "sub", run / "real")
    (run / "sub").symlink_to(run / "real")
    with pytest.raises(FileNotFoundError):
        open_artifact(folder, "run/sub/b.txt")


def test_tail_returns_complete_lines_and_resumes_without_gap_or_repeat(tmp_path):
    path = tmp_path / "log.txt"
    assert tail(path, 0) == ([], 0)  # not written yet
    path.write_bytes(b"one\ntwo\nthr")
    lines, offset = tail(path, 0)
    assert lines == [(4, "one"), (8, "two")] and offset == 8
    assert tail(path, offset) == ([], 8)  # a partial line waits for its newline
    with open(path, "ab") as handle:
        handle.write(b"ee\r\nfour\n")
    lines, offset = tail(path, offset)
    assert lines == [(15, "three"), (20, "four")] and offset == 20
    resumed, _ = tail(path, 4)  # Last-Event-ID 4: everything after "one"
    assert [line for _, line in resumed] == ["two", "three", "four"]


def test_the_folder_refuses_bad_ids_and_input_names(tmp_path):
    for bad in ("../../etc", "0123456789ABCDEF", "0123456789abcde", "x" * 16, ""):
        with pytest.raises(ValueError):
            job_dir(tmp_path, bad)
    for bad in ("../x", "a/b", "a\\b", ".hidden", "..", "", "a\x00b"):
        with pytest.raises(UserError):
            write_job(tmp_path / "jobs" / JOB_ID, {"id": JOB_ID}, "x", {bad: b""})
        assert not (tmp_path / "jobs" / JOB_ID).exists()  # nothing written
    folder = write_job(tmp_path / "jobs" / JOB_ID, {"id": JOB_ID}, "text: 1\n", {"d.npz": b"1"})
    assert (folder / "spec.yaml").read_text() == "text: 1\n"
    assert (folder / "inputs" / "d.npz").read_bytes() == b"1"
    assert layout.read_result(folder) is None


def test_files_the_server_reads_from_a_job_are_never_followed_out_of_it(tmp_path):
    """A job can replace its log or result with a link to another tenant's files or the
    server's own; the server streams and parses those files, so it must not follow links."""
    folder = new_job(tmp_path, SPEC)
    secret = tmp_path / "other-tenant.jsonl"
    secret.write_text('{"state": "succeeded", "message": "their data"}\n')
    (folder / "log.txt").symlink_to(secret)
    (folder / "result.json").symlink_to(secret)
    assert tail(folder / "log.txt", 0) == ([], 0)
    result = layout.read_result(folder)
    assert result["state"] == "failed" and "their data" not in json.dumps(result)
    assert "their data" not in plain(tmp_path).lost_message(folder)


def test_the_runner_writes_through_no_link_and_hard_links_are_not_served(tmp_path):
    """Once, a symlink planted in a job's folder made the runner append its metrics lines to
    /etc/passwd. The runner now opens what it writes without following links, and a file with
    a second hard link (its bytes may be anyone's) is never listed or served."""
    folder = new_job(tmp_path, SPEC.replace("EPOCHS", "1"))
    elsewhere = tmp_path / "someone-elses.txt"
    elsewhere.write_text("theirs\n")
    (folder / "metrics.jsonl").symlink_to(elsewhere)
    ended = run_runner(folder)
    assert elsewhere.read_text() == "theirs\n"  # nothing appended through the link
    result = json.loads((folder / "result.json").read_text())
    assert result["state"] == "failed" and "\n" not in result["message"]
    (folder / "metrics.jsonl").unlink()
    (folder / "runner.lock").unlink()
    os.symlink(elsewhere, folder / "runner.lock")
    again = run_runner(folder)
    assert again.returncode == 0 and "cannot take runner.lock" in again.stdout
    run = folder / "run"
    run.mkdir(exist_ok=True)
    (run / "own.txt").write_text("mine")
    os.link(elsewhere, run / "linked.txt")  # the same inode as a file outside the folder
    names = [name for name, _, _ in list_artifacts(folder)]
    assert "run/own.txt" in names and "run/linked.txt" not in names
    with pytest.raises(FileNotFoundError):
        open_artifact(folder, "run/linked.txt")
    assert ended.returncode == 1


def test_a_cancel_while_the_job_imports_ends_it_cancelled(tmp_path):
    """Once, a cancel that reached a job while it imported numpy left a module half-made and
    the job failed with an AttributeError. A cancel before training has begun is noted, and the
    job ends cancelled."""
    folder = new_job(tmp_path, SPEC.replace("EPOCHS", "1"))
    runner = subprocess.Popen(
        [sys.executable, "-m", "dlscale.service.runner", str(folder)],
        preexec_fn=default_sigint,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(lambda: (folder / "pid").exists(), timeout_s=60)
    runner.send_signal(signal.SIGINT)  # while it imports torch, numpy and dlscale
    output, _ = runner.communicate(timeout=120)
    result = json.loads((folder / "result.json").read_text())
    assert runner.returncode == 130, output
    assert result["state"] == "cancelled" and "before it started training" in result["message"]
    assert not (folder / "run").exists() and "Traceback" not in output
