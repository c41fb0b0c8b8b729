"""Heartbeats: every worker beats once a second; the launcher names the one that falls silent.

A worker that is stopped (SIGSTOP, a frozen VM, a node swapping to death) neither exits nor
fails, so the launcher cannot see it, and its peers wait in a collective until that times out and
then fail themselves: the error blamed a healthy worker. A thread in each worker sends a beat;
it runs whatever the training loop is doing (torch releases the GIL in its ops, including the
collectives), so a worker falls silent for long only when its process does not run. The
launcher warns while the others wait and, when the job then fails, names the silent worker first.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from dlscale.launch.base import READY, EventHandler, WorkerContext, WorkerFailed

HEARTBEAT = "heartbeat"  # the event a worker sends every BEAT_INTERVAL_S: (rank,)
BEAT_INTERVAL_S = 1.0


def start_beating(context: WorkerContext, orphan_after_s: float | None = None) -> None:
    """In a worker: send a heartbeat every BEAT_INTERVAL_S until the process ends.

    With `orphan_after_s` (a worker on another host, whose launcher cannot reap it when the
    link between them is down), a worker whose beats have not got through for that long ends
    itself: cut off from its job, it would otherwise train on alone.
    """
    if context.events is None:
        return
    delivered = [time.monotonic()]

    def beat() -> None:
        while True:
            try:
                context.send(HEARTBEAT, context.rank)
            except Exception:  # the channel is gone: the job is over
                if orphan_after_s is not None:
                    orphaned(orphan_after_s)
                return
            delivered[0] = time.monotonic()
            time.sleep(BEAT_INTERVAL_S)

    def watch() -> None:
        while time.monotonic() - delivered[0] < orphan_after_s:
            time.sleep(BEAT_INTERVAL_S)
        orphaned(orphan_after_s)

    threading.Thread(target=beat, daemon=True, name="dlscale-heartbeat").start()
    if orphan_after_s is not None:
        threading.Thread(target=watch, daemon=True, name="dlscale-orphan-watch").start()


def orphaned(after_s: float) -> None:
    """End this worker process at once: its job cannot hear from it."""
    sys.stderr.write(f"dlscale worker: no heartbeat got through for {after_s:g} s; exiting\n")
    sys.stderr.flush()
    os._exit(1)


def process_state(pid: int | None) -> str | None:
    """The kernel's one-letter state of a local process ('T': stopped); None if unknown."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]  # the name, in parentheses, may hold spaces


class Silence:
    """The parent's view of the beats: who is silent, since when; says so once per silence.

    A worker counts as silent after `warn_after_s` without a beat once it has reported READY:
    before, it imports and builds, and on a loaded machine an import that runs Python for
    seconds starved the beating thread of its turn for over 2 s (measured, 9 busy processes on
    2 cores). Before READY only a stopped process counts. `pids` are the workers' local process
    ids, or None where a process is not on this machine (Ray): a local one is looked up in /proc
    to say whether the kernel holds it stopped.
    """

    def __init__(
        self,
        size: int,
        warn_after_s: float,
        pids: list[int | None] | None = None,
        where: list[str] | None = None,
        label: str = "worker",
    ):
        self.warn_after_s = warn_after_s
        self.pids = pids or [None] * size
        self.where = where  # each rank's host, where the launcher knows it (Ray)
        self.label = label  # what a rank is called: a job's worker, a pool's slot
        self.started = time.monotonic()
        self.last_beat: dict[int, float] = {}
        self.ready: set[int] = set()
        self.warned: dict[int, float | None] = {}  # rank: its last beat when the user was told

    def watch(self, on_event: EventHandler | None) -> EventHandler:
        """`on_event`, with the heartbeats taken out and recorded (READY is noted, and passed)."""

        def handle(kind: str, args: tuple) -> None:
            if kind == HEARTBEAT:
                self.last_beat[args[0]] = time.monotonic()
                return
            if kind == READY:
                self.ready.add(args[0])
            if on_event is not None:
                on_event(kind, args)

        return handle

    def restart(self, rank: int, pid: int | None) -> None:
        """`rank` begins anew (a pool slot's next task, maybe in a new process `pid`): silent
        from now, not ready, not warned about."""
        self.pids[rank] = pid
        self.last_beat[rank] = time.monotonic()
        self.ready.discard(rank)
        self.warned.pop(rank, None)

    def silent_s(self, rank: int) -> float:
        """Seconds since `rank`'s last beat, or since the launch if it has sent none."""
        return time.monotonic() - self.last_beat.get(rank, self.started)

    def stopped(self, rank: int) -> bool:
        return process_state(self.pids[rank]) == "T"

    def suspect(self, rank: int) -> bool:
        """Silent for `warn_after_s` past its start, or stopped (the /proc read only then)."""
        if self.silent_s(rank) < self.warn_after_s:
            return False
        return rank in self.ready or self.stopped(rank)

    def check(self, running, on_event: EventHandler | None) -> None:
        """Warn once about each running worker gone silent, and again when it beats once more
        (the user may have resumed it)."""
        for rank in running:
            if rank in self.warned:
                if self.last_beat.get(rank) != self.warned[rank]:
                    del self.warned[rank]
                    say(on_event, f"{self.label} {rank} sends heartbeats again")
            elif self.suspect(rank):
                self.warned[rank] = self.last_beat.get(rank)
                say(on_event, f"waiting for {self.describe(rank)}: {self.why(rank)}")

    def blame(self, failure: str, failed_rank: int, running) -> WorkerFailed | None:
        """When `failed_rank` failed (`failure`: its one line) while a peer was stopped or silent,
        the peer is the cause (the failure is a wait for it that timed out): name it first.
        None when no running peer is."""
        for rank in running:
            if rank != failed_rank and (self.stopped(rank) or self.suspect(rank)):
                return WorkerFailed(
                    f"{self.describe(rank)} stopped responding: {self.why(rank, hint=False)}; "
                    f"then {failure}"
                )
        return None

    def describe(self, rank: int) -> str:
        pid = self.pids[rank]
        if self.where is not None:
            return f"{self.label} {rank} on {self.where[rank]}"
        return f"{self.label} {rank}" if pid is None else f"{self.label} {rank} (pid {pid})"

    def why(self, rank: int, hint: bool = True) -> str:
        """How long it is silent and, for a local process the kernel stopped, that it is; with
        `hint`, how to resume it (pointless once the job has failed and stops it)."""
        silent_s = self.silent_s(rank)
        if rank in self.last_beat:
            said = f"no heartbeat for {silent_s:.0f} s"
        else:
            said = f"no heartbeat in the {silent_s:.0f} s since it started"
        if self.stopped(rank):
            pid = self.pids[rank]
            resume = f" `kill -CONT {pid}` resumes it" if hint else ""
            said += f", its process is stopped (SIGSTOP?{resume})"
        return said


def say(on_event: EventHandler | None, message: str) -> None:
    if on_event is not None:
        on_event("warn", (message,))
