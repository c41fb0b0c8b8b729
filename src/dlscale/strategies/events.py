"""What every parallel strategy shares between its workers and the parent: progress events.

Worker 0 reports through an EventReporter; the parent hands the events to its own reporter.
"""

from __future__ import annotations

import time
from typing import Any

from dlscale.launch.base import EventHandler, Launcher, WorkerContext
from dlscale.train.reporter import Reporter

FORWARDED = ("start", "step", "epoch_end", "warn")  # `finish` is the parent's own
STEP_EVENT_INTERVAL_S = 0.1  # a progress bar needs no more; each event costs both processes CPU


class EventReporter:
    """Worker 0's reporter: sends events to the parent, which shows them.

    Step events are thinned to one per STEP_EVENT_INTERVAL_S (the epoch's end always goes):
    pickling, the pipe to the parent and its redraw cost CPU that the workers need, a few
    percent of a small model's throughput on a 2-core machine.
    """

    def __init__(self, context: WorkerContext):
        self.context = context
        self.last_step_sent = 0.0

    def start(self, plan: dict) -> None:
        self.context.send("start", plan)

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None:
        now = time.monotonic()
        if now - self.last_step_sent >= STEP_EVENT_INTERVAL_S:
            self.last_step_sent = now
            self.context.send("step", step, epoch, loss, samples_per_s)

    def epoch_end(self, record: dict) -> None:
        self.context.send("epoch_end", record)

    def warn(self, message: str) -> None:
        self.context.send("warn", message)

    def finish(self, record: dict) -> None:
        pass


def forward_to(reporter: Reporter) -> EventHandler:
    """The parent's handler: each worker event to the same method of `reporter`."""

    def forward(kind: str, args: tuple[Any, ...]) -> None:
        if kind in FORWARDED:
            getattr(reporter, kind)(*args)

    return forward


def default_launcher(launcher: Launcher | None) -> Launcher:
    """The embedded default: local processes."""
    if launcher is not None:
        return launcher
    from dlscale.launch.local import LocalLauncher

    return LocalLauncher()
