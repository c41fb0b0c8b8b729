"""A worker killed while it reports stops no other worker's report (launch/local.py `_Inbox`).

Found as a hung `make test`: an async job losing a worker at a random point (py-spy: every
surviving worker stuck exiting, its queue's feeder thread waiting for the write lock of the
queue all workers shared, which the killed worker had held). The worker below takes every
cross-process lock its reporting could hold, then is killed, as that worker was.
"""

import gc
import multiprocessing.queues
import os
import signal
import threading
import time

from dlscale.launch import local
from dlscale.launch.base import READY, Resources


def killed_holding_its_report_locks(context, payload):
    context.send(READY, context.rank)  # both READY: from then on worker 1 may be lost (no
    # rendezvous here; worker 1 waits half the payload before its locks, as the others send)
    if context.rank == 1:
        time.sleep(payload / 2)  # its READY on its way (a queue's feeder thread sends it)
        for thing in gc.get_objects():  # the reporting path's shared locks, if it has any
            if isinstance(thing, multiprocessing.queues.Queue) and thing._wlock is not None:
                thing._wlock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(payload)  # reports after its peer is gone
    context.send("progress", context.rank)
    return context.rank


class Recorded:
    """The launcher's start context, its processes kept to be stopped after the test."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.made = []

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def Process(self, *args, **kwargs):
        process = self._ctx.Process(*args, **kwargs)
        self.made.append(process)
        return process


def test_a_worker_killed_while_it_reports_stops_no_other_report(monkeypatch):
    ctx = Recorded(local.start_context())
    monkeypatch.setattr(local, "start_context", lambda: ctx)
    events, outcome = [], {}

    def run():
        try:
            outcome["results"] = launch()
        except BaseException as exc:  # told below, not lost in the thread
            outcome["error"] = exc

    def launch():
        return local.LocalLauncher().run(
            killed_holding_its_report_locks,
            1.0,
            2,
            Resources(cpus=1.0),
            on_event=lambda kind, args: events.append((kind, args)),
            expendable=frozenset({1}),
        )

    runner = threading.Thread(target=run, daemon=True)
    try:
        runner.start()
        runner.join(timeout=120)
        assert not runner.is_alive(), "the launcher still waits on the surviving worker"
        assert "error" not in outcome, outcome
        assert outcome["results"] == [0, None]  # worker 1 lost, worker 0's result in
        assert ("progress", (0,)) in events
        lost = f"worker 1 (pid {ctx.made[1].pid}) was killed by SIGKILL (out of memory, or killed)"
        assert ("warn", (f"{lost}; training continues without it",)) in events
    finally:
        for process in ctx.made:
            if process.pid is not None and process.is_alive():
                process.kill()
                process.join()
