"""RayPool: pool tasks (a sweep's trials) on long-lived Ray actors, one per slot."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from dlscale.errors import UserError, one_line
from dlscale.launch.base import Resources, TaskDone, WorkerContext, WorkerFn, drain_events
from dlscale.launch.ray_cluster import check_capacity, events_queue, leave


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
        self.ray, self.connected_here, self.slots = ray, connected_here, slots
        check_capacity(ray, [resources])
        self.events = events_queue(ray)
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
