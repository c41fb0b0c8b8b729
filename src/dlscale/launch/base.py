"""The launcher interface every parallel strategy uses, and what a worker is told."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dlscale.errors import UserError

# A worker function: runs in the worker, gets its context and the job's payload, returns a
# picklable result. It must be a module-level function so that it pickles to the worker.
WorkerFn = Callable[["WorkerContext", Any], Any]
# Parent-side handler for events a worker sends while it runs (progress, warnings).
EventHandler = Callable[[str, tuple], None]

RESULT_GRACE_S = 30.0  # a worker that exited cleanly, or an expendable one left behind, gets this
WORKER_EXIT_GRACE_S = 5.0  # after SIGTERM, how long a worker gets before SIGKILL
HEARTBEAT_WARN_S = 5.0  # a worker with no heartbeat this long is named while the others wait


class WorkerFailed(UserError):
    """A worker died or raised: the job stops, naming the worker (exit code 1, not usage)."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=1)


@dataclass(frozen=True)
class WorkerContext:
    """Who a worker is and where its peers meet (torch.distributed's env:// rendezvous)."""

    rank: int
    world_size: int
    local_rank: int  # index among the workers on the same machine (its GPU, if any)
    master_addr: str
    master_port: int
    events: Any = None  # a queue-like object with put(); None when nobody listens
    node: str = ""  # where the worker runs: a host name, or a Ray node id
    gpu: int | None = None  # this worker's GPU as the process sees it; None: it needs none
    host: str = ""  # the host's name, where the launcher knows it
    address: str = ""  # the address its host joined the cluster with (Ray's node address)

    def send(self, kind: str, *args: Any) -> None:
        if self.events is not None:
            self.events.put((kind, args))


@dataclass(frozen=True)
class Resources:
    """What each worker needs from the machine or cluster."""

    cpus: float = 1.0
    gpus: float = 0.0
    node: str | None = None  # on a cluster: the address of the node it must run on


def per_rank(resources: Resources | list[Resources], num_workers: int) -> list[Resources]:
    """One Resources for every rank (a job may mix, e.g. CPU servers and GPU workers)."""
    if isinstance(resources, Resources):
        return [resources] * num_workers
    assert len(resources) == num_workers, (len(resources), num_workers)
    return list(resources)


READY = "ready"  # the event each worker sends once it has met the others (after rendezvous)


# Parent-side handler for events a pool task sends: (task key, kind, args).
TaskEventHandler = Callable[[str, str, tuple], None]


@dataclass(frozen=True)
class TaskDone:
    """A pool task that ended: its result, or (ok False) the one line saying why it failed."""

    key: str
    ok: bool
    value: Any
    # Where and when it ran, when the pool knows: its slot, and its start and end there
    # (seconds since the epoch). A local pool's long-lived slots report it.
    slot: int | None = None
    began: float | None = None
    ended: float | None = None


class TaskPool(Protocol):
    """Independent tasks (sweep trials), each on its own share of the machine or cluster.

    Unlike `Launcher.run`, tasks do not meet or wait for each other: one that fails is reported
    by `wait` and the others go on. The caller keeps at most `slots` tasks running.
    """

    slots: int
    running: list[str]  # keys of the tasks not yet ended

    def submit(self, key: str, fn: WorkerFn, payload: Any) -> None: ...

    def wait(self, timeout: float, on_event: TaskEventHandler | None = None) -> list[TaskDone]:
        """Hand over the tasks' events; return those that ended within `timeout` seconds."""
        ...

    def cancel(self, key: str) -> None: ...

    def close(self) -> None:
        """Stop every task still running; no process outlives it."""
        ...


class Launcher(Protocol):
    """Starts `num_workers` copies of `fn`, supervises them and returns their results by rank.

    Every wait has a timeout; a worker that dies or raises stops the whole job with WorkerFailed
    naming it, unless its rank is in `expendable` (a strategy that trains on without it) and
    every worker has reported READY (before the rendezvous is complete the others would wait
    for it in vain): then its result is None and a warning event says so. `resources` is one
    for all ranks or one per rank. No worker outlives the call. A worker that sends no
    heartbeat for `heartbeat_warn_s` (stopped, frozen) is named in a warning event, and in the
    error when its waiting peers then fail (launch.heartbeat).
    """

    name: str

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
    ) -> list[Any]: ...

    def capacity(self, resources: Resources) -> int:
        """How many tasks needing `resources` each fit at once (free cores, or the cluster's)."""
        ...

    def pool(self, slots: int, resources: Resources) -> TaskPool:
        """A pool running up to `slots` independent tasks, each given `resources`."""
        ...


class LateExpendables:
    """Which ranks the job may lose, and when to give up on them.

    A rank in `expendable` may be lost only once every rank has reported READY: before that the
    others are still waiting for it at the rendezvous. Expendable ranks still running after
    every other rank has finished get `grace_s`: a job that trains on without them
    (asynchronous parameter servers) is complete once the others are, and one that hangs or was
    stopped (SIGSTOP, a dead node) must not hold it forever.
    """

    def __init__(self, size: int, expendable: frozenset[int], grace_s: float):
        self.size = size
        self.required = set(range(size)) - set(expendable)
        self.expendable, self.grace_s = expendable, grace_s
        self.since: float | None = None
        self.ready: set[int] = set()

    def may_lose(self, rank: int) -> bool:
        return rank in self.expendable and len(self.ready) == self.size

    def watch(self, on_event: EventHandler | None) -> EventHandler:
        """`on_event`, with the READY events taken out and counted."""

        def handle(kind: str, args: tuple) -> None:
            if kind == READY:
                self.ready.add(args[0])
            elif on_event is not None:
                on_event(kind, args)

        return handle

    def overdue(self, finished) -> list[int]:
        """The expendable ranks to give up on now, given the ranks finished so far."""
        finished = set(finished)
        if not self.expendable or not self.required <= finished:
            return []
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.since < self.grace_s:
            return []
        return sorted(self.expendable - finished)


def lost_worker(rank: int, why: str, on_event: EventHandler | None) -> None:
    """Tell the user an expendable worker is gone and the job goes on without it."""
    if on_event is not None:
        on_event("warn", (f"worker {rank} {why}; training continues without it",))


def drain_events(events: Any, on_event: EventHandler | None) -> None:
    """Hand every event waiting in `events` (the local workers' pipes, or a Ray queue) to
    `on_event`."""
    while True:
        try:
            kind, args = events.get_nowait()
        except queue.Empty:  # Ray's queue raises a subclass of it
            return
        if on_event is not None:
            on_event(kind, args)
