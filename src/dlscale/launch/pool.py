"""LocalPool: independent tasks (sweep trials) on long-lived slot processes of this machine.

Each slot is one process, pinned to its own share of the cores (and its own GPUs), that imports
torch once and then runs task after task sent down its pipe: a trial starts in milliseconds
instead of the seconds a fresh process takes (on the 2-core development machine a fresh
trial process spent 3.5–6.5 s setting up for 0.14 s of training). What a task leaves in its
process (a sweep trial: the data it read, data/cache.py) is there for the slot's next task.

A task that raises fails alone, and its slot process is replaced before the next task (the
failure may have left it in any state). One that kills its process (a crash, SIGKILL, running
out of memory) fails alone too, and so does one that is cancelled (its process is stopped):
the slot starts a fresh process for its next task. A task's events and result come back on a
pipe of the slot's own, read on a thread of its own (`PipeReader`): a slot stopped mid-message
holds up no other, a report that cannot be read is named and skipped, and a slot never waits
for its owner to call `wait`. A process that dies while one it started holds that pipe open
ends its task PIPE_END_GRACE_S later, by its exit code.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
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
    ExitWatch,
    PipeChannel,
    PipeEnd,
    PipeReader,
    Unreadable,
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


def _slot_main(
    tasks, reports, index: int, parent_pid: int, threads: int, cores, gpu, env: dict
) -> None:
    """A slot process: its cores and threads once, then each task sent down `tasks`, until told
    to stop (None) or that pipe closes. A task's events, and its result with when it began and
    ended, go up `reports`."""
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
    channel = PipeChannel(reports)
    busy = threading.Event()  # a task runs: the slot beats (an idle one is not watched)
    beat = threading.Thread(target=_beat, args=(channel, busy, index), daemon=True)
    beat.name = "dlscale-beat"
    beat.start()
    # A cancelled task (pruned, or its sweep stopped) unwinds: no half-written checkpoint stays.
    stop_on_sigterm()
    while True:
        try:
            message = tasks.recv()
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
    tasks: Any = None  # the pipe its tasks go down; its reports come up another (`_start`)
    key: str | None = None  # the task it runs now
    generation: int = 0  # its processes started: a retired one's last reports are ignored
    watch: Any = None  # its process's ExitWatch
    garbled: bool = False  # its process sent a report that did not unpickle (said once)

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
        # Every slot's reports, each slot's pipe read on its own thread: ((index, generation),
        # message), a PipeEnd last.
        self.arrived: queue.Queue = queue.Queue()

    @property
    def running(self) -> list[str]:
        return [slot.key for slot in self._slots if slot.key is not None]

    def submit(self, key: str, fn: WorkerFn, payload: Any) -> None:
        slot = next((s for s in self._slots if s.key is None), None)
        if slot is None:
            raise RuntimeError(f"pool of {self.slots} is full; task {key} cannot start")
        if not slot.alive():
            self._start(slot)
        slot.tasks.send((fn, payload))
        slot.key = key
        self.silence.restart(slot.index, slot.process.pid)

    def _start(self, slot: _Slot) -> None:
        self._retire(slot)
        tasks_in, tasks_out = self.ctx.Pipe(duplex=False)
        reports_in, reports_out = self.ctx.Pipe(duplex=False)
        process = reader = None
        try:  # a stop anywhere in here (the forkserver answering, say) leaves the slot empty
            with thread_env(self.threads):
                process = self.ctx.Process(
                    target=_slot_main,
                    args=(
                        tasks_in,
                        reports_out,
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
            tasks_in.close()  # the child holds these ends: its reports' pipe ends when it does
            reports_out.close()
            slot.generation += 1
            slot.process, slot.tasks = process, tasks_out
            slot.watch, slot.garbled = ExitWatch(process), False
            reader = PipeReader(reports_in, (slot.index, slot.generation), self.arrived)
        except BaseException:
            slot.process = slot.tasks = None
            if process is not None:
                stop_processes([process])  # only if it started
            # Closing twice does nothing; a reader already running closes its own end.
            for conn in (tasks_in, tasks_out, reports_out) + (() if reader else (reports_in,)):
                conn.close()
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
        done: list[TaskDone] = []
        for (index, generation), message in self._arrivals(timeout if busy else 0.0):
            slot = self._slots[index]
            if slot.key is None or generation != slot.generation:
                continue  # an idle slot's end, or a retired process's last words
            ended = self._take(slot, message, on_event)
            if ended is not None:
                done.append(ended)
                slot.key = None
        for slot in busy:
            if slot.key is not None and (ended := self._exited(slot)) is not None:
                done.append(ended)
                slot.key = None
            if slot.key is not None:
                self.silence.check([slot.index], self._forward(slot, on_event))
        return done

    def _exited(self, slot: _Slot) -> TaskDone | None:
        """The task's end by its process's exit, where the pipe's end has not come within
        PIPE_END_GRACE_S of it (a process the task forked holds the pipe open)."""
        code = slot.watch.code(reports_in=False)  # its pipe's end, read, ends the task first
        if code is None:
            return None
        why = f"process {describe_exit(code)}"
        self._retire(slot)
        return TaskDone(slot.key, False, why)

    def _arrivals(self, timeout: float) -> list[tuple]:
        """What the slots reported, waiting up to `timeout` for the first report."""
        try:
            arrived = [
                self.arrived.get(timeout=timeout) if timeout > 0 else self.arrived.get_nowait()
            ]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                arrived.append(self.arrived.get_nowait())
        return arrived

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

    def _take(self, slot: _Slot, message, on_event) -> TaskDone | None:
        """One report of the slot's task: an event handed over, or the task's end."""
        if isinstance(message, PipeEnd):  # the process is gone
            slot.process.join(timeout=WORKER_EXIT_GRACE_S)  # its pipe ends as it exits
            stop_processes([slot.process])  # or it closed the pipe and lives on: stopped
            why = f"process {describe_exit(slot.process.exitcode)}"
            self._retire(slot)
            return TaskDone(slot.key, False, why)
        if isinstance(message, Unreadable):  # said to the owner, once per process
            if not slot.garbled:
                slot.garbled = True
                line = f"the task sent a report that cannot be read ({message.why}); skipped"
                self._forward(slot, on_event)("warn", (line,))
            return None
        if message[0] == "event":
            self._forward(slot, on_event)(*message[1])
            return None
        status, value, (began, ended) = message
        if status != "ok":  # the process leaves after a failure: the next task gets a new one
            slot.process.join(timeout=WORKER_EXIT_GRACE_S)
            self._retire(slot)
        return TaskDone(slot.key, status == "ok", value, slot.index, began, ended)

    def cancel(self, key: str) -> None:
        for slot in self._slots:
            if slot.key == key:
                self._retire(slot)
                slot.key = None

    def close(self) -> None:
        for slot in self._slots:
            if slot.alive() and slot.key is None:
                with contextlib.suppress(OSError):
                    slot.tasks.send(None)  # an idle slot leaves by itself
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
            slot.tasks.close()  # its reports' pipe ends with the process: its reader closes it
        slot.process = slot.tasks = None
