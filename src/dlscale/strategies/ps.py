"""Strategy `ps`: parameter servers (averaging, asynchronous SGD, Downpour SGD), sharded.

One process group of `servers + workers` ranks: ranks 0..S-1 are servers, each holding one shard
of the parameters (whole tensors, balanced by size); the rest are workers, each training on its
own slice of every global batch. Requests are small header tensors (op, version, steps, worker
step) over torch.distributed point-to-point (gloo send/recv). The parameters and gradients
themselves travel on the data plane: when every process runs on one host, through buffers in
/dev/shm that a worker and a server both map (the server copies parameters straight into the
worker's model and reads its gradients where backward wrote them; one copy instead of a socket
round trip), else as gloo sends. A server answers each worker from a thread of its own, so one
slow worker never holds up the others, and serialises updates under one lock.

- averaging: each worker steps its own optimizer `local_steps` times, then sends its shard
  parameters to every server; a server waits for every live worker, takes the mean, and sends it
  back (synchronous parameter averaging).
- async / downpour: a worker pulls parameters (every step, or every `n_fetch`), computes
  gradients, and pushes them (every step, or their sum every `n_push`); the server applies each
  push at once with the spec's optimizer. The staleness of each update (server version minus the
  version it was computed from) is recorded; `max_staleness` makes a worker that is that many
  pushes ahead of the slowest live worker wait (stale-synchronous parallel).

Faults: workers send heartbeats through the process group's store; in async and downpour a
worker that dies (or goes silent for `heartbeat_timeout_s`) is dropped and the others finish.
Servers write their shard to `checkpoints/ps-shard-<s>.pt` every `checkpoint_every_s`; a server
that dies stops the job (the launcher names it) and `--resume` continues from those files.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dlscale.data import build_data
from dlscale.errors import UserError
from dlscale.launch.base import Launcher, Resources, WorkerContext, WorkerFailed
from dlscale.models import build_model, count_parameters
from dlscale.spec import PsStrategy, Spec, parse_spec
from dlscale.strategies.events import EventReporter, default_launcher
from dlscale.strategies.parent import evaluate_and_save, require_cpu_fp32, warned_events
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import peak_memory
from dlscale.train.files import write_atomic, write_json_atomic
from dlscale.train.loop import InProcessBatches, Plan, epoch_record
from dlscale.train.metrics import StepTiming, TimingTotals
from dlscale.train.record import process_group_record
from dlscale.train.reporter import NullReporter, Reporter
from dlscale.train.sampler import GlobalBatchSampler
from dlscale.train.step import build_optimizer, compute_loss, evaluate

PULL, PUSH, AVERAGE, DONE, PUSH_PULL = 1, 2, 3, 4, 5  # PUSH_PULL: apply, then send back
HEADER_FIELDS = 4  # op, version (or round), steps in the push, the worker's step count
HEARTBEAT_S = 1.0
PEER_DEATH_GRACE_S = 10.0
SHM_DIR = Path("/dev/shm")


# ------------------------------------------------------------------------------------ layout


def shard_parameters(sizes: list[int], servers: int) -> list[list[int]]:
    """Split parameter tensors (by index) over `servers`, balanced by elements: largest first,
    each to the least-loaded server. A tensor is never split."""
    if servers > len(sizes):
        raise UserError(
            f"strategy.servers {servers} is more than the model's {len(sizes)} parameter tensors"
        )
    loads, shards = [0] * servers, [[] for _ in range(servers)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(servers), key=lambda s: (loads[s], s))
        shards[target].append(index)
        loads[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def flatten(tensors: list[torch.Tensor], indices: list[int]) -> torch.Tensor:
    return torch.cat([tensors[i].detach().reshape(-1) for i in indices])


def unflatten_into(tensors: list[torch.Tensor], indices: list[int], flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for i in indices:
            n = tensors[i].numel()
            tensors[i].copy_(flat[offset : offset + n].view_as(tensors[i]))
            offset += n


def build_ps_model(spec: Spec) -> tuple[nn.Module, Any]:
    """The model every rank starts from (same seed: same initial weights), and the data."""
    torch.manual_seed(spec.seed)
    data = build_data(spec.data, spec.seed)
    model = build_model(spec.model.name, spec.model.kwargs, data.model_defaults())
    return model, data


def shard_path(run_dir: Path, shard: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"ps-shard-{shard}.pt"


# ------------------------------------------------------------------------------------ data plane


def slot_path(token: str, worker: int, server: int, kind: str) -> Path:
    """The /dev/shm file behind one worker's `kind` ('params' or 'grads') buffer for one shard."""
    return SHM_DIR / f"dlscale-{token}-w{worker}-s{server}-{kind}"


def map_shared(path: Path, elements: int) -> torch.Tensor:
    """A float32 tensor backed by `path` (created if missing) that every process mapping it sees."""
    return torch.from_file(str(path), shared=True, size=elements, dtype=torch.float32)


def host_id() -> str:
    """This machine: host name and boot id (two containers may share a host name)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return socket.gethostname() + (":" + boot.read_text().strip() if boot.exists() else "")


def choose_data_plane(asked: str, hosts: int, needed_bytes: int) -> tuple[str, str | None]:
    """'shm' or 'gloo' for a job whose processes run on `hosts` machines, and why not the one
    asked for, if it cannot be had. Shared memory needs one host and room in /dev/shm."""
    if asked == "gloo":
        return "gloo", None
    why = None
    if hosts > 1:
        why = f"the processes run on {hosts} hosts"
    elif not SHM_DIR.is_dir():
        why = f"{SHM_DIR} does not exist here"
    else:
        stat = os.statvfs(SHM_DIR)
        free = stat.f_bavail * stat.f_frsize
        if needed_bytes > free // 2:  # leave the rest to everything else that uses it
            why = (
                f"{SHM_DIR} has {free / 2**20:,.0f} MiB free and the buffers need "
                f"{needed_bytes / 2**20:,.0f} MiB"
            )
    if why is None:
        return "shm", None
    if asked == "shm":
        return "gloo", f"data_plane shm is not possible ({why}); using gloo"
    return "gloo", None


def agree_on_data_plane(store, context: WorkerContext, strategy: PsStrategy, elements: int) -> str:
    """Every rank says where it runs; rank 0 chooses the data plane and tells the others."""
    store.set(f"ps/host/{context.rank}", host_id())
    if context.rank == 0:
        hosts = {store.get(f"ps/host/{rank}") for rank in range(context.world_size)}
        needed = 2 * strategy.workers * elements * 4  # parameters and gradients per worker
        plane, why = choose_data_plane(strategy.data_plane, len(hosts), needed)
        if why:
            context.send("warn", why)
        store.set("ps/plane", plane)
    return store.get("ps/plane").decode()


def _reply(version: int) -> torch.Tensor:
    return torch.tensor([version, 0, 0, 0], dtype=torch.int64)


# ------------------------------------------------------------------------------------ server


class ParameterServer:
    """One shard of the parameters, its optimizer, and one thread per worker."""

    def __init__(
        self, spec: Spec, context: WorkerContext, indices: list[int], run_dir: Path, resume: bool
    ):
        self.spec, self.strategy, self.context = spec, spec.strategy, context
        shard = context.rank
        self.shard, self.run_dir = shard, Path(run_dir)
        self.servers, n_workers = self.strategy.servers, self.strategy.workers
        self.workers = list(range(self.servers, self.servers + n_workers))
        model, _ = build_ps_model(spec)
        params = list(model.parameters())
        self.flat = nn.Parameter(flatten(params, indices).clone())
        self.optimizer = build_optimizer([self.flat], spec.optimizer)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.version = 0
        self.cond = threading.Condition()
        self.changed = threading.Event()  # a worker finished, died or failed
        self.clock = dict.fromkeys(self.workers, 0)  # pushes (or averaging rounds) per worker
        self.worker_steps = dict.fromkeys(self.workers, 0)
        self.done: set[int] = set()
        self.dead: set[int] = set()
        self.staleness: Counter[int] = Counter()
        self.updates = 0
        self.requests: Counter[str] = Counter()  # served: pull, push, average (bytes follow)
        self.wait_s = 0.0  # time pulls spent held back by the staleness bound
        self.error: BaseException | None = None
        self.last_activity = time.monotonic()
        # averaging rounds
        self.round_sum: torch.Tensor | None = None
        self.round_members: set[int] = set()
        self.rounds_done = 0
        self.data_plane = "gloo"
        self.slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shm: (params, grads)
        if resume:
            self._load()

    # ---- state on disk

    def _state(self) -> dict:
        return {
            "format": ckpt.FORMAT_VERSION,
            "spec_hash": self.spec.spec_hash(),
            "shard": self.shard,
            "flat": self.flat.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "worker_steps": {str(k): v for k, v in self.worker_steps.items()},
            "updates": self.updates,
        }

    def checkpoint(self) -> None:
        with self.cond:
            state = self._state()
        path = shard_path(self.run_dir, self.shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda handle: torch.save(state, handle))

    def _load(self) -> None:
        state = load_shard(self.run_dir, self.shard, self.spec)
        with torch.no_grad():
            self.flat.copy_(state["flat"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.updates = state["version"], state["updates"]
        self.worker_steps = {int(k): v for k, v in state["worker_steps"].items()}

    # ---- serving

    def live(self) -> list[int]:
        return [w for w in self.workers if w not in self.done and w not in self.dead]

    def attach(self, token: str) -> None:
        """Map every worker's buffers for this shard (the workers created them), then remove
        their names: the mappings stay, and nothing is left in /dev/shm when the job ends."""
        elements = self.flat.numel()
        for worker in self.workers:
            paths = [slot_path(token, worker - self.servers, self.shard, kind)
                     for kind in ("params", "grads")]  # fmt: skip
            params, grads = (map_shared(path, elements) for path in paths)
            self.slots[worker] = (params, grads)
            for path in paths:
                path.unlink()
        self.data_plane = "shm"

    def serve(self, store) -> dict:
        t0 = time.perf_counter()
        for worker in self.workers:
            threading.Thread(
                target=self._handle, args=(worker,), daemon=True, name=f"ps-{worker}"
            ).start()
        beats: dict[int, tuple[int, float]] = {}
        self.checkpoint()  # from now on a --resume has this shard to start from
        last_checkpoint = time.monotonic()
        while True:
            # Woken when a worker finishes or fails; every update notifies `cond`, and the
            # heartbeat checks below (store round trips) would then run hundreds of times a second.
            self.changed.wait(timeout=HEARTBEAT_S / 2)
            self.changed.clear()
            with self.cond:
                if self.error is not None:
                    raise self.error
                if not self.live():
                    break
            now = time.monotonic()
            for worker in self.live():
                count = store.add(f"ps/beat/{worker}", 0)
                if worker not in beats or beats[worker][0] != count:
                    beats[worker] = (count, now)
                elif now - beats[worker][1] > self.strategy.heartbeat_timeout_s:
                    self.drop(worker, f"sent no heartbeat for {now - beats[worker][1]:.0f} s")
            if now - self.last_activity > self.strategy.timeout_s:
                raise UserError(
                    f"server {self.shard}: no message from any worker for "
                    f"{self.strategy.timeout_s:g} s (strategy.timeout_s)"
                )
            if now - last_checkpoint > self.strategy.checkpoint_every_s:
                self.checkpoint()
                last_checkpoint = now
        self.checkpoint()
        wall = time.perf_counter() - t0
        shard_bytes = self.flat.numel() * self.flat.element_size()
        bytes_in = shard_bytes * (self.requests["push"] + self.requests["average"])
        bytes_out = shard_bytes * (self.requests["pull"] + self.requests["average"])
        return {
            "role": "server",
            "shard": self.shard,
            "data_plane": self.data_plane,
            # numpy pickles by value; a tensor would travel as a shared-memory handle that dies
            # with this process.
            "flat": self.flat.detach().numpy().copy(),
            "elements": self.flat.numel(),
            "version": self.version,
            "updates": self.updates,
            "updates_per_s": self.updates / wall if wall else 0.0,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "bytes_per_s": (bytes_in + bytes_out) / wall if wall else 0.0,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "staleness_wait_s": self.wait_s,
            "dropped_workers": sorted(w - self.servers for w in self.dead),
            "wall_s": wall,
            "peak_memory_bytes": peak_memory(torch.device("cpu"))[0],
        }

    def drop(self, worker: int, why: str) -> None:
        """A worker that is alive but silent: the launcher cannot see it, so say so here."""
        with self.cond:
            if worker in self.done or worker in self.dead:
                return
            self.dead.add(worker)
            self.cond.notify_all()
        self.changed.set()
        self.context.send(
            "warn",
            f"server {self.shard}: worker {worker} {why}; training continues without it",
        )

    def _handle(self, worker: int) -> None:
        """Serve one worker. On shm, parameters go straight into the worker's buffer and its
        gradients are read where it wrote them; a push is acknowledged once applied, so the
        worker knows when it may write them again. On gloo, both travel as sends."""
        header = torch.zeros(HEADER_FIELDS, dtype=torch.int64)
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
                dist.recv(header, src=worker)
                op, version, _steps, worker_step = (int(v) for v in header)
                self.last_activity = time.monotonic()
                if ack is not None:
                    ack[0].wait()
                    ack = None
                if op == PULL:
                    version = self._pull(worker, params)
                    dist.send(_reply(version), dst=worker)
                    if not shared:
                        dist.send(params, dst=worker)
                elif op in (PUSH, PUSH_PULL):
                    if not shared:
                        dist.recv(grads, src=worker)
                    self._apply(worker, grads, version, worker_step)
                    if op == PUSH_PULL:
                        version = self._pull(worker, params)
                        dist.send(_reply(version), dst=worker)
                        if not shared:
                            dist.send(params, dst=worker)
                    elif shared:
                        reply = _reply(version)
                        ack = (dist.isend(reply, dst=worker), reply)  # the tensor lives on
                elif op == AVERAGE:
                    if not shared:
                        dist.recv(params, src=worker)
                    self._average(worker, params, version, worker_step)
                    dist.send(_reply(version) if shared else params, dst=worker)
                elif op == DONE:
                    with self.cond:
                        self.done.add(worker)
                        self.worker_steps[worker] = worker_step
                        self.cond.notify_all()
                    self.changed.set()
                    return
                else:
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

    def _pull(self, worker: int, out: torch.Tensor) -> int:
        """Copy the shard's parameters into `out` (once the staleness bound allows); the version."""
        bound = self.strategy.max_staleness
        with self.cond:
            if bound is not None:
                t0 = time.monotonic()

                def ahead() -> bool:
                    others = [self.clock[w] for w in self.live() if w != worker]
                    return bool(others) and self.clock[worker] - min(others) > bound

                while ahead():
                    if time.monotonic() - t0 > self.strategy.timeout_s:
                        raise TimeoutError(
                            f"waited {self.strategy.timeout_s:g} s on slower workers"
                        )
                    self.cond.wait(timeout=0.5)
                self.wait_s += time.monotonic() - t0
            self.requests["pull"] += 1
            out.copy_(self.flat.detach())
            return self.version

    def _apply(self, worker: int, grad: torch.Tensor, from_version: int, worker_step: int) -> None:
        with self.cond:
            staleness = self.version - from_version
            self.staleness[staleness] += 1
            self.requests["push"] += 1
            scale = 1.0 / (1 + staleness) if self.strategy.staleness_lr else 1.0
            for group, lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                group["lr"] = lr * scale
            self.flat.grad = grad
            self.optimizer.step()
            self.flat.grad = None
            self.version += 1
            self.updates += 1
            self.clock[worker] += 1
            self.worker_steps[worker] = worker_step
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
            self.clock[worker] += 1
            self.worker_steps[worker] = worker_step
            if self.round_members >= set(self.live()):
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


def load_shard(run_dir: Path, shard: int, spec: Spec) -> dict:
    path = shard_path(run_dir, shard)
    if not path.exists():
        raise UserError(f"nothing to resume: {path} is missing")
    state = ckpt.load_checkpoint(path, map_location="cpu")
    if state.get("spec_hash") != spec.spec_hash():
        raise UserError(
            f"{path} was written by a different spec; start a new run instead of --resume"
        )
    return state


# ------------------------------------------------------------------------------------ worker


class PsWorker:
    """One worker: its slice of every global batch, a local model, requests to every server."""

    def __init__(self, spec: Spec, context: WorkerContext, shards: list[list[int]], payload):
        self.spec, self.strategy, self.context = spec, spec.strategy, context
        self.shards = shards
        self.servers = len(shards)
        self.index = context.rank - self.servers  # 0..workers-1
        self.t_start = time.perf_counter()
        self.model, self.data = build_ps_model(spec)
        torch.manual_seed(spec.seed + 1 + self.index)  # dropout differs between workers
        self.params = list(self.model.parameters())
        # Each shard's parameters and gradients live in one flat buffer that the model's tensors
        # view: a pull lands straight in the model, a push sends the gradients as they are.
        self.flat_params = [flatten(self.params, indices).clone() for indices in shards]
        self.flat_grads = [torch.zeros_like(flat) for flat in self.flat_params]
        self._bind()
        self.shared = False  # shm data plane: the buffers are mapped by the servers too
        self.acks_due = [0] * self.servers  # shm pushes the server has not yet confirmed
        self.plan = Plan.of(spec, self.data.num_train, self.strategy.workers)
        self.sampler = GlobalBatchSampler(
            self.data.num_train, spec.batch_size, spec.seed, self.index, self.strategy.workers
        )
        self.loader = InProcessBatches(self.data.train, self.sampler)
        self.val_loader = torch.utils.data.DataLoader(
            self.data.val, batch_size=max(256, spec.batch_size)
        )
        self.averaging = self.strategy.mode == "averaging"
        self.optimizer = build_optimizer(self.params, spec.optimizer) if self.averaging else None
        self.versions = [0] * self.servers
        self.step = int(payload["start_steps"].get(str(self.index), 0))
        self.start_step = self.step
        self.timing = TimingTotals()
        self.wait_s = 0.0
        self.bytes_moved = 0
        self.epochs: list[dict] = []
        self.setup_s = time.perf_counter() - self.t_start
        self.is_main = self.index == 0
        self.events = EventReporter(context) if self.is_main else NullReporter()
        n_fetch = self.strategy.n_fetch if self.strategy.mode == "downpour" else 1
        n_push = self.strategy.n_push if self.strategy.mode == "downpour" else 1
        self.n_fetch, self.n_push = n_fetch, n_push

    def _bind(self) -> None:
        """Make the model's parameters and gradients views of the flat buffers."""
        buffers = zip(self.shards, self.flat_params, self.flat_grads, strict=True)
        for indices, flat, grads in buffers:
            offset = 0
            for i in indices:
                param, n = self.params[i], self.params[i].numel()
                param.data = flat[offset : offset + n].view_as(param)
                param.grad = grads[offset : offset + n].view_as(param)
                offset += n

    def share(self, token: str) -> None:
        """Move the buffers to /dev/shm files that the servers map next (shm data plane)."""
        for kind, buffers in (("params", self.flat_params), ("grads", self.flat_grads)):
            for server, flat in enumerate(buffers):
                mapped = map_shared(slot_path(token, self.index, server, kind), flat.numel())
                mapped.copy_(flat)
                buffers[server] = mapped
        self._bind()
        self.shared = True

    # ---- requests

    def _header(self, op: int, version: int = 0, steps: int = 0) -> torch.Tensor:
        return torch.tensor([op, version, steps, self.step], dtype=torch.int64)

    def pull(self) -> None:
        t0 = time.perf_counter()
        for server in range(self.servers):
            dist.send(self._header(PULL), dst=server)
        self._receive_parameters()
        self.wait_s += time.perf_counter() - t0

    def _receive_parameters(self) -> None:
        reply = torch.zeros(HEADER_FIELDS, dtype=torch.int64)
        for server, flat in enumerate(self.flat_params):
            self._await_acks(server, reply)
            dist.recv(reply, src=server)
            if not self.shared:
                dist.recv(flat, src=server)
            self.versions[server] = int(reply[0])
            self.bytes_moved += flat.numel() * flat.element_size()

    def push(self, steps: int, fetch: bool = False) -> None:
        """Send the gradients of the last `steps` steps; with `fetch`, take the parameters the
        server holds once it has applied them."""
        t0 = time.perf_counter()
        for server, flat in enumerate(self.flat_grads):
            op = PUSH_PULL if fetch else PUSH
            dist.send(self._header(op, self.versions[server], steps), dst=server)
            if not self.shared:
                dist.send(flat, dst=server)
            elif not fetch:
                self.acks_due[server] += 1  # the server reads them in place; confirmed later
            self.bytes_moved += flat.numel() * flat.element_size()
        if fetch:
            self._receive_parameters()  # the reply is also the acknowledgement
        self.wait_s += time.perf_counter() - t0

    def _await_acks(self, server: int, reply: torch.Tensor) -> None:
        while self.acks_due[server]:
            dist.recv(reply, src=server)
            self.acks_due[server] -= 1

    def gradients_free(self) -> None:
        """Wait until every server has applied the gradients pushed from the shared buffers,
        before backward writes new ones there (shm only; a gloo push sent a copy)."""
        if any(self.acks_due):
            t0 = time.perf_counter()
            reply = torch.zeros(HEADER_FIELDS, dtype=torch.int64)
            for server in range(self.servers):
                self._await_acks(server, reply)
            self.wait_s += time.perf_counter() - t0

    def average(self, round_: int) -> None:
        t0 = time.perf_counter()
        for server, flat in enumerate(self.flat_params):
            dist.send(self._header(AVERAGE, round_), dst=server)
            if not self.shared:
                dist.send(flat, dst=server)
        reply = torch.zeros(HEADER_FIELDS, dtype=torch.int64)
        for server, flat in enumerate(self.flat_params):
            dist.recv(reply if self.shared else flat, src=server)  # shm: the mean is in place
            self.bytes_moved += 2 * flat.numel() * flat.element_size()
        self.wait_s += time.perf_counter() - t0

    def done(self) -> None:
        self.gradients_free()
        for server in range(self.servers):
            dist.send(self._header(DONE), dst=server)

    # ---- training

    def describe(self) -> dict:
        return {
            "name": self.spec.name,
            "model": self.spec.model.name,
            "parameters": count_parameters(self.model),
            "device": "cpu",
            "precision": self.spec.precision,
            "train_samples": self.data.num_train,
            "val_samples": len(self.data.val),
            "start_step": self.step,
            "workers": self.strategy.workers,
            **self.plan.__dict__,
        }

    def run(self) -> dict:
        self.events.start(self.describe())
        self.pull()  # everyone starts from the servers' parameters
        self.t_train = time.perf_counter()
        straggler = self.strategy.straggler
        slow = straggler.factor if straggler and straggler.worker == self.index else 1.0
        accumulated = 0
        rounds = self.step // self.strategy.local_steps if self.averaging else 0
        self.model.train()
        while self.step < self.plan.total_steps:
            epoch = self.step // self.plan.steps_per_epoch
            self.sampler.set_epoch(epoch, self.step - epoch * self.plan.steps_per_epoch)
            losses = []
            t_prev = time.perf_counter()
            for x, y in self.loader:
                t_data = time.perf_counter()
                wait_before = self.wait_s
                t_compute = time.perf_counter()
                if accumulated == 0:
                    self.gradients_free()
                    for grads in self.flat_grads:
                        grads.zero_()
                loss = compute_loss(self.model(x), y)
                loss.backward()
                if self.averaging:
                    self.optimizer.step()  # the gradients are zeroed before the next backward
                losses.append(float(loss.detach()))
                compute_s = time.perf_counter() - t_compute
                if slow > 1.0:
                    time.sleep((slow - 1.0) * compute_s)
                self.step += 1
                if self.averaging:
                    if self.step % self.strategy.local_steps == 0:
                        rounds += 1
                        self.average(rounds)
                else:
                    # Parameters for the next step come back with the push that they follow
                    # (one request: the server applies the gradients, then replies with them).
                    accumulated += 1
                    if accumulated == self.n_push:
                        fetch = self.step % self.n_fetch == 0
                        self.push(accumulated, fetch and self.step < self.plan.total_steps)
                        accumulated = 0
                t_end = time.perf_counter()
                comm = self.wait_s - wait_before
                self.timing.add(StepTiming(t_data - t_prev, 0.0, t_end - t_data - comm), len(y))
                self.timing.add_comm(comm, 0)
                rate = len(y) * self.strategy.workers / max(t_end - t_prev, 1e-9)
                self.events.step(self.step, epoch + 1, losses[-1], rate)
                t_prev = time.perf_counter()
                if self.step >= self.plan.total_steps:
                    break
            if self.is_main and (
                self.step % self.plan.steps_per_epoch == 0 or self.step >= self.plan.total_steps
            ):
                self._end_epoch(epoch, losses)
        if self.averaging and self.step % self.strategy.local_steps:
            self.average(rounds + 1)
        if accumulated:
            self.push(accumulated)
        self.done()
        return self.summary()

    def _end_epoch(self, epoch: int, losses: list[float]) -> None:
        validation = evaluate(self.model, self.val_loader, torch.device("cpu"), "fp32")
        self.model.train()
        record = epoch_record(epoch, self.step, losses, validation, self.timing, self.t_start)
        self.epochs.append(record)
        self.events.epoch_end(record)

    def summary(self) -> dict:
        wall = time.perf_counter() - self.t_train
        return {
            "role": "worker",
            "rank": self.index,
            "node": self.context.node,
            "steps": self.step - self.start_step,
            "samples": self.timing.samples,
            "samples_per_s": self.timing.samples / wall if wall > 0 else 0.0,
            "compute_s": self.timing.compute_s,
            "wait_s": self.wait_s,
            "wait_share": self.wait_s / wall if wall > 0 else 0.0,
            "bytes_moved": self.bytes_moved,
            "train_wall_s": wall,
            "setup_s": self.setup_s,
            "peak_memory_bytes": peak_memory(torch.device("cpu"))[0],
            "timing": self.timing.to_state(),
            "epochs": self.epochs,
            "buffers": {k: v.numpy().copy() for k, v in self.model.named_buffers()},
        }


def _heartbeat(store, rank: int, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            store.add(f"ps/beat/{rank}", 1)
        except Exception:  # the store went away: the job is ending
            return


def ps_process(context: WorkerContext, payload: dict) -> dict:
    """Every rank of a ps job: servers first, then workers."""
    spec = parse_spec(payload["spec"])
    strategy = spec.strategy
    torch.set_num_threads(1)
    shards = payload["shards"]
    # Everything is built before the process group exists: on the development machine, a
    # torch.optim optimizer created after init_process_group made every later gloo send of a
    # 4 MB tensor take 11 ms instead of 1.3 ms (README, "Parameter-server update throughput").
    if context.rank < strategy.servers:
        role = ParameterServer(
            spec, context, shards[context.rank], Path(payload["run_dir"]), payload["resume"]
        )
    else:
        role = PsWorker(spec, context, shards, payload)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{context.master_addr}:{context.master_port}",
        rank=context.rank,
        world_size=context.world_size,
        timeout=timedelta(seconds=strategy.timeout_s),
    )
    store = dist.distributed_c10d._get_default_store()
    elements = sum(payload["shard_elements"])
    if agree_on_data_plane(store, context, strategy, elements) == "shm":
        if isinstance(role, PsWorker):
            role.share(payload["token"])
        dist.barrier()  # every worker's buffers exist
        if isinstance(role, ParameterServer):
            role.attach(payload["token"])
        dist.barrier()  # every server has mapped them
    if isinstance(role, ParameterServer):
        # No destroy_process_group: a dropped worker's receive thread may still be waiting.
        return role.serve(store)
    stop = threading.Event()
    threading.Thread(
        target=_heartbeat, args=(store, context.rank, stop), daemon=True, name="ps-heartbeat"
    ).start()
    try:
        return role.run()
    except RuntimeError:  # gloo reports a lost peer as a RuntimeError (DistError or not)
        # A server died under us: the launcher sees its exit, names it and stops the job within
        # a moment; a traceback from here would only bury that line. If it does not, fail.
        time.sleep(PEER_DEATH_GRACE_S)
        raise
    finally:
        stop.set()


# ------------------------------------------------------------------------------------ parent


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
) -> dict:
    """Start the servers and workers; assemble, evaluate and save the final model."""
    launcher = default_launcher(launcher)
    reporter = reporter or NullReporter()
    strategy: PsStrategy = spec.strategy
    require_cpu_fp32(spec, "workers")
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    model, data = build_ps_model(spec)
    params = list(model.parameters())
    shards = shard_parameters([p.numel() for p in params], strategy.servers)
    Plan.of(spec, data.num_train, strategy.workers)  # a batch too large is one line, here
    resume = resume_from is not None
    start_steps: dict[str, int] = {}
    if resume:
        states = [load_shard(run_dir, s, spec) for s in range(strategy.servers)]
        for worker in range(strategy.workers):
            key = str(strategy.servers + worker)
            start_steps[str(worker)] = min(int(s["worker_steps"].get(key, 0)) for s in states)
    payload = {
        "spec": spec.model_dump(mode="json"),
        "run_dir": str(run_dir),
        "shards": shards,
        "resume": resume,
        "start_steps": start_steps,
        "shard_elements": [sum(params[i].numel() for i in shard) for shard in shards],
        "token": uuid.uuid4().hex[:12],  # names this job's shared buffers
    }
    run_dir.mkdir(parents=True, exist_ok=True)

    expendable = frozenset()
    if strategy.mode != "averaging":
        expendable = frozenset(range(strategy.servers, strategy.servers + strategy.workers))
    warnings, collect = warned_events(spec, reporter, lambda m: role_names(m, strategy.servers))

    if not resume:  # the starting point: what a bare --resume finds before any shard is saved
        ckpt.save_checkpoint(
            run_dir, 0, {"spec_hash": spec.spec_hash(), "model": model.state_dict(),
                         "strategy": "ps"}, spec.checkpoint.keep_last,
        )  # fmt: skip
    try:
        results = launcher.run(
            ps_process, payload, strategy.servers + strategy.workers, Resources(cpus=1.0),
            strategy.port, collect, expendable,
        )  # fmt: skip
    except WorkerFailed as exc:
        raise WorkerFailed(role_names(str(exc), strategy.servers)) from None
    finally:  # a job stopped before the servers mapped the workers' buffers leaves their files
        for path in SHM_DIR.glob(f"dlscale-{payload['token']}-*") if SHM_DIR.is_dir() else ():
            path.unlink(missing_ok=True)
    servers, workers = results[: strategy.servers], results[strategy.servers :]
    alive = [w for w in workers if w is not None]
    if not alive:
        raise UserError("every worker died; nothing was trained to the end")
    for server, indices in zip(servers, shards, strict=True):
        unflatten_into(params, indices, torch.tensor(server["flat"]))  # Ray: read-only array
    main = next((w for w in workers if w is not None and w["epochs"]), alive[0])
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(torch.tensor(main["buffers"][name]))
    step = max(w["steps"] + int(start_steps.get(str(w["rank"]), 0)) for w in alive)
    final = evaluate_and_save(spec, run_dir, model, data, step)
    record = ps_record(
        spec, run_dir, model, data, servers, workers, shards, main, warnings, final, started_at,
        time.perf_counter() - t_start, resume,
    )  # fmt: skip
    write_json_atomic(run_dir / "run.json", record)
    reporter.finish(record)
    return record


def role_names(message: str, servers: int) -> str:
    """The launcher numbers every process 'worker N'; a ps job calls them servers and workers."""

    def name(match: re.Match) -> str:
        rank = int(match.group(1))
        return f"server {rank}" if rank < servers else f"worker {rank - servers}"

    return re.sub(r"\bworker (\d+)", name, message)


def ps_record(
    spec, run_dir, model, data, servers, workers, shards, main, warnings, final, started_at,
    wall_s, resumed,
) -> dict:  # fmt: skip
    """run.json for a ps job: the common schema, plus `ps` (servers, staleness, traffic)."""
    strategy = spec.strategy
    alive = [w for w in workers if w is not None]
    samples = sum(w["samples"] for w in alive)
    train_wall = max(w["train_wall_s"] for w in alive)
    staleness: Counter[int] = Counter()
    for server in servers:
        staleness.update({int(k): v for k, v in server["staleness"].items()})
    updates = sum(s["updates"] for s in servers)
    server_wall = max(s["wall_s"] for s in servers)
    plan = Plan.of(spec, data.num_train, strategy.workers)
    mean_staleness = (
        sum(k * v for k, v in staleness.items()) / sum(staleness.values()) if staleness else 0.0
    )
    record = process_group_record(
        spec, run_dir, model, data, plan, main, warnings, final, started_at, wall_s,
        (samples, train_wall, len(alive)),
        max(p["peak_memory_bytes"] for p in [*servers, *alive]),
        min(w["steps"] for w in alive) if resumed else None,
    )  # fmt: skip
    return {
        **record,
        "ps": {
            "mode": strategy.mode,
            "workers": strategy.workers,
            "servers": strategy.servers,
            "data_plane": servers[0]["data_plane"],
            "updates": updates,
            "updates_per_s": updates / server_wall if server_wall else 0.0,
            "bytes_per_s": sum(s["bytes_per_s"] for s in servers),
            "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
            "mean_staleness": mean_staleness,
            "max_staleness": max(staleness) if staleness else 0,
            "dropped_workers": sorted({w for s in servers for w in s["dropped_workers"]}),
            "per_server": [
                {
                    "shard": s["shard"],
                    "tensors": len(indices),
                    "elements": s["elements"],
                    "updates": s["updates"],
                    "updates_per_s": s["updates_per_s"],
                    "bytes_in": s["bytes_in"],
                    "bytes_out": s["bytes_out"],
                    "bytes_per_s": s["bytes_per_s"],
                    "staleness_wait_s": s["staleness_wait_s"],
                }
                for s, indices in zip(servers, shards, strict=True)
            ],
        },
        "workers": [
            {k: v for k, v in w.items() if k not in ("buffers", "timing", "epochs", "role")}
            if w is not None
            else {"rank": i, "status": "died"}
            for i, w in enumerate(workers)
        ],
    }
