"""A Ctrl-C or SIGTERM that lands while the launcher is still starting its workers: the ones
already started are stopped with the launcher's unwinding, not left running until it exits."""

import time

import pytest

from dlscale.launch import local
from dlscale.launch.base import Resources


def sleep_long(context, payload):
    time.sleep(payload)


class SecondStartInterrupted:
    """The launcher's start context, except that starting the second process raises
    KeyboardInterrupt (as a signal landing while the forkserver answers does)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.made = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def Process(self, *args, **kwargs):
        process = self._ctx.Process(*args, **kwargs)
        self.made.append(process)
        if len(self.made) == 2:

            def interrupted():
                raise KeyboardInterrupt

            process.start = interrupted
        return process


def test_workers_started_before_a_ctrl_c_are_stopped_with_the_launcher(monkeypatch):
    ctx = SecondStartInterrupted(local.start_context())
    monkeypatch.setattr(local, "start_context", lambda: ctx)
    launcher = local.LocalLauncher()
    try:
        with pytest.raises(KeyboardInterrupt):
            launcher.run(sleep_long, 120, 2, Resources(cpus=1.0))
        first = ctx.made[0]
        assert first.pid is not None  # it had started
        assert not first.is_alive(), "worker 0 outlived the interrupted launch"
    finally:
        for process in ctx.made:
            if process.pid is not None and process.is_alive():
                process.kill()
                process.join()
