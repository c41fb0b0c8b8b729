"""A parameter server: one shard of the parameters, its optimizer, a thread per worker.

Each request is answered from the worker's own thread, so one slow worker never holds up the
others; updates are serialised under one lock. The shard is saved to
`checkpoints/ps-shard-<s>.pt` at start, every `checkpoint_every_s` and at the end.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dlscale.atomic import write_atomic
from dlscale.errors import UserError
from dlscale.jobspec import Spec
from dlscale.strategies.ps import rules
from dlscale.strategies.ps.layout import flatten
from dlscale.strategies.ps.wire import (
    AVERAGE,
    DONE,
    FINISH,
    PULL,
    PUSH,
    PUSH_PULL,
    empty_header,
    map_shared,
    put_record,
    reply,
    slot_path,
)
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import peak_memory
from dlscale.train.spec_change import check_resumable
from dlscale.train.step import build_optimizer

HEARTBEAT_S = 1.0


def shard_path(run_dir: Path, shard: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"ps-shard-{shard}.pt"


def load_shard(run_dir: Path, shard: int, spec: Spec) -> dict:
    path = shard_path(run_dir, shard)
    if not path.exists():
        raise UserError(f"nothing to resume: {path} is missing")
    state = ckpt.load_checkpoint(path, map_location="cpu")
    check_resumable(state, path, spec, run_dir)
    return state


class ParameterServer:
    """One shard of the parameters, its optimizer, and one thread per worker."""

    def __init__(
        self,
        spec: Spec,
        rank: int,
        params: list[torch.Tensor],
        indices: list[int],
        run_dir: Path,
        resume: bool,
    ):
        self.spec, self.strategy = spec, spec.strategy
        self.shard, self.run_dir = rank, Path(run_dir)
        self.servers = self.strategy.servers
        self.where: dict = {}  # the host it runs on, by name and address, for the run record
        self.workers = list(range(self.servers, self.servers + self.strategy.workers))
        self.main = self.workers[0]  # worker 0 evaluates, writes, and finishes last
        self.flat = nn.Parameter(flatten(params, indices).clone())
        self.optimizer = build_optimizer([self.flat], spec.optimizer)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.version = self.updates = 0
        self.cond = threading.Condition()
        self.changed = threading.Event()  # a worker finished, died or failed
        self.finished = threading.Event()  # the main worker has its final answer
        self.clock = dict.fromkeys(self.workers, 0)  # pushes (or averaging rounds) per worker
        self.worker_steps = dict.fromkeys(self.workers, 0)
        self.done: set[int] = set()
        self.dead: set[int] = set()
        self.staleness: Counter[int] = Counter()
        self.max_clock_gap = 0
        self.requests: Counter[str] = Counter()  # served: pull, push, average (bytes follow)
        self.wait_s = 0.0  # time pulls spent held back by the staleness bound
        self.error: BaseException | None = None
        self.last_activity = time.monotonic()
        self.round_sum: torch.Tensor | None = None
        self.round_members: set[int] = set()
        self.rounds_done = 0
        self.data_plane = "gloo"
        self.slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shm: (params, grads)
        self.t0 = time.perf_counter()
        if resume:
            self._load()

    # ---- state on disk

    def checkpoint(self) -> None:
        with self.cond:
            state = {
                "spec_hash": self.spec.spec_hash(),
                "spec": self.spec.model_dump(mode="json"),  # what a --resume compares with
                "shard": self.shard,
                "flat": self.flat.detach().clone(),
                # A copy: state_dict() shares the momentum buffers, which the workers' threads
                # update in place while the file is written after the lock is let go.
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "version": self.version,
                "worker_steps": {str(k): v for k, v in self.worker_steps.items()},
                "updates": self.updates,
            }
        path = shard_path(self.run_dir, self.shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = ckpt.sealed(state)  # the digest: outside the lock, over the copies
        write_atomic(path, lambda handle: torch.save(payload, handle))

    def _load(self) -> None:
        state = load_shard(self.run_dir, self.shard, self.spec)
        with torch.no_grad():
            self.flat.copy_(state["flat"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.updates = state["version"], state["updates"]
        self.worker_steps = {int(k): v for k, v in state["worker_steps"].items()}

    def continue_from(self, flat: torch.Tensor, start_steps: dict[str, int]) -> None:
        """Resume from a checkpoint newer than the shard: its weights for this shard, and each
        worker's step there (the optimizer state stays the shard's)."""
        with torch.no_grad():
            self.flat.copy_(flat)
        self.worker_steps = {w: start_steps[str(w - self.servers)] for w in self.workers}

    # ---- serving

    def live(self) -> list[int]:
        return [w for w in self.workers if w not in self.done and w not in self.dead]

    def attach(self, token: str) -> None:
        """Map every worker's buffers for this shard (the workers created them), then remove
        their names: the mappings stay, and nothing is left in /dev/shm when the job ends."""
        elements = self.flat.numel()
        for worker in self.workers:
            paths = [
                slot_path(token, worker - self.servers, self.shard, kind)
                for kind in ("params", "grads")
            ]
            self.slots[worker] = tuple(map_shared(path, elements) for path in paths)
            for path in paths:
                path.unlink()
        self.data_plane = "shm"

    def serve(self, store, send_warning) -> dict:
        """Answer every worker until the main one has its final parameters; the statistics."""
        self.store = store
        for worker in self.workers:
            threading.Thread(
                target=self._handle, args=(worker,), daemon=True, name=f"ps-{worker}"
            ).start()
        beats: dict[int, tuple[int, float]] = {}
        self.checkpoint()  # from now on a --resume has this shard to start from
        every_s = self.strategy.checkpoint_every_s
        next_checkpoint = time.monotonic() + every_s
        while not self.finished.is_set():
            # Woken when a worker finishes or fails; every update notifies `cond`, and the
            # heartbeat checks below (store round trips) would then run hundreds of times a second.
            # Woken, too, when the next save is due: a fixed poll would make it up to a poll late.
            due_in_s = next_checkpoint - time.monotonic()
            self.changed.wait(timeout=max(0.0, min(HEARTBEAT_S / 2, due_in_s)))
            self.changed.clear()
            with self.cond:
                if self.error is not None:
                    raise self.error
            now = time.monotonic()
            for worker in self.live():
                count = store.add(f"ps/beat/{worker}", 0)
                if worker not in beats or beats[worker][0] != count:
                    beats[worker] = (count, now)
                elif now - beats[worker][1] > self.strategy.heartbeat_timeout_s:
                    why = f"sent no heartbeat for {now - beats[worker][1]:.0f} s"
                    self.drop(worker, why, send_warning)
            if self.live() and now - self.last_activity > self.strategy.timeout_s:
                raise UserError(
                    f"server {self.shard}: no message from any worker for "
                    f"{self.strategy.timeout_s:g} s (strategy.timeout_s)"
                )
            if time.monotonic() >= next_checkpoint:
                self.checkpoint()
                # The period runs from save to save: a slow save never makes the next one due
                # at once, and a missed period is not made up by a burst of saves.
                next_checkpoint = time.monotonic() + every_s
        return self.statistics()

    def statistics(self) -> dict:
        wall = time.perf_counter() - self.t0
        shard_bytes = self.flat.numel() * self.flat.element_size()
        bytes_in = shard_bytes * (self.requests["push"] + self.requests["average"])
        bytes_out = shard_bytes * (self.requests["pull"] + self.requests["average"])
        return {
            "shard": self.shard,
            "data_plane": self.data_plane,
            "elements": self.flat.numel(),
            "version": self.version,
            "updates": self.updates,
            "updates_per_s": self.updates / wall if wall else 0.0,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "bytes_per_s": (bytes_in + bytes_out) / wall if wall else 0.0,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "staleness_wait_s": self.wait_s,
            "max_clock_gap": self.max_clock_gap,
            "dropped_workers": sorted(w - self.servers for w in self.dead),
            "wall_s": wall,
            "peak_memory_bytes": peak_memory(torch.device("cpu"))[0],
            **self.where,
        }

    def drop(self, worker: int, why: str, send_warning) -> None:
        """A worker that is alive but silent: the launcher cannot see it, so say so here."""
        with self.cond:
            if worker in self.done or worker in self.dead:
                return
            self.dead.add(worker)
            self.cond.notify_all()
        self.changed.set()
        send_warning(f"server {self.shard}: worker {worker} {why}; training continues without it")

    def _handle(self, worker: int) -> None:
        """Serve one worker. On shm, parameters go straight into the worker's buffer and its
        gradients are read where it wrote them; a push is acknowledged once applied, so the
        worker knows when it may write them again. On gloo, both travel as sends."""
        request = empty_header()
        shared = worker in self.slots
        if shared:
            params, grads = self.slots[worker]
        else:
            params = grads = torch.empty_like(self.flat.detach())  # received, or to be sent
        # An acknowledgement goes out without waiting for the worker to take it (a gloo send
        # waits for the matching receive, and the worker may be sending its next request); the
        # worker takes it before its next request is answered, so it is waited for then.
        ack: tuple[dist.Work, torch.Tensor] | None = None
        try:
            while True:
                dist.recv(request, src=worker)
                op, version, _steps, worker_step = (int(v) for v in request)
                self.last_activity = time.monotonic()
                if ack is not None:
                    ack[0].wait()
                    ack = None
                if op in (PUSH, PUSH_PULL):
                    if not shared:
                        dist.recv(grads, src=worker)
                    self._apply(worker, grads, version, worker_step)
                    if op == PUSH and shared:
                        answer = reply(self.version)
                        ack = (dist.isend(answer, dst=worker), answer)  # the tensor lives on
                if op in (PULL, PUSH_PULL):
                    self._answer(worker, self._pull(worker, params), params, shared)
                elif op == AVERAGE:
                    if not shared:
                        dist.recv(params, src=worker)
                    self._average(worker, params, version, worker_step)
                    dist.send(reply(version) if shared else params, dst=worker)
                elif op in (DONE, FINISH):
                    self._done(worker, worker_step)
                    if op == FINISH:
                        self._finish(worker, params, shared)
                    return
                elif op != PUSH:
                    raise RuntimeError(f"unknown request {op} from rank {worker}")
        except BaseException as exc:  # a lost peer in async modes; anything else stops the job
            with self.cond:
                if worker in self.dead:
                    return
                if self.strategy.mode != "averaging" and isinstance(exc, RuntimeError):
                    self.dead.add(worker)
                else:
                    self.error = exc
                self.cond.notify_all()
            self.changed.set()

    def _answer(self, worker: int, version: int, params: torch.Tensor, shared: bool) -> None:
        dist.send(reply(version), dst=worker)
        if not shared:
            dist.send(params, dst=worker)

    def _done(self, worker: int, worker_step: int) -> None:
        with self.cond:
            self.done.add(worker)
            self.worker_steps[worker] = worker_step
            self.cond.notify_all()
        self.changed.set()

    def _finish(self, worker: int, params: torch.Tensor, shared: bool) -> None:
        """The main worker is done: once every other live worker is too, save the shard, post
        the statistics and answer with the final parameters."""
        with self.cond:
            while self.live() and self.error is None:
                self.cond.wait(timeout=HEARTBEAT_S)
            params.copy_(self.flat.detach())
            version = self.version
        self.checkpoint()
        put_record(self.store, f"stats/{self.shard}", self.statistics())
        self.store.set(f"ps/final/{self.shard}", str(version))
        self._answer(worker, version, params, shared)
        self.finished.set()
        self.changed.set()

    def _pull(self, worker: int, out: torch.Tensor) -> int:
        """Copy the shard's parameters into `out` (once the staleness bound allows); the version."""
        bound = self.strategy.max_staleness
        with self.cond:
            t0 = time.monotonic()
            while rules.ssp_must_wait(self.clock, worker, self.live(), bound):
                if time.monotonic() - t0 > self.strategy.timeout_s:
                    raise TimeoutError(f"waited {self.strategy.timeout_s:g} s on slower workers")
                self.cond.wait(timeout=0.5)
            self.wait_s += time.monotonic() - t0
            self.requests["pull"] += 1
            out.copy_(self.flat.detach())
            return self.version

    def _tick(self, worker: int, worker_step: int) -> None:
        """A push or an average from `worker` counted (under the lock)."""
        self.clock[worker] += 1
        self.worker_steps[worker] = worker_step
        self.max_clock_gap = max(self.max_clock_gap, rules.clock_gap(self.clock, self.live()))

    def _apply(self, worker: int, grad: torch.Tensor, from_version: int, worker_step: int) -> None:
        with self.cond:
            stale = rules.staleness(self.version, from_version)
            self.staleness[stale] += 1
            self.requests["push"] += 1
            scale = rules.staleness_lr_scale(stale, self.strategy.staleness_lr)
            rules.apply_gradient(self.flat, grad, self.optimizer, self.base_lrs, scale)
            self.version += 1
            self.updates += 1
            self._tick(worker, worker_step)
            self.cond.notify_all()

    def _average(self, worker: int, params: torch.Tensor, round_: int, worker_step: int) -> None:
        """Add `params` to this round's sum; once every live worker has, the mean becomes the
        shard's parameters; then copy them back into `params`."""
        with self.cond:
            if self.round_sum is None:
                self.round_sum = params.clone()
            else:
                self.round_sum += params
            self.round_members.add(worker)
            self.requests["average"] += 1
            self._tick(worker, worker_step)
            if rules.round_complete(self.round_members, self.live()):
                with torch.no_grad():
                    self.flat.copy_(self.round_sum / len(self.round_members))
                self.round_sum, self.round_members = None, set()
                self.version += 1
                self.updates += 1
                self.rounds_done = round_
                self.cond.notify_all()
            t0 = time.monotonic()
            while self.rounds_done < round_:
                if self.error is not None or time.monotonic() - t0 > self.strategy.timeout_s:
                    raise TimeoutError(f"averaging round {round_} did not complete")
                self.cond.wait(timeout=0.5)
            params.copy_(self.flat.detach())
