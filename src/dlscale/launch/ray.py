"""RayLauncher: the same workers as Ray actors on a cluster; Ray places and supervises them.

Tensors never travel through Ray: the actors meet over torch.distributed (a TCP rendezvous on
worker 0's node), exactly as local processes do. Ray only finds room for each worker (CPUs and
GPUs), starts it where there is room, and tells us when one dies.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from typing import Any

from dlscale.errors import RunFailed, UserError, lost_peer, one_line
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
from dlscale.launch.netbind import Listener, bind_to, reach
from dlscale.launch.ray_cluster import (
    check_capacity,
    connect,
    events_queue,
    import_ray,
    leave,
    own_node,
)
from dlscale.launch.ray_pool import RayPool

PEER_GRACE_S = 30.0  # Ray tells a dead node from missed health checks within about this
ORPHAN_AFTER_S = 60.0  # a worker whose heartbeats get nowhere this long ends itself
PLACE_TIMEOUT_S = 120.0  # actors not started by then (no room, or nodes too slow) fail the job
POLL_S = 0.1


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
        start_beating(context, orphan_after_s=ORPHAN_AFTER_S)
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
        self.where: list[str] = []  # each rank's host, "name (address)", once placed

    def capacity(self, resources: Resources) -> int:
        ray = import_ray()
        connected_here = connect(ray, self.address)
        try:
            total = ray.cluster_resources()
        finally:
            if connected_here:
                leave(ray)
        fits = [total.get("CPU", 0.0) // max(1.0, resources.cpus)]
        if resources.gpus:
            fits.append(total.get("GPU", 0.0) // resources.gpus)
        return int(min(fits))

    def node_addresses(self) -> list[str]:
        """The addresses of the cluster's live nodes, the head's first."""
        ray = import_ray()
        connected_here = connect(ray, self.address)
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            here = own_node(ray)
            head = here["NodeManagerAddress"] if here else None
        finally:
            if connected_here:
                leave(ray)
        addresses = [n["NodeManagerAddress"] for n in nodes]
        return sorted(set(addresses), key=lambda a: (a != head, a))

    def pool(self, slots: int, resources: Resources) -> RayPool:
        ray = import_ray()
        return RayPool(ray, connect(ray, self.address), slots, resources)

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
        connected_here = connect(ray, self.address)
        actors: list[Any] = []
        each = per_rank(resources, num_workers)
        try:
            check_capacity(ray, each)
            events = events_queue(ray)
            actors = [
                ray.remote(
                    num_cpus=r.cpus,
                    num_gpus=r.gpus,
                    max_restarts=0,
                    # Ray gives every node a resource named after its address.
                    resources={f"node:{r.node}": 0.001} if r.node else None,
                )(_RayWorker).remote()
                for r in each
            ]
            nodes = [
                self._get(ray, a.node.remote(), r, PLACE_TIMEOUT_S) for r, a in enumerate(actors)
            ]
            self.where = [f"{host} ({address})" for address, _, host in nodes]
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
            silence = Silence(num_workers, heartbeat_warn_s, where=self.where)
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
                    "hosts (see docs/cluster.md, Two machines)"
                )

    def _get(self, ray, ref, rank: int, timeout: float) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailed(f"worker {rank} did not start within {timeout:g} s") from None
        except ray.exceptions.RayTaskError as exc:
            _reraise(exc, self._name(rank))
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(f"{self._name(rank)} died: {actor_death(exc)}") from None

    def _name(self, rank: int) -> str:
        return (
            f"worker {rank} on {self.where[rank]}" if rank < len(self.where) else f"worker {rank}"
        )

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
            try:
                drain_events(events, on_event)
            except ray.exceptions.RayError as exc:  # the queue's node (the driver's) failed
                raise WorkerFailed(f"lost the job's event queue: {one_line(exc)}") from None
            running = [futures[ref] for ref in pending + ready]
            silence.check([futures[ref] for ref in pending], on_event)
            for ref in ready:
                rank = futures[ref]
                try:
                    results[rank] = self._get(ray, ref, rank, timeout=PLACE_TIMEOUT_S)
                except UserError as exc:
                    if late.may_lose(rank) and not isinstance(exc, RunFailed):
                        results[rank] = None
                        lost_worker(rank, f"failed: {exc}", on_event)
                    else:  # a wait that timed out on a silent peer: name the peer
                        blamed = silence.blame(str(exc), rank, running)
                        if blamed is None and lost_peer(str(exc)):
                            others = [ref for ref in pending if futures[ref] != rank]
                            watch = (events, on_event, silence)
                            blamed = self._cause(ray, futures, others, rank, str(exc), watch)
                        raise blamed or exc from None
        drain_events(events, on_event)
        return [results[rank] for rank in range(len(futures))]

    def _cause(self, ray, futures: dict, others: list, rank: int, failure: str, watch):
        """`rank` lost its connection to a peer: the peer's host may be gone (its Ray node
        killed, its cable pulled), which Ray learns a few seconds later from missed health
        checks. Wait that long for a peer that died or fell silent, and name it first."""
        events, on_event, silence = watch
        deadline = time.monotonic() + PEER_GRACE_S
        while others and time.monotonic() < deadline:
            ready, others = ray.wait(others, num_returns=1, timeout=0.5)
            with contextlib.suppress(ray.exceptions.RayError):  # heartbeats, where they come
                drain_events(events, on_event)
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError as exc:
                    who = self._name(futures[ref])
                    return WorkerFailed(f"{who} died: {actor_death(exc)}; then {failure}")
                except Exception:
                    continue
            blamed = silence.blame(failure, rank, [futures[ref] for ref in others])
            if blamed is not None:
                return blamed
        return None


def _reraise(exc, who: str) -> None:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RunFailed):
        raise RunFailed(str(cause)) from None
    if isinstance(cause, UserError) and not isinstance(cause, WorkerFailed):
        raise UserError(str(cause)) from None
    detail = one_line(cause) if cause is not None else one_line(exc)
    raise WorkerFailed(f"{who} failed: {type(cause).__name__}: {detail}") from None


# How Ray words the death of an actor whose process ended without a word: it reaps the process
# but reports no exit status, only that the connection broke, so the signal is inferred.
UNEXPECTED_EXIT = ("unexpectedly exits", "died unexpectedly", "connection error", "End of file")


def actor_death(exc) -> str:
    """Why Ray says an actor died, in one line: its node's fate where Ray knows it; a process
    that ended unexpectedly on a live node was killed (SIGKILL) or crashed, as a local run
    names it."""
    text = str(exc)
    for line in text.splitlines():
        if "node was terminated" in line or "node has died" in line:
            return line.strip().removeprefix("the actor's ").rstrip(".")
    if any(sign in text for sign in UNEXPECTED_EXIT):
        pid = re.search(r"^\s*pid: (\d+)", text, re.MULTILINE)
        process = f"its process (pid {pid.group(1)})" if pid else "its process"
        return (
            f"{process} was killed by SIGKILL (out of memory, kill -9, or ray stop --force) "
            "or crashed (Ray reports no exit status)"
        )
    return one_line(exc)
