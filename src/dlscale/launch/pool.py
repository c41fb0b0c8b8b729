"""LocalPool: independent tasks (sweep trials) as processes on this machine, each pinned to
its own share of the cores (and its own GPUs), each reporting on a pipe of its own."""

from __future__ import annotations

import math
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import traceback
from typing import Any

from dlscale.errors import UserError, one_line
from dlscale.launch.base import WORKER_EXIT_GRACE_S, Resources, TaskDone, WorkerContext, WorkerFn
from dlscale.launch.local import (
    LOOPBACK,
    available_cores,
    describe_exit,
    die_with_parent,
    stop_processes,
    thread_env,
)
from dlscale.launch.start import adopt, environment
from dlscale.launch.start import context as start_context


class _PipeEvents:
    """A task's events travel on its own pipe: a task killed mid-send (a pruned sweep trial)
    can only garble its own channel, never another task's, as a shared queue could."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, item: tuple) -> None:
        self.conn.send(("event", item))


def _task_entry(
    fn, payload, key: str, conn, parent_pid: int, threads: int, cores, gpu, env: dict
) -> None:
    """What a pool task's process runs: its cores and threads, `fn`, the result on its pipe."""
    adopt(env)
    die_with_parent(parent_pid)
    # Ctrl-C at a terminal reaches the whole process group: the pool's owner alone decides
    # what stops (it terminates the tasks), so a task never reports the interrupt as its failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cores is not None:
        os.sched_setaffinity(0, cores)
    os.environ["DLSCALE_CPUS"] = str(threads)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    import torch

    torch.set_num_threads(threads)
    context = WorkerContext(0, 1, 0, LOOPBACK, 0, _PipeEvents(conn), socket.gethostname())
    try:
        conn.send(("ok", fn(context, payload)))
    except UserError as exc:
        conn.send(("failed", str(exc)))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {one_line(exc)}"))
        traceback.print_exc()
        raise SystemExit(1) from None


class LocalPool:
    """Up to `slots` task processes, each pinned to its own cores (and GPU) of this machine.

    The cores are dealt out in equal shares, one per slot; a task keeps its slot's share until
    it ends. Every task reports on its own pipe, watched together with the process sentinels.
    """

    def __init__(self, slots: int, resources: Resources):
        self.slots = slots
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.threads = max(1, len(cores) // slots) if cores else max(1, available_cores() // slots)
        self.shares = [
            cores[i * self.threads : (i + 1) * self.threads] if len(cores) >= slots else None
            for i in range(slots)
        ]
        if os.environ.get("DLSCALE_PIN", "1") == "0":
            self.shares = [None] * slots
        self.gpus_per_task = math.ceil(resources.gpus)
        self.free = list(range(slots))
        self.tasks: dict[str, tuple[Any, Any, int]] = {}  # key -> (process, conn, slot)
        self.ctx = start_context()

    @property
    def running(self) -> list[str]:
        return list(self.tasks)

    def submit(self, key: str, fn: WorkerFn, payload: Any) -> None:
        if not self.free:
            raise RuntimeError(f"pool of {self.slots} is full; task {key} cannot start")
        slot = self.free.pop(0)
        receive, send = self.ctx.Pipe(duplex=False)
        with thread_env(self.threads):
            process = self.ctx.Process(
                target=_task_entry,
                args=(fn, payload, key, send, os.getpid(), self.threads, self.shares[slot],
                      self._gpus(slot), environment()),
                name=f"dlscale-task-{key}",
            )  # fmt: skip
            process.start()
        send.close()  # the child holds the writing end; EOF here means it is gone
        self.tasks[key] = (process, receive, slot)

    def _gpus(self, slot: int) -> str | None:
        """CUDA_VISIBLE_DEVICES for the task in `slot`: its own GPUs, or None on CPU."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs this process may use
        ids = visible.split(",") if visible else [str(i) for i in range(64)]
        first = slot * self.gpus_per_task
        return ",".join(ids[first : first + self.gpus_per_task]) or None

    def wait(self, timeout: float, on_event=None) -> list[TaskDone]:
        handles = {}
        for key, (process, conn, _) in self.tasks.items():
            handles[conn] = handles[process.sentinel] = key
        ready = mp_connection.wait(list(handles), timeout) if handles else []
        outcome: dict[str, TaskDone] = {}
        for handle in ready:
            key = handles[handle]
            process, conn, _ = self.tasks[key]
            while key not in outcome and _poll(conn):
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    break
                if message[0] == "event":
                    if on_event is not None:
                        on_event(key, *message[1])
                else:
                    outcome[key] = TaskDone(key, message[0] == "ok", message[1])
            if key not in outcome and not process.is_alive():
                process.join()
                outcome[key] = TaskDone(key, False, f"process {describe_exit(process.exitcode)}")
        for key in outcome:
            self._release(key)
        return list(outcome.values())

    def cancel(self, key: str) -> None:
        if key in self.tasks:
            stop_processes([self.tasks[key][0]])
            self._release(key)

    def close(self) -> None:
        stop_processes([process for process, _, _ in self.tasks.values()])
        for key in list(self.tasks):
            self._release(key)

    def _release(self, key: str) -> None:
        process, conn, slot = self.tasks.pop(key)
        process.join(timeout=WORKER_EXIT_GRACE_S)
        if process.is_alive():
            stop_processes([process])
        conn.close()
        self.free.append(slot)
        self.free.sort()


def _poll(conn) -> bool:
    try:
        return conn.poll()
    except (EOFError, OSError):
        return False
