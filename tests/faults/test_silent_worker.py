"""A data-parallel worker stopped mid-run (SIGSTOP): the user hears which one the others wait
for while they wait, and the job's error names it, not the healthy worker whose wait timed out."""

import os
import signal
import subprocess
import sys
import threading
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
@pytest.mark.heavy
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


SWEEP = """
name: sweep-stopped
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: 100000
device: cpu
sweep:
  grid: {optimizer.lr: [0.1]}
"""
# Another spec (one epoch): on code that let it in, its resume is refused by the spec check
# instead of training on beside the trial.
TRAIN = SWEEP.split("sweep:")[0].replace("epochs: 100000", "epochs: 1")


@pytest.mark.slow
@pytest.mark.heavy
def test_a_live_sweep_trial_holds_its_folder_and_is_named_when_stopped(tmp_path: Path):
    """A trial's folder is its own while it trains (a `train --resume` into it is refused, as
    into any live run's folder), and a trial whose process is stopped is named while the sweep
    waits for it, as a launcher names a stopped worker."""
    from typer.testing import CliRunner

    from dlscale.cli.main import app
    from tests.conftest import default_sigint

    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    (tmp_path / "train.yaml").write_text(TRAIN)
    out = tmp_path / "sweep"
    trial = out / "trials" / "t000" / "train"
    sweep = subprocess.Popen(
        [DLSCALE, "sweep", str(spec), "--out", str(out), "--parallel", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"},
    )
    slots: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not list_checkpoints(trial):
            assert sweep.poll() is None, sweep.communicate()[0]
            assert time.monotonic() < deadline, "no trial checkpoint within 120 s"
            time.sleep(0.05)
        slots = worker_pids(sweep.pid)
        assert len(slots) == 1
        resumed = CliRunner().invoke(
            app, ["train", str(tmp_path / "train.yaml"), "--out", str(trial), "--resume"]
        )
        os.kill(slots[0], signal.SIGSTOP)
        waiting = ""
        watchdog = threading.Timer(60, give_up, (sweep, slots[0]))  # no warning: end the loop
        watchdog.start()
        for line in sweep.stdout:
            if "waiting for slot 0" in line:
                waiting = line
                break
        watchdog.cancel()
        if alive(slots[0]):
            os.kill(slots[0], signal.SIGCONT)
        sweep.send_signal(signal.SIGINT)
        rest = sweep.communicate(timeout=60)[0]
    finally:
        for pid in slots:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert resumed.exit_code == 2, resumed.output
    assert f"{trial} is in use by another dlscale run (pid {slots[0]})" in resumed.stderr
    assert len(resumed.stderr.strip().splitlines()) == 1
    waiting = " ".join(waiting.split())
    assert f"t000/train: waiting for slot 0 (pid {slots[0]}): no heartbeat for" in waiting, rest
    assert f"its process is stopped (SIGSTOP? `kill -CONT {slots[0]}` resumes it)" in waiting
    assert sweep.returncode == 130, rest
    assert "Traceback" not in rest, rest
    assert not (trial / ".dlscale.lock").exists()


def give_up(job: subprocess.Popen, pid: int) -> None:
    """End a job and its stopped process, which holds the job's stdout open (so the test's
    read ends) and would outlive a job killed alone (its parent is the fork server)."""
    os.kill(pid, signal.SIGKILL)
    job.kill()
