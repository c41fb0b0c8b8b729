"""A worker's reports reach the launcher whatever another worker, or the launcher, is doing
(launch/local.py `_Inbox`, launch/processes.py `PipeReader`).

Found as a hung `make test`: an async job losing a worker at a random point (py-spy: every
surviving worker stuck exiting, its queue's feeder thread waiting for the write lock of the
queue all workers shared, which the killed worker had held). The first worker below takes every
cross-process lock its reporting could hold, then is killed, as that worker was. The others
come from the review of the fix: a worker stopped in the middle of a message, one whose pipe
carries bytes that are no message, and a launcher busy elsewhere (its output paused) while a
worker reports a lot.
"""

import gc
import multiprocessing.queues
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlscale.launch import local
from dlscale.launch.base import READY, Resources, WorkerFailed
from dlscale.launch.processes import PIPE_END_GRACE_S, PipeEnd
from tests.launch import pipe_faults as faults


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
            outcome["value"] = launch()
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
        assert outcome["value"] == [0, None]  # worker 1 lost, worker 0's result in
        assert ("progress", (0,)) in events
        lost = f"worker 1 (pid {ctx.made[1].pid}) was killed by SIGKILL (out of memory, or killed)"
        assert ("warn", (f"{lost}; training continues without it",)) in events
    finally:
        for process in ctx.made:
            if process.pid is not None and process.is_alive():
                process.kill()
                process.join()


def launch_in_thread(fn, payload, workers, events, expendable=frozenset()):
    """Run the launcher on a thread: {"value": results} or {"error": …}, None if it still runs."""
    return faults.in_thread(
        lambda: local.LocalLauncher().run(
            fn,
            payload,
            workers,
            Resources(cpus=1.0),
            on_event=lambda kind, args: events.append((kind, args)),
            expendable=expendable,
        )
    )


@pytest.fixture
def recorded(monkeypatch):
    ctx = Recorded(local.start_context())
    monkeypatch.setattr(local, "start_context", lambda: ctx)
    yield ctx
    for process in ctx.made:
        if process.pid is not None and process.is_alive():
            process.kill()
            process.join()


def stopped_in_mid_message(context, folder):
    """Worker 1 sends the start of a long message and stops (SIGSTOP) before its end; worker 0
    reports once worker 1 is stopped."""
    context.send(READY, context.rank)
    if context.rank == 1:
        faults.stop_in_mid_message(context, folder)
        return 1
    faults.wait_until_stopped(folder)
    context.send("progress", context.rank)
    return 0


def test_a_worker_stopped_in_the_middle_of_a_message_holds_up_no_other(
    recorded, monkeypatch, tmp_path
):
    monkeypatch.setattr(local, "RESULT_GRACE_S", 3.0)  # worker 1 is left behind after this
    events = []
    outcome = launch_in_thread(stopped_in_mid_message, str(tmp_path), 2, events, {1})
    # On the code before PipeReader the launcher sat in worker 1's recv for good.
    assert outcome is not None, "the launcher still waits in the stopped worker's message"
    assert "error" not in outcome, outcome
    assert outcome["value"] == [0, None]
    assert ("progress", (0,)) in events
    lost = "worker 1 did not finish within 3 s of the others; training continues without it"
    assert ("warn", (lost,)) in events


def garbles_its_pipe(context, folder):
    """Worker 1 writes two framed messages that are no pickle, then goes on to its events and
    result."""
    if context.rank == 1:
        faults.garble(context)
    context.send("progress", context.rank)
    return context.rank


def test_a_garbled_report_is_named_and_skipped(recorded, tmp_path):
    events = []
    outcome = launch_in_thread(garbles_its_pipe, str(tmp_path), 2, events)
    assert outcome is not None and "error" not in outcome, outcome
    assert outcome["value"] == [0, 1]  # worker 1's result, sent after the garbage, read
    assert ("progress", (1,)) in events
    warnings = [args[0] for kind, args in events if kind == "warn"]
    assert len(warnings) == 1, events  # once per worker; the code before said nothing
    assert warnings[0].startswith("worker 1 sent a report that cannot be read (UnpicklingError: ")
    assert warnings[0].endswith("); skipped")


def floods_its_reports(context, folder):
    """Worker 0 says it begins; once the launcher is busy, sends eight pipes' worth of events,
    then says it got past them."""
    folder = Path(folder)
    context.send("begin", context.rank)
    assert faults.wait_for((folder / "busy").exists), "the launcher never took the first event"
    for _ in range(8 * faults.PIPE_BYTES // 1024):
        context.send("progress", "x" * 1024)
    (folder / "sent").touch()
    return context.rank


def test_a_launcher_busy_elsewhere_does_not_stop_a_worker_that_reports(recorded, tmp_path):
    """The launcher's own work (here its event handler, as one printing to a paused terminal)
    blocks until the worker has sent all its events: on the code before PipeReader the worker
    waited on its full pipe for the launcher, which waited for it."""
    got_past, events = [], []

    def on_event(kind, args):
        if kind == "begin":
            (tmp_path / "busy").touch()
            got_past.append(faults.wait_for((tmp_path / "sent").exists))
        events.append((kind, args))

    outcome = faults.in_thread(
        lambda: local.LocalLauncher().run(
            floods_its_reports, str(tmp_path), 1, Resources(cpus=1.0), on_event=on_event
        ),
        guard_s=180,
    )
    assert got_past == [True], "the worker waited on its pipe while the launcher was busy"
    assert outcome == {"value": [0]}
    assert sum(kind == "progress" for kind, _ in events) == 8 * faults.PIPE_BYTES // 1024


def test_a_worker_dead_while_another_process_holds_its_pipe_is_named(recorded, tmp_path):
    events = []
    try:
        outcome = launch_in_thread(faults.die_leaving_the_pipe_open, str(tmp_path), 1, events)
    finally:
        faults.kill_holder(tmp_path)
    # Judged by its exit once PIPE_END_GRACE_S passed without its pipe's end: not waited on.
    assert outcome is not None, "the launcher waits for a pipe a live process holds"
    assert isinstance(outcome.get("error"), WorkerFailed), outcome
    pid = recorded.made[0].pid
    assert str(outcome["error"]) == f"worker 0 (pid {pid}) exited with code 3"


def test_an_exit_code_waits_for_the_reports_sent_before_it():
    """A worker's failure report, sent just before it exits, is taken in before its exit code
    is: else the launcher said "exited with code 1" instead of the worker's error."""
    inbox = local._Inbox()
    worker = local._Reported(SimpleNamespace(exitcode=1, pid=7), 0, inbox)
    assert worker.exitcode is None  # nothing read yet: its report may still be in the pipe
    inbox._sort(0, ("result", ("error", 0, ("ValueError: x", "trace"))))
    inbox._sort(0, PipeEnd())
    assert worker.exitcode is None  # its report waits to be acted on
    assert inbox.results.popleft()[0] == "error"
    assert worker.exitcode == 1
    held = local._Reported(SimpleNamespace(exitcode=-9, pid=8), 1, inbox)
    assert held.exitcode is None
    held.watch.exited -= PIPE_END_GRACE_S + 1  # its pipe held open by a process it forked
    assert held.exitcode == -9
