"""A Ctrl-C or SIGTERM that lands while the launcher is still starting its workers: the ones
already started are stopped with the launcher's unwinding, not left running until it exits."""

import time

import pytest

from dlscale.launch import local
from dlscale.launch.base import Resources


def sleep_long(context, payload):
    time.sleep(payload)


PROCESS = local.start_context().Process  # the launcher's kind of process


class StoppedBeforeStart(PROCESS):
    """A process whose start is cut short by a Ctrl-C (a signal landing while the forkserver
    answers); module-level, as the forkserver pickles the process it starts."""

    def start(self):
        raise KeyboardInterrupt


class StoppedAfterStart(PROCESS):
    """A process that started, then a Ctrl-C before the launcher's next line."""

    def start(self):
        super().start()
        raise KeyboardInterrupt


class SecondStartInterrupted:
    """The launcher's start context, except that the second process it makes is `second`."""

    def __init__(self, ctx, second: type):
        self._ctx = ctx
        self.second = second
        self.made = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def Process(self, *args, **kwargs):
        kind = self.second if len(self.made) == 1 else self._ctx.Process
        process = kind(*args, **kwargs)
        self.made.append(process)
        return process


@pytest.mark.parametrize("second", [StoppedBeforeStart, StoppedAfterStart], ids=["before", "after"])
def test_workers_started_before_a_ctrl_c_are_stopped_with_the_launcher(monkeypatch, second):
    ctx = SecondStartInterrupted(local.start_context(), second)
    monkeypatch.setattr(local, "start_context", lambda: ctx)
    launcher = local.LocalLauncher()
    try:
        with pytest.raises(KeyboardInterrupt):
            launcher.run(sleep_long, 120, 2, Resources(cpus=1.0))
        started = [process for process in ctx.made if process.pid is not None]
        assert len(started) == (2 if second is StoppedAfterStart else 1)
        assert not any(process.is_alive() for process in started), "a worker outlived it"
    finally:
        for process in ctx.made:
            if process.pid is not None and process.is_alive():
                process.kill()
                process.join()
