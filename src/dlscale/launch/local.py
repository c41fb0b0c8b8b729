"""LocalLauncher: N worker processes on this machine, started and supervised by dlscale itself.

No service to start: the workers are spawned processes that meet over torch.distributed's TCP
rendezvous on 127.0.0.1. The parent polls them; the first that dies or raises stops the job (the
others get SIGTERM, then SIGKILL), and every child kills itself if the parent disappears. Each
worker reports its events and its result on its own pipe, read on a thread of its own (`_Inbox`):
a worker killed, or stopped, while it reports cannot stop its peers' reports.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import queue
import signal
import socket
import sys
import time
import traceback
from typing import Any

from dlscale.errors import RunFailed, UserError, one_line
from dlscale.launch.base import (
    HEARTBEAT_WARN_S,
    RESULT_GRACE_S,
    EventHandler,
    LateExpendables,
    Resources,
    WorkerContext,
    WorkerFailed,
    WorkerFn,
    drain_events,
    lost_worker,
    per_rank,
)
from dlscale.launch.heartbeat import Silence, start_beating
from dlscale.launch.pool import LocalPool
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
from dlscale.signals import end_by_signal, stop_once

POLL_S = 0.05
DEATH_NOTICE_S = 2.0  # how long to look for a dead peer behind a worker's error


def check_port(port: int, host: str = LOOPBACK) -> int:
    """The rendezvous port must be free now; say so in one line if it is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is already in use (strategy.port); choose another "
                    "or leave it out to take a free one"
                ) from None
            raise UserError(f"cannot use port {port} on {host}: {exc.strerror}") from None
    return port


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _entry(
    fn, payload, context: WorkerContext, conn, parent_pid: int, threads: int, env: dict
) -> None:
    """What each worker process runs: set up, call `fn`, report its result or its error, its
    events and result on its own pipe `conn`."""
    adopt(env)
    die_with_parent(parent_pid)
    channel = PipeChannel(conn)
    context = dataclasses.replace(context, events=channel)
    start_beating(context)
    import torch  # after the parent check: importing torch takes a second or two

    torch.set_num_threads(threads)  # workers share the cores instead of each taking them all
    _pin_to_cores(context.local_rank, context.world_size, threads)
    os.environ.update(
        MASTER_ADDR=context.master_addr,
        MASTER_PORT=str(context.master_port),
        RANK=str(context.rank),
        WORLD_SIZE=str(context.world_size),
        LOCAL_RANK=str(context.local_rank),
    )
    failed = False
    try:
        try:
            stop_once()  # a stop unwinds the run: a checkpoint being written is discarded whole
            channel.send(("result", ("ok", context.rank, fn(context, payload))))
        except KeyboardInterrupt:
            raise
        except RunFailed as exc:  # the run itself failed: the job stops, whoever met it
            channel.send(("result", ("run_failed", context.rank, str(exc))))
        except UserError as exc:
            channel.send(("result", ("user_error", context.rank, str(exc))))
        except BaseException as exc:  # report everything else, traceback included, then fail
            line = f"{type(exc).__name__}: {one_line(exc)}"
            channel.send(("result", ("error", context.rank, (line, traceback.format_exc()))))
            failed = True
        # Reported: this process only exits now. The launcher's SIGTERM, sent the moment it
        # reads a failure (or the last result), must not raise in the exit and print a trace.
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # set outside a handler: no race
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except KeyboardInterrupt as stop:
        # Told to stop, not failed: no traceback, no report. So too when the stop lands while
        # this worker reports its own failure (its peer died; the launcher is stopping all).
        end_by_signal(stop)
    if failed:
        raise SystemExit(1)


class _Inbox:
    """The workers' pipes, read for the launcher: each worker's events and result on its own,
    each pipe read on its own thread (`PipeReader`).

    A shared multiprocessing Queue for all of them hung an async job that lost a worker: the
    worker was killed while its queue's feeder thread held the queue's write lock (shared by every
    writer), and every other worker's report and exit then waited on that lock for good (found
    by py-spy in a hung `make test`; tests/launch/test_reports.py). A pipe has one writer: a
    worker killed mid-send cuts short only its own, which then reads as its end (the launcher
    holds no writing end); its exit code says the rest. A worker stopped mid-message holds only
    its own reader, not the launcher.
    """

    def __init__(self):
        self.arrived: queue.Queue = queue.Queue()
        self.readers: list[PipeReader] = []
        self.results: collections.deque = collections.deque()
        self.events: collections.deque = collections.deque()
        self.ended: set[int] = set()  # ranks whose pipe's end has been read
        self.garbled: set[int] = set()  # ranks that sent a message that did not unpickle

    def add(self, rank: int, conn) -> None:
        self.readers.append(PipeReader(conn, rank, self.arrived))

    def pump(self, timeout: float) -> None:
        """Take whatever has arrived, waiting up to `timeout` for something to."""
        try:
            rank, message = self.arrived.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._sort(rank, message)
            try:
                rank, message = self.arrived.get_nowait()
            except queue.Empty:
                return

    def _sort(self, rank: int, message) -> None:
        if isinstance(message, PipeEnd):
            self.ended.add(rank)
            return
        if isinstance(message, Unreadable):  # said once, not dropped silently
            if rank not in self.garbled:
                self.garbled.add(rank)
                line = f"worker {rank} sent a report that cannot be read ({message.why}); skipped"
                self.events.append(("warn", (line,)))
            return
        kind, item = message
        (self.results if kind == "result" else self.events).append(item)

    def settled(self, rank: int) -> bool:
        """Everything `rank` sent has been taken in: its pipe's end read, no result of its
        waiting."""
        return rank in self.ended and not any(item[1] == rank for item in self.results)

    def close(self, timeout: float = 2.0) -> None:
        """Wait briefly for the readers to see their pipes end (the workers are stopped by
        now); a pipe some other process still holds open is left to its reader, which closes it
        at its end."""
        deadline = time.monotonic() + timeout
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))


class _Reported:
    """A worker process as `_supervise` sees it: its exit code once what it sent before its
    exit has been taken in (`_Inbox.settled`), so a failure it reported is read before the exit
    code that follows it; or PIPE_END_GRACE_S after the exit, if something else holds its pipe
    open (a data loader's worker it forked, until that sees its parent gone)."""

    def __init__(self, process, rank: int, inbox: _Inbox):
        self.process, self.rank, self.inbox = process, rank, inbox
        self.watch = ExitWatch(process)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.watch.code(self.inbox.settled(self.rank))


class _InboxQueue:
    """One kind of the inbox's messages ("results" or "events") as `_supervise`, `_first_cause`
    and `drain_events` read a queue: get(timeout), get_nowait()."""

    def __init__(self, inbox: _Inbox, kind: str):
        self.inbox, self.kind = inbox, kind

    def get(self, timeout: float = 0.0) -> tuple:
        waiting = getattr(self.inbox, self.kind)
        if not waiting:
            self.inbox.pump(timeout)
        if not waiting:
            raise queue.Empty
        return waiting.popleft()

    def get_nowait(self) -> tuple:
        return self.get(0.0)


def threads_per_worker(num_workers: int) -> int:
    """Each worker's equal share of the cores, at least one (a spec's `threads` overrides it)."""
    return max(1, available_cores() // num_workers)


def _pin_to_cores(local_rank: int, workers: int, threads: int) -> None:
    """Give each worker its own `threads` cores when there are enough (DLSCALE_PIN=0: don't).

    Unpinned, the scheduler moves busy workers between cores and each move costs their caches:
    on the 2-core development machine two pinned LeNet workers trained 5–15% faster.
    """
    if os.environ.get("DLSCALE_PIN", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= workers * threads:
        os.sched_setaffinity(0, cores[local_rank * threads : (local_rank + 1) * threads])


class LocalLauncher:
    """Processes on this machine, forked from a server that imported torch once (never from a
    process that ran torch ops: its threads do not survive fork); see launch/start.py."""

    name = "local"

    def capacity(self, resources: Resources) -> int:
        by_cores = max(1, int(available_cores() // max(1.0, resources.cpus)))
        if resources.gpus:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            return min(by_cores, int(gpus // resources.gpus))
        return by_cores

    def pool(self, slots: int, resources: Resources):
        return LocalPool(slots, resources)

    def run(
        self,
        fn: WorkerFn,
        payload: Any,
        num_workers: int,
        resources: Resources | list[Resources],
        port: int | None = None,
        on_event: EventHandler | None = None,
        expendable: frozenset[int] = frozenset(),
        heartbeat_warn_s: float = HEARTBEAT_WARN_S,
    ) -> list[Any]:
        port = check_port(port) if port is not None else free_port()
        ctx = start_context()
        inbox = _Inbox()
        threads = threads_per_worker(num_workers)
        gpus = _gpu_indices(per_rank(resources, num_workers))
        processes = []
        try:  # a stop while the later ones start stops those already started
            for rank in range(num_workers):
                context = WorkerContext(
                    rank,
                    num_workers,
                    rank,
                    LOOPBACK,
                    port,
                    None,  # its events go on its own pipe (the worker sets it: _entry)
                    socket.gethostname(),
                    gpus[rank],
                )
                reader, writer = ctx.Pipe(duplex=False)
                inbox.add(rank, reader)
                try:
                    with thread_env(threads):
                        process = ctx.Process(
                            target=_entry,
                            args=(
                                fn,
                                payload,
                                context,
                                writer,
                                os.getpid(),
                                threads,
                                environment(),
                            ),
                            name=f"dlscale-worker-{rank}",
                        )
                        processes.append(process)  # before it starts: stopped however far it got
                        process.start()
                finally:
                    writer.close()  # the worker holds its end: EOF here means it is gone
            silence = Silence(num_workers, heartbeat_warn_s, [p.pid for p in processes])
            return self._supervise(
                [_Reported(process, rank, inbox) for rank, process in enumerate(processes)],
                _InboxQueue(inbox, "results"),
                _InboxQueue(inbox, "events"),
                on_event,
                expendable,
                silence,
            )
        finally:
            try:
                stop_processes(processes)
            finally:
                inbox.close()

    def _supervise(self, processes, results, events, on_event, expendable, silence) -> list[Any]:
        done: dict[int, Any] = {}
        exited_at: dict[int, float] = {}
        late = LateExpendables(len(processes), expendable, RESULT_GRACE_S)
        on_event = silence.watch(late.watch(on_event))
        while len(done) < len(processes):
            for rank in late.overdue(done):
                done[rank] = None
                lost_worker(
                    rank, f"did not finish within {RESULT_GRACE_S:g} s of the others", on_event
                )
            drain_events(events, on_event)
            try:
                status, rank, value = results.get(timeout=POLL_S)
            except queue.Empty:
                status = None
            if status is not None:  # what the worker sent before its result (READY) counts first
                drain_events(events, on_event)
            running = [other for other in range(len(processes)) if other not in done]
            if status == "ok":
                done[rank] = value
            elif status == "run_failed":
                raise RunFailed(value)
            elif status in ("user_error", "error") and late.may_lose(rank):
                done[rank] = None
                lost_worker(
                    rank, f"failed: {value if status == 'user_error' else value[0]}", on_event
                )
            elif status == "user_error":
                # A wait that timed out on a silent peer (a parameter server's): name the peer.
                blamed = silence.blame(value, rank, running)
                raise blamed or UserError(value)
            elif status == "error":
                # Whom a silent peer's blame falls on is judged now: _first_cause's wait below
                # drains no beats, and every worker would look silent after it.
                silent = silence.blame(f"worker {rank} failed: {value[0]}", rank, running)
                raise _first_cause(processes, results, rank, *value, silent)
            silence.check(running, on_event)
            for rank, process in enumerate(processes):
                code = process.exitcode
                if code is None or rank in done:
                    continue
                if code != 0 and late.may_lose(rank):
                    done[rank] = None
                    lost_worker(rank, f"(pid {process.pid}) {describe_exit(code)}", on_event)
                    continue
                if code != 0:
                    raise WorkerFailed(f"worker {rank} (pid {process.pid}) {describe_exit(code)}")
                exited_at.setdefault(rank, time.monotonic())
                if time.monotonic() - exited_at[rank] > RESULT_GRACE_S:
                    raise WorkerFailed(f"worker {rank} exited without reporting a result")
        drain_events(events, on_event)
        return [done[rank] for rank in range(len(processes))]


def _gpu_indices(resources: list[Resources]) -> list[int | None]:
    """Each GPU-using rank's GPU, in rank order over the GPUs this process sees."""
    if not any(each.gpus for each in resources):
        return [None] * len(resources)
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    indices: list[int | None] = []
    used = 0
    for each in resources:
        indices.append(used % count if each.gpus and count else None)
        used += 1 if each.gpus else 0
    return indices


def _first_cause(
    processes, results, rank: int, error: str, trace: str, silent: WorkerFailed | None = None
) -> UserError:
    """When one worker dies, its peers fail too (their allreduce loses a partner); name the
    dead one first (its exit may trail its peers' error reports by a moment), and leave out
    the peer's traceback, which only says it lost a partner. So too for a peer whose run
    failed (its loss diverged), which leaves the group while the others wait in it. Failing
    with no peer dead but one `silent` (stopped: the collective timed out waiting for it),
    that one is named. An error of its own, with no peer dead or silent, is a defect: its
    traceback goes to stderr before the one line."""
    deadline = time.monotonic() + DEATH_NOTICE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            status, _, value = results.get_nowait()
            if status == "run_failed":
                return RunFailed(value)
        for other, process in enumerate(processes):
            # The peer's death as the kernel tells it, not held back for its reports (_Reported):
            # its pipe may stay open for seconds in the data loader's workers it forked.
            code = getattr(process, "process", process).exitcode
            if other != rank and code not in (None, 0):
                return WorkerFailed(
                    f"worker {other} (pid {process.pid}) {describe_exit(code)}; "
                    f"then worker {rank} failed: {error}"
                )
        time.sleep(POLL_S)
    if silent is not None:
        return silent
    sys.stderr.write(trace)
    return WorkerFailed(f"worker {rank} failed: {error}")
