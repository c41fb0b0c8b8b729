"""Shared test helpers: the repository root and a reporter that records what the loop says."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Tests never see the developer's own hardware entries (~/.dlscale/hardware/local.toml, ...):
# each test run gets an empty DLSCALE_HOME; tests that need one set their own.
os.environ["DLSCALE_HOME"] = tempfile.mkdtemp(prefix="dlscale-home-")
# Nor the caller's terminal size: rich fixes a console's width from COLUMNS when the console is
# made (the CLI's, at import), so a COLUMNS the caller exports (some shells and CI
# runners do; pytest-xdist's workers set 80) would wrap the CLI's tables whatever a test asks for.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


class RecordingReporter:
    """Keeps every event the training loop emits, for assertions."""

    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def start(self, plan):
        self.events.append(("start", plan))

    def step(self, step, epoch, loss, samples_per_s):
        self.events.append(("step", step))

    def epoch_end(self, record):
        self.events.append(("epoch", record))

    def warn(self, message):
        self.events.append(("warn", message))

    def finish(self, record):
        self.events.append(("finish", record))

    def of(self, kind: str) -> list:
        return [payload for name, payload in self.events if name == kind]


@pytest.fixture
def reporter() -> RecordingReporter:
    return RecordingReporter()


# ------------------------------------------------- processes (for tests that kill and count)


def default_sigint() -> None:
    """`preexec_fn` of a child a test interrupts with SIGINT: a suite started from a background
    job inherits SIGINT ignored, and an ignored signal stays ignored across exec, so the child
    would carry on. Restored in the child, it reacts as to Ctrl-C whatever the suite inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` (with `args`) in a fresh interpreter that reacts to SIGINT whatever the suite
    inherited; its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        preexec_fn=default_sigint,
    )


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op threads set to `count` for a reference run, then put back: float sums
    depend on how work is split over threads, and a service job trains on its slots' cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def worker_pids(pid: int) -> list[int]:
    """The launcher's live workers, in start order: spawned children, or (the default start
    method, launch/start.py) the children of its fork server; never the resource tracker."""
    pids = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"forkserver" in cmdline:
            pids += [worker for worker in children(child) if alive(worker)]
        elif b"spawn_main" in cmdline and b"resource_tracker" not in cmdline and alive(child):
            pids.append(child)
    return sorted(pids)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def interrupt_next_create(monkeypatch, within: Path | None = None) -> None:
    """From now on the next file created (under `within`, if given) raises KeyboardInterrupt
    just after the kernel made it: a Ctrl-C or SIGTERM that arrives while `open` runs is raised
    as the call returns, before its caller holds the descriptor. Later opens run as usual."""
    real_open = os.open

    def created_then_interrupted(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT and (within is None or str(path).startswith(str(within))):
            monkeypatch.setattr(os, "open", real_open)
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(os, "open", created_then_interrupted)


@pytest.fixture(autouse=True)
def _calm_machine(monkeypatch):
    """Runs in tests do not hear how busy the machine is (other test runs share it), so what a
    run warns about stays what the test made; tests of the busy-machine warning set a load."""
    from dlscale.api import capacity

    monkeypatch.setattr(capacity, "load_average_1m", lambda: 0.0)


# ------------------------------------------------- one training run that several tests inspect


@pytest.fixture(scope="session")
def ps_async_digits(tmp_path_factory) -> tuple[str, dict]:
    """`dlscale train examples/ps-async-digits.yaml`, once a session (3 workers, 20 epochs): its
    printed output and run record. The example's own test checks it; a fault test compares a run
    that lost a worker with it."""
    import json

    from typer.testing import CliRunner

    from dlscale.api import capacity
    from dlscale.cli.main import app

    out = tmp_path_factory.mktemp("ps-async-digits")
    with pytest.MonkeyPatch.context() as patch:  # as _calm_machine does for each test
        patch.setattr(capacity, "load_average_1m", lambda: 0.0)
        result = CliRunner().invoke(
            app, ["train", str(EXAMPLES / "ps-async-digits.yaml"), "--out", str(out)]
        )
    assert result.exit_code == 0, result.output
    return result.output, json.loads((out / "run.json").read_text())
