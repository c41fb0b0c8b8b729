"""RayLauncher: the same workers as Ray actors on a cluster; Ray places and supervises them.

Tensors never travel through Ray: the actors meet over torch.distributed (a TCP rendezvous on
worker 0's node), exactly as local processes do. Ray only finds room for each worker (CPUs and
GPUs), starts it where there is room, and tells us when one dies.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from dlscale.errors import UserError, one_line
from dlscale.launch.base import (
    HEARTBEAT_WARN_S,
    RESULT_GRACE_S,
    EventHandler,
    LateExpendables,
    Resources,
    TaskDone,
    WorkerContext,
    WorkerFailed,
    WorkerFn,
    drain_events,
    lost_worker,
    per_rank,
)
from dlscale.launch.heartbeat import Silence, start_beating
from dlscale.launch.netbind import Listener, bind_to, reach
from dlscale.launch.ray_auth import authenticate, forget

CONNECT_TIMEOUT_S = 5.0  # a cluster head that does not accept a TCP connection by then is down
PLACE_TIMEOUT_S = 120.0  # actors not started by then (no room, or nodes too slow) fail the job
POLL_S = 0.1


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError(
            "--cluster ray needs Ray: pip install 'dlscale[ray]' (or ray) on every node"
        ) from None
    return ray


def leave(ray) -> None:
    """Disconnect what _connect connected, and the token mode it may have turned on."""
    ray.shutdown()
    forget()


def check_reachable(address: str) -> None:
    """A HOST:PORT address must accept a TCP connection; fail in seconds, not minutes."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--address must be 'auto' or HOST:PORT of the Ray head (got '{address}')")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(
            f"the Ray cluster at {address} does not answer ({exc.strerror or exc}); "
            "is `ray start --head` running there?"
        ) from None


class _RayWorker:
    """One worker as an actor: reports where it runs, finds a port, checks it reaches the other
    hosts, runs the worker function with its collectives bound to its node's interface."""

    listener: Listener | None = None

    def node(self) -> tuple[str, str, str]:
        """(the node's address, Ray's node id, the host's name)."""
        import ray

        return (
            ray.util.get_node_ip_address(),
            ray.get_runtime_context().get_node_id(),
            socket.gethostname(),
        )

    def listen(self) -> int:
        self.listener = Listener(self.node()[0])
        return self.listener.port

    def reach(self, targets: list[tuple[str, int]]) -> list[tuple[str, int, str]]:
        """The (address, port, why) of each target this host cannot connect to."""
        failures = [(address, port, reach(address, port)) for address, port in targets]
        return [(address, port, why) for address, port, why in failures if why]

    def unlisten(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def free_port(self, wanted: int | None) -> int:
        from dlscale.launch.local import check_port, free_port

        host = self.node()[0]
        return check_port(wanted, host) if wanted else free_port(host)

    def run(self, fn: WorkerFn, payload: Any, context: WorkerContext, threads: int) -> Any:
        start_beating(context)
        import torch

        torch.set_num_threads(threads)
        bind_to(context.address)  # gloo/NCCL on the interface its peers reach, not the host name's
        os.environ.update(
            MASTER_ADDR=context.master_addr,
            MASTER_PORT=str(context.master_port),
            RANK=str(context.rank),
            WORLD_SIZE=str(context.world_size),
        )
        return fn(context, payload)


class RayLauncher:
    name = "ray"

    def __init__(self, address: str = "auto"):
        self.address = address

    def capacity(self, resources: Resources) -> int:
        ray = import_ray()
        connected_here = self._connect(ray)
        try:
            total = ray.cluster_resources()
        finally:
            if connected_here:
                leave(ray)
        fits = [total.get("CPU", 0.0) // max(1.0, resources.cpus)]
        if resources.gpus:
            fits.append(total.get("GPU", 0.0) // resources.gpus)
        return int(min(fits))

    def pool(self, slots: int, resources: Resources) -> RayPool:
        ray = import_ray()
        return RayPool(ray, self._connect(ray), slots, resources)

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
        ray = import_ray()
        connected_here = self._connect(ray)
        actors: list[Any] = []
        each = per_rank(resources, num_workers)
        try:
            self._check_capacity(ray, each)
            from ray.util.queue import Queue

            events = Queue()
            actors = [
                ray.remote(num_cpus=r.cpus, num_gpus=r.gpus, max_restarts=0)(_RayWorker).remote()
                for r in each
            ]
            nodes = [
                self._get(ray, a.node.remote(), r, PLACE_TIMEOUT_S) for r, a in enumerate(actors)
            ]
            self._check_links(ray, actors, nodes)
            master_addr = nodes[0][0]
            master_port = self._get(ray, actors[0].free_port.remote(port), 0, PLACE_TIMEOUT_S)
            futures = {}
            for rank, actor in enumerate(actors):
                # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES: its GPU is cuda:0.
                context = WorkerContext(
                    rank,
                    num_workers,
                    0,
                    master_addr,
                    master_port,
                    events,
                    nodes[rank][1],
                    0 if each[rank].gpus else None,
                    host=nodes[rank][2],
                    address=nodes[rank][0],
                )
                threads = max(1, int(each[rank].cpus))
                futures[actor.run.remote(fn, payload, context, threads)] = rank
            silence = Silence(num_workers, heartbeat_warn_s)  # no pids: on other nodes
            return self._supervise(ray, futures, events, on_event, expendable, silence)
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if connected_here:
                leave(ray)

    def _check_links(self, ray, actors: list, nodes: list[tuple[str, str, str]]) -> None:
        """Every host accepts a TCP connection from every other (one actor speaks for its
        host), or one line names both hosts, their addresses and the port, within seconds."""
        first = {}  # address -> the rank of its first actor
        for rank, (address, _, _) in enumerate(nodes):
            first.setdefault(address, rank)
        if len(first) < 2:
            return
        speakers = [actors[rank] for rank in first.values()]
        try:
            ports = ray.get([actor.listen.remote() for actor in speakers], timeout=PLACE_TIMEOUT_S)
            targets = list(zip(first, ports, strict=True))
            found = ray.get(
                [
                    actor.reach.remote([t for t in targets if t[0] != address])
                    for actor, address in zip(speakers, first, strict=True)
                ],
                timeout=PLACE_TIMEOUT_S,
            )
        finally:
            ray.get([actor.unlisten.remote() for actor in speakers], timeout=PLACE_TIMEOUT_S)
        by_address = {address: nodes[rank] for address, rank in first.items()}
        for (source, rank), failures in zip(first.items(), found, strict=True):
            for target, port, why in failures:
                target_rank = first[target]
                raise UserError(
                    f"host {nodes[rank][2]} ({source}, worker {rank}) cannot reach host "
                    f"{by_address[target][2]} ({target}, worker {target_rank}) on TCP port "
                    f"{port}: {why}; the workers' collectives need every TCP port between the "
                    "hosts (see README: Two machines)"
                )

    def _connect(self, ray) -> bool:
        if ray.is_initialized():
            return False
        check_reachable(self.address)
        authenticate(self.address)  # a token-authenticated head: its token, or one line why not
        try:
            ray.init(address=self.address, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
            forget()
            raise UserError(
                f"cannot join the Ray cluster at '{self.address}': {one_line(exc)}"
            ) from None
        return True

    @staticmethod
    def _check_capacity(ray, resources: list[Resources]) -> None:
        total = ray.cluster_resources()
        for kind, wanted in (
            ("CPU", [r.cpus for r in resources]),
            ("GPU", [r.gpus for r in resources]),
        ):
            have, need = total.get(kind, 0.0), sum(wanted)
            if need > have:
                users = sum(1 for w in wanted if w)
                raise UserError(
                    f"the Ray cluster has {have:g} {kind}s; {users} workers needing {need:g} "
                    f"{kind}s in all cannot be placed (add nodes, or lower strategy.workers)"
                )

    @staticmethod
    def _get(ray, ref, rank: int, timeout: float) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailed(f"worker {rank} did not start within {timeout:g} s") from None
        except ray.exceptions.RayTaskError as exc:
            _reraise(exc, rank)
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(f"worker {rank} died: {one_line(exc)}") from None

    def _supervise(
        self, ray, futures: dict, events, on_event: EventHandler | None, expendable, silence
    ) -> list[Any]:
        results: dict[int, Any] = {}
        pending = list(futures)
        late = LateExpendables(len(futures), expendable, RESULT_GRACE_S)
        on_event = silence.watch(late.watch(on_event))
        while pending:
            for rank in late.overdue(results):
                results[rank] = None
                pending = [ref for ref in pending if futures[ref] != rank]
                lost_worker(
                    rank, f"did not finish within {RESULT_GRACE_S:g} s of the others", on_event
                )
            if not pending:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            drain_events(events, on_event)
            running = [futures[ref] for ref in pending + ready]
            silence.check([futures[ref] for ref in pending], on_event)
            for ref in ready:
                rank = futures[ref]
                try:
                    results[rank] = self._get(ray, ref, rank, timeout=PLACE_TIMEOUT_S)
                except UserError as exc:
                    if late.may_lose(rank):
                        results[rank] = None
                        lost_worker(rank, f"failed: {exc}", on_event)
                    else:  # a wait that timed out on a silent peer: name the peer
                        raise silence.blame(str(exc), rank, running) or exc from None
        drain_events(events, on_event)
        return [results[rank] for rank in range(len(futures))]


def _reraise(exc, rank: int) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, UserError) and not isinstance(cause, WorkerFailed):
        raise UserError(str(cause)) from None
    detail = one_line(cause) if cause is not None else one_line(exc)
    raise WorkerFailed(f"worker {rank} failed: {type(cause).__name__}: {detail}") from None


# ------------------------------------------------------------------------------ pool


class _TaggedQueue:
    """A task's view of the pool's one event queue: every event carries the task's key."""

    def __init__(self, queue, key: str):
        self.queue, self.key = queue, key

    def put(self, item: tuple) -> None:
        self.queue.put((self.key, item))


def _ray_task(fn: WorkerFn, payload: Any, events: _TaggedQueue, threads: int) -> Any:
    """A pool task in a slot actor: its threads, no core pinning (Ray places, it does not pin)."""
    import ray
    import torch

    torch.set_num_threads(threads)
    # Trials sharing a node must not each pin their own workers to the node's first cores.
    os.environ.update(DLSCALE_CPUS=str(threads), DLSCALE_PIN="0")
    node = ray.get_runtime_context().get_node_id()
    where = {"host": socket.gethostname(), "address": ray.util.get_node_ip_address()}
    return fn(WorkerContext(0, 1, 0, "127.0.0.1", 0, events, node, **where), payload)


class _SlotActor:
    """One slot of the pool on the cluster: an actor that runs task after task, so torch is
    imported once per slot, not once per trial (and a sweep's data read once, data/cache.py)."""

    def run(self, fn: WorkerFn, payload: Any, events: _TaggedQueue, threads: int) -> Any:
        return _ray_task(fn, payload, events, threads)


class RayPool:
    """Pool tasks on `slots` long-lived Ray actors: Ray places each actor (its CPUs and GPUs)
    on some node of the cluster once, and it runs trial after trial there. An actor whose task
    failed or was cancelled is replaced; events come back through one Ray queue, tagged with
    the task's key."""

    def __init__(self, ray, connected_here: bool, slots: int, resources: Resources):
        from ray.util.queue import Queue

        self.ray, self.connected_here, self.slots = ray, connected_here, slots
        RayLauncher._check_capacity(ray, [resources])
        self.events = Queue()
        self.threads = max(1, int(resources.cpus))
        self.actor_class = ray.remote(
            num_cpus=resources.cpus, num_gpus=resources.gpus, max_restarts=0
        )(_SlotActor)
        self.idle: list[Any] = []
        self.refs: dict[Any, tuple[str, Any]] = {}  # task ref -> (key, its actor)

    @property
    def running(self) -> list[str]:
        return [key for key, _ in self.refs.values()]

    def submit(self, key: str, fn: WorkerFn, payload: Any) -> None:
        actor = self.idle.pop() if self.idle else self.actor_class.remote()
        events = _TaggedQueue(self.events, key)
        self.refs[actor.run.remote(fn, payload, events, self.threads)] = (key, actor)

    def wait(self, timeout: float, on_event=None) -> list[TaskDone]:
        ready = []
        if self.refs:
            ready, _ = self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout)
        # Each event is (key, (kind, args)): drained as a (kind, args) pair, then unpacked.
        drain_events(self.events, lambda key, event: on_event and on_event(key, *event))
        done = []
        for ref in ready:
            key, actor = self.refs.pop(ref)
            try:
                done.append(TaskDone(key, True, self.ray.get(ref)))
                self.idle.append(actor)
                continue
            except self.ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, UserError):
                    why = str(cause)
                else:
                    why = f"{type(cause).__name__}: {one_line(cause if cause else exc)}"
            except self.ray.exceptions.RayError as exc:  # the actor died, or was cancelled
                why = f"{type(exc).__name__}: {one_line(exc)}"
            done.append(TaskDone(key, False, why))
            self._kill(actor)  # a fresh actor for the slot's next task
        return done

    def cancel(self, key: str) -> None:
        for ref, (owner, actor) in list(self.refs.items()):
            if owner == key:
                del self.refs[ref]
                self._kill(actor)

    def _kill(self, actor) -> None:
        with contextlib.suppress(Exception):
            self.ray.kill(actor)

    def close(self) -> None:
        for key in self.running:
            self.cancel(key)
        for actor in self.idle:
            self._kill(actor)
        self.idle.clear()
        with contextlib.suppress(Exception):
            self.ray.kill(self.events.actor)
        if self.connected_here:
            leave(self.ray)
