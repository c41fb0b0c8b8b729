"""A slot's reports reach the pool whatever another slot, or the pool's owner, is doing
(launch/pool.py, launch/processes.py `PipeReader`): the pool's part of tests/launch/test_reports.py.

On the code before PipeReader a slot stopped in the middle of a message held the pool in its
receive for good, a slot whose pipe carried bytes that are no message crashed the pool's wait
with an unpickling error, and a slot reporting while the owner did not call `wait` stopped once
its pipe was full. And a slot that died while a process it started held its pipe open must
still end its task (the pool noticed deaths by the process's sentinel before).
"""

import contextlib
import os
from pathlib import Path

import pytest

from dlscale.launch.base import Resources
from dlscale.launch.pool import LocalPool
from tests.launch import pipe_faults as faults


def stops_in_mid_message(context, folder):
    faults.stop_in_mid_message(context, folder)
    return "never"


def after_the_stop(context, folder):
    faults.wait_until_stopped(folder)
    return "done"


def garbles_its_pipe(context, folder):
    faults.garble(context)
    return "read"


def whoami(context, payload):
    return os.getpid()


def floods_its_reports(context, folder):
    for _ in range(8 * faults.PIPE_BYTES // 1024):
        context.send("progress", "x" * 1024)
    (Path(folder) / "sent").touch()
    return "sent"


def dies_leaving_its_pipe_open(context, folder):
    faults.die_leaving_the_pipe_open(context, folder)


def until_one_ends(pool: LocalPool, on_event=None):
    """Wait on the pool until a task ends: its TaskDone."""
    while True:
        for ended in pool.wait(0.2, on_event):
            return ended


@pytest.fixture
def pool():
    with contextlib.closing(LocalPool(2, Resources(cpus=1.0))) as made:
        yield made


def test_a_slot_stopped_in_the_middle_of_a_message_holds_up_no_other(pool, tmp_path):
    pool.submit("stopped", stops_in_mid_message, str(tmp_path))
    pool.submit("other", after_the_stop, str(tmp_path))

    outcome = faults.in_thread(lambda: until_one_ends(pool))
    assert outcome is not None, "the pool still waits in the stopped slot's message"
    assert "error" not in outcome, outcome
    ended = outcome["value"]
    assert (ended.key, ended.ok, ended.value) == ("other", True, "done")
    assert pool.running == ["stopped"]
    pool.cancel("stopped")  # a stopped process is stopped for good all the same
    assert pool.running == []


def test_a_garbled_report_is_named_and_skipped(pool, tmp_path):
    pool.submit("garbled", garbles_its_pipe, str(tmp_path))
    events = []

    outcome = faults.in_thread(lambda: until_one_ends(pool, lambda *event: events.append(event)))
    # The code before crashed the pool's wait with the unpickling error.
    assert outcome is not None and "error" not in outcome, outcome
    ended = outcome["value"]
    assert (ended.key, ended.ok, ended.value) == ("garbled", True, "read")
    warnings = [(key, args[0]) for key, kind, args in events if kind == "warn"]
    assert len(warnings) == 1, events  # once per process
    assert warnings[0][0] == "garbled"
    assert warnings[0][1].startswith("the task sent a report that cannot be read (Unpickling")


def test_a_slot_reports_on_while_its_owner_does_not_wait(pool, tmp_path):
    pool.submit("flood", floods_its_reports, str(tmp_path))
    assert faults.wait_for((tmp_path / "sent").exists), "the slot waited on its pipe for the pool"
    progress, done = [], []

    def on_event(key, kind, args):
        if kind == "progress":
            progress.append(key)

    while not done:
        done = pool.wait(0.2, on_event)
    assert (done[0].key, done[0].ok, done[0].value) == ("flood", True, "sent")
    assert progress == ["flood"] * (8 * faults.PIPE_BYTES // 1024)


def test_a_slot_dead_while_another_process_holds_its_pipe_ends_its_task(pool, tmp_path):
    pool.submit("dead", dies_leaving_its_pipe_open, str(tmp_path))

    try:
        outcome = faults.in_thread(lambda: until_one_ends(pool))
    finally:
        faults.kill_holder(tmp_path)
    # Judged by its exit once PIPE_END_GRACE_S passed without its pipe's end: not waited on.
    assert outcome is not None, "the pool waits for a pipe a live process holds"
    assert "error" not in outcome, outcome
    ended = outcome["value"]
    assert (ended.key, ended.ok, ended.value) == ("dead", False, "process exited with code 3")
