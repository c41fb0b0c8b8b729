"""A data-parallel worker killed mid-run: the job stops naming it, leaves no process, resumes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.train.checkpoint import list_checkpoints
from tests.conftest import alive, worker_pids

SPEC = """
name: ddp-fault
model: {name: lenet}
data: {name: synthetic, shape: [1, 28, 28], num_samples: 4000}
batch_size: 16
steps: 200
optimizer: {name: sgd, lr: 0.05}
device: cpu
checkpoint: {every_steps: 20, keep_last: 2}
strategy: {name: ddp, workers: 2}
"""
DLSCALE = str(Path(sys.executable).parent / "dlscale")


@pytest.mark.slow
@pytest.mark.heavy
def test_killed_worker_stops_the_job_then_resume_finishes(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [DLSCALE, "train", str(spec), "--out", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(step >= 20 for step, _ in list_checkpoints(run_dir)):
        assert job.poll() is None, job.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.01)
    workers = worker_pids(job.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.monotonic()
    job.wait(timeout=60)
    assert time.monotonic() - killed_at < 60
    stderr = job.stderr.read()
    assert job.returncode == 1, stderr
    assert f"(pid {workers[1]}) was killed by SIGKILL" in stderr and "error: worker" in stderr
    assert "Traceback" not in stderr
    assert not any(alive(pid) for pid in workers), "a worker outlived the job"
    stopped_at = list_checkpoints(run_dir)[-1][0]
    assert stopped_at < 200

    # The resume from this process: the killed job was the process under test.
    resumed = CliRunner().invoke(app, ["train", str(spec), "--out", str(run_dir), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming at step {stopped_at}" in " ".join(resumed.stdout.split())
    assert list_checkpoints(run_dir)[-1][0] == 200
