"""A slot's reports reach the pool whatever another slot, or the pool's owner, is doing
(launch/pool.py, launch/processes.py `PipeReader`): the pool's part of tests/launch/test_reports.py.

On the code before PipeReader a slot stopped in the middle of a message held the pool in its
receive for good, a slot whose pipe carried bytes that are no message crashed the pool's wait
with an unpickling error, and a slot reporting while the owner did not call `wait` stopped once
its pipe was full. And a slot that died while a process it started held its pipe open must
still end its task (the pool noticed deaths by the process's sentinel before).
"""

import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dlscale.launch.base import Resources
from dlscale.launch.heartbeat import process_state
from dlscale.launch.pool import LocalPool

PIPE_BYTES = 64 * 1024  # Linux's default pipe buffer: a writer blocks once this much is unread


def wait_for(condition, guard_s: float = 60.0) -> bool:
    """Poll `condition` until it holds or the guard runs out (a hang's guard, not a timing)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stops_in_mid_message(context, folder):
    (Path(folder) / "pid").write_text(str(os.getpid()))
    with context.events.lock:  # as a send of 100 KB stopped after its first bytes
        os.write(context.events.conn.fileno(), struct.pack("!i", 100_000) + b"x" * 100)
        os.kill(os.getpid(), signal.SIGSTOP)
    return "never"


def after_the_stop(context, folder):
    assert wait_for((Path(folder) / "pid").exists), "the other task never got going"
    pid = int((Path(folder) / "pid").read_text())
    assert wait_for(lambda: process_state(pid) == "T"), "the other task never stopped"
    return "done"


def garbles_its_pipe(context, folder):
    with context.events.lock:
        for _ in range(2):
            os.write(context.events.conn.fileno(), struct.pack("!i", 8) + b"\x00garbage")
    return "read"


def whoami(context, payload):
    return os.getpid()


def floods_its_reports(context, folder):
    for _ in range(8 * PIPE_BYTES // 1024):
        context.send("progress", "x" * 1024)
    (Path(folder) / "sent").touch()
    return "sent"


def dies_leaving_its_pipe_open(context, folder):
    holder = subprocess.Popen(["sleep", "300"], pass_fds=(context.events.conn.fileno(),))
    (Path(folder) / "holder").write_text(str(holder.pid))
    os._exit(3)


def in_thread(work, guard_s: float = 120.0):
    """Run `work` on a thread: its value, or its error, or None if it still runs."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # told below, not lost in the thread
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=guard_s)
    return None if runner.is_alive() else outcome


@pytest.fixture
def pool():
    made = LocalPool(2, Resources(cpus=1.0))
    yield made
    made.close()


def test_a_slot_stopped_in_the_middle_of_a_message_holds_up_no_other(pool, tmp_path):
    pool.submit("stopped", stops_in_mid_message, str(tmp_path))
    pool.submit("other", after_the_stop, str(tmp_path))

    def until_the_other_ends():
        while True:
            for ended in pool.wait(0.2):
                return ended

    outcome = in_thread(until_the_other_ends)
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

    def until_it_ends():
        while True:
            for ended in pool.wait(0.2, lambda *event: events.append(event)):
                return ended

    outcome = in_thread(until_it_ends)
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
    assert wait_for((tmp_path / "sent").exists), "the slot waited on its pipe for the pool"
    progress, done = [], []

    def on_event(key, kind, args):
        if kind == "progress":
            progress.append(key)

    while not done:
        done = pool.wait(0.2, on_event)
    assert (done[0].key, done[0].ok, done[0].value) == ("flood", True, "sent")
    assert progress == ["flood"] * (8 * PIPE_BYTES // 1024)


def test_a_slot_dead_while_another_process_holds_its_pipe_ends_its_task(pool, tmp_path):
    pool.submit("dead", dies_leaving_its_pipe_open, str(tmp_path))

    def until_it_ends():
        while True:
            for ended in pool.wait(0.2):
                return ended

    try:
        outcome = in_thread(until_it_ends)
    finally:
        holder = tmp_path / "holder"
        if holder.exists():
            os.kill(int(holder.read_text()), signal.SIGKILL)
    # Judged by its exit once PIPE_END_GRACE_S passed without its pipe's end: not waited on.
    assert outcome is not None, "the pool waits for a pipe a live process holds"
    assert "error" not in outcome, outcome
    ended = outcome["value"]
    assert (ended.key, ended.ok, ended.value) == ("dead", False, "process exited with code 3")
