"""What the loop tells the outside world as it runs; front doors decide how to show it."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    """Progress events from a training run, in order: start, (step | epoch_end | warn)*, finish."""

    def start(self, plan: dict) -> None: ...

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None: ...

    def epoch_end(self, record: dict) -> None: ...

    def warn(self, message: str) -> None: ...

    def finish(self, record: dict) -> None: ...


class NullReporter:
    """Shows nothing: for tests, library use, and workers that are not rank 0."""

    def start(self, plan: dict) -> None:
        pass

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None:
        pass

    def epoch_end(self, record: dict) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def finish(self, record: dict) -> None:
        pass
