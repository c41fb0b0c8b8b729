"""A data-parallel worker stopped mid-run (SIGSTOP): the user hears which one the others wait
for while they wait, and the job's error names it, not the healthy worker whose wait timed out."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale.train.checkpoint import list_checkpoints
from tests.conftest import alive, worker_pids

# A short collective timeout keeps the test to seconds; the silence warning (after 3 s without a
# heartbeat, beats being 1 s apart) comes well before.
SPEC = """
name: ddp-stopped
model: {name: mlp, kwargs: {hidden: [32]}}
data: {name: synthetic, shape: [1, 8, 8], num_samples: 4000}
batch_size: 16
steps: 100000
optimizer: {name: sgd, lr: 0.05}
device: cpu
checkpoint: {every_steps: 20, keep_last: 1}
strategy: {name: ddp, workers: 2, timeout_s: 8, heartbeat_warn_s: 3}
"""
DLSCALE = str(Path(sys.executable).parent / "dlscale")


@pytest.mark.slow
def test_stopped_worker_is_named_while_waiting_and_in_the_error(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [DLSCALE, "train", str(spec), "--out", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(run_dir):
            assert job.poll() is None, job.stderr.read()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.01)
        workers = worker_pids(job.pid)
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGSTOP)
        # The warning must come while the job still waits, not with its final error.
        waiting, running_then = "", False
        for line in job.stdout:
            if "waiting for worker 1" in line:
                waiting, running_then = line, job.poll() is None
                break
        assert running_then, f"no 'waiting for worker 1' line while the job ran: {waiting!r}"
        _, stderr = job.communicate(timeout=120)
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            job.kill()
            job.wait()
    assert f"waiting for worker 1 (pid {workers[1]}): no heartbeat for" in waiting, waiting
    assert f", its process is stopped (SIGSTOP? `kill -CONT {workers[1]}`" in waiting, waiting
    assert job.returncode == 1, stderr
    error = " ".join(stderr.split())
    assert error.startswith(f"error: worker 1 (pid {workers[1]}) stopped responding: no heart")
    assert ", its process is stopped (SIGSTOP?); then worker 0 failed" in error, error
    assert "Traceback" not in stderr, stderr
    assert not any(alive(pid) for pid in workers), "a worker outlived the job"
