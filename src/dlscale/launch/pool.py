"""LocalPool: independent tasks (sweep trials) on long-lived slot processes of this machine.

Each slot is one process, pinned to its own share of the cores (and its own GPUs), that imports
torch once and then runs task after task sent down its pipe: a trial starts in milliseconds
instead of the seconds a fresh process takes (on the 2-core development machine a fresh
trial process spent 3.5–6.5 s setting up for 0.14 s of training). What a task leaves in its
process (a sweep trial: the data it read, data/cache.py) is there for the slot's next task.

A task that raises fails alone, and its slot process is replaced before the next task (the
failure may have left it in any state). One that kills its process (a crash, SIGKILL, running
out of memory) fails alone too, and so does one that is cancelled (its process is stopped):
the slot starts a fresh process for its next task.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from dlscale.errors import UserError, one_line
from dlscale.launch.base import (
    HEARTBEAT_WARN_S,
    WORKER_EXIT_GRACE_S,
    Resources,
    TaskDone,
    WorkerContext,
    WorkerFn,
)
from dlscale.launch.heartbeat import BEAT_INTERVAL_S, HEARTBEAT, Silence
from dlscale.launch.processes import (
    LOOPBACK,
    PipeChannel,
    available_cores,
    describe_exit,
    die_with_parent,
    stop_processes,
    thread_env,
)
from dlscale.launch.start import adopt, environment
from dlscale.launch.start import context as start_context
from dlscale.signals import end_by_signal, stop_on_sigterm

TASK_STARTED = "start"  # a sweep trial's first event: its training set up (train/reporter.py)


def _beat(channel: PipeChannel, busy: threading.Event, index: int) -> None:
    """The slot's heartbeat while a task runs, as a launcher's workers beat (launch/heartbeat.py):
    a slot that stops (SIGSTOP) is named while the sweep waits for it."""
    while True:
        time.sleep(BEAT_INTERVAL_S)
        if busy.is_set():
            try:
                channel.put((HEARTBEAT, (index,)))
            except (OSError, ValueError):  # the pipe is gone: so is the pool
                return


def _slot_main(conn, index: int, parent_pid: int, threads: int, cores, gpu, env: dict) -> None:
    """A slot process: its cores and threads once, then each task sent to it, until told to
    stop (None) or its pipe closes. A task's result goes back with when it began and ended."""
    adopt(env)
    die_with_parent(parent_pid)
    # Ctrl-C at a terminal reaches the whole process group: the pool's owner alone decides
    # what stops (it stops the slots), so a task never reports the interrupt as its failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    os.environ["DLSCALE_CPUS"] = str(threads)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    import torch

    torch.set_num_threads(threads)
    channel = PipeChannel(conn)
    busy = threading.Event()  # a task runs: the slot beats (an idle one's pipe is unread)
    beat = threading.Thread(target=_beat, args=(channel, busy, index), daemon=True)
    beat.name = "dlscale-beat"
    beat.start()
    # A cancelled task (pruned, or its sweep stopped) unwinds: no half-written checkpoint stays.
    stop_on_sigterm()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):  # stopped between two tasks: nothing to undo
            return
        if message is None:
            return
        fn, payload = message
        began = time.time()
        context = WorkerContext(0, 1, 0, LOOPBACK, 0, channel, socket.gethostname())
        busy.set()
        try:
            result = fn(context, payload)
            busy.clear()
            channel.send(("ok", result, (began, time.time())))
        except UserError as exc:
            busy.clear()
            channel.send(("failed", str(exc), (began, time.time())))
            return  # a fresh process for the next task
        except KeyboardInterrupt as stop:  # cancelled: the pool knows, and nothing failed
            end_by_signal(stop)
        except BaseException as exc:
            busy.clear()
            channel.send(("failed", f"{type(exc).__name__}: {one_line(exc)}", (began, time.time())))
            traceback.print_exc()
            raise SystemExit(1) from None


@dataclass
class _Slot:
    index: int
    cores: list[int] | None
    process: Any = None
    conn: Any = None
    key: str | None = None  # the task it runs now

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


class LocalPool:
    """Up to `slots` tasks at once, each on its slot's long-lived process and share of the
    cores; each ended task says which slot ran it, and when."""

    def __init__(self, slots: int, resources: Resources):
        self.slots = slots
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.threads = max(1, len(cores) // slots) if cores else max(1, available_cores() // slots)
        shares = [
            cores[i * self.threads : (i + 1) * self.threads] if len(cores) >= slots else None
            for i in range(slots)
        ]
        if os.environ.get("DLSCALE_PIN", "1") == "0":
            shares = [None] * slots
        self.gpus_per_task = math.ceil(resources.gpus)
        self._slots = [_Slot(i, shares[i]) for i in range(slots)]
        self.silence = Silence(slots, HEARTBEAT_WARN_S, label="slot")
        self.started = 0  # slot processes started, replacements included
        self.ctx = start_context()

    @property
    def running(self) -> list[str]:
        return [slot.key for slot in self._slots if slot.key is not None]

    def submit(self, key: str, fn: WorkerFn, payload: Any) -> None:
        slot = next((s for s in self._slots if s.key is None), None)
        if slot is None:
            raise RuntimeError(f"pool of {self.slots} is full; task {key} cannot start")
        if not slot.alive():
            self._start(slot)
        slot.conn.send((fn, payload))
        slot.key = key
        self.silence.restart(slot.index, slot.process.pid)

    def _start(self, slot: _Slot) -> None:
        self._retire(slot)
        ours, theirs = self.ctx.Pipe(duplex=True)
        process = None
        try:  # a stop anywhere in here (the forkserver answering, say) leaves the slot empty
            with thread_env(self.threads):
                process = self.ctx.Process(
                    target=_slot_main,
                    args=(
                        theirs,
                        slot.index,
                        os.getpid(),
                        self.threads,
                        slot.cores,
                        self._gpus(slot.index),
                        environment(),
                    ),
                    name=f"dlscale-slot-{slot.index}",
                )
                process.start()
            theirs.close()  # the child holds its end; EOF here means it is gone
            slot.process, slot.conn = process, ours
        except BaseException:
            if process is not None:
                stop_processes([process])  # only if it started
            ours.close()
            theirs.close()
            raise
        self.started += 1

    def _gpus(self, index: int) -> str | None:
        """CUDA_VISIBLE_DEVICES for the slot: its own GPUs, or None on CPU."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs this process may use
        ids = visible.split(",") if visible else [str(i) for i in range(64)]
        first = index * self.gpus_per_task
        return ",".join(ids[first : first + self.gpus_per_task]) or None

    def wait(self, timeout: float, on_event=None) -> list[TaskDone]:
        busy = [slot for slot in self._slots if slot.key is not None]
        handles = {}
        for slot in busy:
            handles[slot.conn] = handles[slot.process.sentinel] = slot
        ready = mp_connection.wait(list(handles), timeout) if handles else []
        done: list[TaskDone] = []
        for slot in {id(handles[h]): handles[h] for h in ready}.values():
            ended = self._drain(slot, on_event)
            if ended is None and not slot.process.is_alive():
                slot.process.join()
                ended = TaskDone(slot.key, False, f"process {describe_exit(slot.process.exitcode)}")
                self._retire(slot)
            if ended is not None:
                done.append(ended)
                slot.key = None
        for slot in busy:
            if slot.key is not None:
                self.silence.check([slot.index], self._forward(slot, on_event))
        return done

    def _forward(self, slot: _Slot, on_event):
        """The slot's events as the pool's caller takes them (with the task's key); its beats
        kept here. Its task's first event ('start': set up, about to train) counts as READY:
        from then on a silence is suspect, before it only a stopped process (Silence)."""

        def forward(kind: str, args: tuple) -> None:
            if kind == TASK_STARTED:
                self.silence.ready.add(slot.index)
            if on_event is not None:
                on_event(slot.key, kind, args)

        return self.silence.watch(forward)

    def _drain(self, slot: _Slot, on_event) -> TaskDone | None:
        """Hand over the slot's events; its task's end, if it has come."""
        forward = self._forward(slot, on_event)
        while _poll(slot.conn):
            try:
                message = slot.conn.recv()
            except (EOFError, OSError):
                return None
            if message[0] == "event":
                forward(*message[1])
                continue
            status, value, (began, ended) = message
            if status != "ok":  # the process leaves after a failure: the next task gets a new one
                slot.process.join(timeout=WORKER_EXIT_GRACE_S)
                self._retire(slot)
            return TaskDone(slot.key, status == "ok", value, slot.index, began, ended)
        return None

    def cancel(self, key: str) -> None:
        for slot in self._slots:
            if slot.key == key:
                self._retire(slot)
                slot.key = None

    def close(self) -> None:
        for slot in self._slots:
            if slot.alive() and slot.key is None:
                with contextlib.suppress(OSError):
                    slot.conn.send(None)  # an idle slot leaves by itself
        for slot in self._slots:
            self._retire(slot)
            slot.key = None

    def _retire(self, slot: _Slot) -> None:
        """Stop the slot's process (if any) and forget it."""
        if slot.process is not None:
            slot.process.join(timeout=0.0)
            if slot.process.is_alive():
                if slot.key is None:
                    slot.process.join(timeout=WORKER_EXIT_GRACE_S)
                stop_processes([slot.process])
            slot.conn.close()
        slot.process = slot.conn = None


def _poll(conn) -> bool:
    try:
        return conn.poll()
    except (EOFError, OSError):
        return False
