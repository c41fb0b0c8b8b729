"""Shared test helpers: the repository root and a reporter that records what the loop says."""

import os
import tempfile
from pathlib import Path

import pytest

# Tests never see the developer's own hardware entries (~/.dlscale/hardware/local.toml, ...):
# each test run gets an empty DLSCALE_HOME; tests that need one set their own.
os.environ["DLSCALE_HOME"] = tempfile.mkdtemp(prefix="dlscale-home-")

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
