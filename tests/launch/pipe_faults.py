"""What the report-pipe tests of the launcher (test_reports.py) and of the sweep pool
(tests/sweep/test_pool_reports.py) share: a hang's guards, and the faults a worker or slot
process does to its own report pipe (`context.events`, a PipeChannel)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

PIPE_BYTES = 64 * 1024  # Linux's default pipe buffer: a writer blocks once this much is unread


def wait_for(condition, guard_s: float = 60.0) -> bool:
    """Poll `condition` until it holds or the guard runs out (a hang's guard, not a timing)."""
    deadline = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def in_thread(work, guard_s: float = 120.0) -> dict | None:
    """Run `work` on a thread: {"value": …} or {"error": …}, or None if it still runs."""
    outcome = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # told by the caller, not lost in the thread
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=guard_s)
    return None if runner.is_alive() else outcome


def stop_in_mid_message(context, folder) -> None:
    """Write the start of a 100 KB message, say this process's pid in `folder`, and stop
    (SIGSTOP) before the message's end."""
    (Path(folder) / "pid").write_text(str(os.getpid()))
    with context.events.lock:
        os.write(context.events.conn.fileno(), struct.pack("!i", 100_000) + b"x" * 100)
        os.kill(os.getpid(), signal.SIGSTOP)


def wait_until_stopped(folder) -> None:
    """Until the process `stop_in_mid_message` names is stopped."""
    from dlscale.launch.heartbeat import process_state

    assert wait_for((Path(folder) / "pid").exists), "the other process never got going"
    pid = int((Path(folder) / "pid").read_text())
    assert wait_for(lambda: process_state(pid) == "T"), "the other process never stopped"


def garble(context, times: int = 2) -> None:
    """Write framed messages whose bytes are no pickle."""
    with context.events.lock:
        for _ in range(times):
            os.write(context.events.conn.fileno(), struct.pack("!i", 8) + b"\x00garbage")


def die_leaving_the_pipe_open(context, folder) -> None:
    """Start a process that holds the report pipe open (as a data loader's worker it forked
    would), say its pid in `folder`, and die with exit code 3, reporting nothing."""
    holder = subprocess.Popen(["sleep", "300"], pass_fds=(context.events.conn.fileno(),))
    (Path(folder) / "holder").write_text(str(holder.pid))
    os._exit(3)


def kill_holder(folder) -> None:
    holder = Path(folder) / "holder"
    if holder.exists():
        os.kill(int(holder.read_text()), signal.SIGKILL)
