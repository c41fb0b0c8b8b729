"""SIGTERM and a closed stdout: a run told to stop by `kill` ends as Ctrl-C ends it (no half-written
file, the --resume hint), and a run whose stdout reader goes away (`| head -1`) trains to the end
and writes its whole record."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from dlscale.train.ownership import LOCK_NAME
from tests.conftest import default_sigint, worker_pids

DLSCALE = str(Path(sys.executable).parent / "dlscale")
# A checkpoint every step of a model with ~1.1 M parameters (13 MB with Adam's state): most of
# the run is spent writing checkpoints, so a signal lands inside a write more often than not.
HEAVY = """
name: heavy
model: {name: mlp, kwargs: {hidden: [1024, 1024]}}
data: {name: digits}
batch_size: 64
steps: 100000
optimizer: {name: adam, lr: 0.001}
device: cpu
checkpoint: {every_steps: 1, keep_last: 2}
strategy: STRATEGY
"""


def start(spec: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [DLSCALE, "train", str(spec), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,  # whatever the suite inherited, signals act as in a shell
    )


def leftovers(folder: Path) -> list[str]:
    """Temporary files of an atomic write that was cut short, anywhere under `folder`."""
    return [str(p) for p in folder.rglob("*.tmp")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["{name: single}", pytest.param("{name: ddp, workers: 2}", marks=pytest.mark.heavy)]
)
def test_sigterm_ends_like_ctrl_c_with_no_half_written_file(tmp_path: Path, strategy: str):
    spec = tmp_path / "spec.yaml"
    spec.write_text(HEAVY.replace("STRATEGY", strategy))
    out = tmp_path / "run"
    job = start(spec, out)
    try:
        deadline = time.monotonic() + 120
        while len(list_checkpoints(out)) < 2:
            assert job.poll() is None, job.communicate()[1]
            assert time.monotonic() < deadline, "no checkpoints within 120 s"
            time.sleep(0.01)
        workers = worker_pids(job.pid)
        job.send_signal(signal.SIGTERM)  # what `kill PID`, systemd or a batch scheduler send
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 143, stderr  # 128 + SIGTERM, as a shell reports it
    assert "terminated (SIGTERM): continue later with --resume" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert leftovers(out) == []
    assert not (out / LOCK_NAME).exists()
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived it"
    saved = load_checkpoint(latest_checkpoint(out))  # the newest one is whole
    assert saved["step"] >= 2
    if (out / "run.json").exists():  # written at an epoch's end: it must not say running
        record = json.loads((out / "run.json").read_text())
        assert (record["status"], record["error"]) == ("interrupted", "stopped by SIGTERM")


PIPED = """
name: piped
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: 30
device: cpu
"""


@pytest.mark.heavy
def test_a_closed_stdout_does_not_stop_the_run(tmp_path: Path):
    """`dlscale train ... | head -1`: head leaves after the first line, and every later line
    meets a closed pipe. The run trains to its end, writes its whole record and says, once, on
    stderr, that its output went nowhere."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(PIPED)
    out = tmp_path / "run"
    piped = subprocess.run(
        [
            "bash",
            "-c",
            f'"{DLSCALE}" train "{spec}" --out "{out}" | head -1; exit "${{PIPESTATUS[0]}}"',
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=default_sigint,
    )
    assert len(piped.stdout.splitlines()) == 1, piped.stdout  # head's one line
    assert "Traceback" not in piped.stderr, piped.stderr
    assert piped.returncode == 0, piped.stderr
    assert "standard output was closed" in piped.stderr, piped.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed"
    assert len(record["epochs"]) == 30
    assert load_checkpoint(latest_checkpoint(out))["step"] == record["plan"]["total_steps"]
    assert f"{out}/run.json" in " ".join(piped.stderr.split())  # where the record is
