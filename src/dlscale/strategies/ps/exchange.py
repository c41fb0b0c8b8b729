"""A parameter-server worker's exchange: pull the servers' weights, push gradients after
backward (async, Downpour) or average weights every `local_steps` (averaging), finish last.

The worker trains through the one loop like every other strategy; this class only moves its
flat gradient and parameter buffers to and from the servers.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from dlscale.jobspec import Spec
from dlscale.launch.base import WorkerContext
from dlscale.strategies.ps import rules
from dlscale.strategies.ps.layout import FlatShards
from dlscale.strategies.ps.section import ps_sections
from dlscale.strategies.ps.server import HEARTBEAT_S
from dlscale.strategies.ps.wire import (
    AVERAGE,
    DONE,
    FINISH,
    GATHERED,
    PULL,
    PUSH,
    PUSH_PULL,
    agree_on_data_plane,
    empty_header,
    get_record,
    header,
    map_shared,
    put_record,
    slot_path,
)
from dlscale.strategies.worker import join, ready
from dlscale.train.exchange import Exchange
from dlscale.train.plan import Plan

FINAL_POLL_S = 1.0  # how often the main worker looks for the servers' final answer


class PsExchange(Exchange):
    name = "ps"
    lockstep = False  # each worker keeps its own pace (and history)

    def __init__(self, spec: Spec, context: WorkerContext, payload: dict):
        strategy = spec.strategy
        self.spec, self.strategy, self.context, self.payload = spec, strategy, context, payload
        self.servers = strategy.servers
        self.rank = self.data_rank = context.rank - self.servers  # 0..workers-1
        self.trainers = self.data_world = strategy.workers
        self.updates_locally = self.averaging = strategy.mode == "averaging"
        downpour = strategy.mode == "downpour"
        self.n_fetch = strategy.n_fetch if downpour else 1
        self.n_push = strategy.n_push if downpour else 1
        straggler = strategy.straggler
        self.slow = straggler.factor if straggler and straggler.worker == self.rank else 1.0
        self.step = int(payload["start_steps"].get(str(self.rank), 0))
        self.accumulated = 0
        self.versions = [0] * self.servers
        self.acks_due = [0] * self.servers  # shm pushes the server has not yet confirmed
        self.shared = False
        self.wait_s, self.bytes_moved = 0.0, 0
        self.heartbeat_stop = threading.Event()
        self.heartbeat: threading.Thread | None = None
        self.server_stats: list[dict] = []

    # ---- setting up

    def prepare(self, model: nn.Module, data, device: torch.device) -> nn.Module:
        model.to(device)
        self.buffers = FlatShards(model, self.payload["shards"], device)
        self.last_step = Plan.of(self.spec, data.num_train, self.trainers).total_steps
        return model

    def connect(self, module: nn.Module, optimizer) -> None:
        # Everything is built before the process group exists: on the development machine, a
        # torch.optim optimizer created after init_process_group made every later gloo send of a
        # 4 MB tensor take 11 ms instead of 1.3 ms (docs/performance.md, "Parameter-server update
        # throughput").
        join(self.context, "gloo", self.strategy.timeout_s)
        self.store = dist.distributed_c10d._get_default_store()
        elements = sum(self.payload["shard_elements"])
        needed = 2 * self.strategy.workers * elements * 4  # parameters and gradients per worker
        plane = agree_on_data_plane(self.store, self.context, self.strategy.data_plane, needed)
        if plane == "shm":
            self._share(self.payload["token"])
            dist.barrier()  # every worker's buffers exist
            dist.barrier()  # every server has mapped them
        self.heartbeat = threading.Thread(target=self._heartbeat, daemon=True, name="ps-heartbeat")
        self.heartbeat.start()
        # Every process has met the others and the servers serve this worker: from now on they
        # train on without it if it dies (worker 0 may step before this trainer is built).
        ready(self.context)

    def _share(self, token: str) -> None:
        """Move the host buffers to /dev/shm files that the servers map next."""
        buffers = self.buffers
        mapped = {
            kind: [
                map_shared(slot_path(token, self.rank, server, kind), flat.numel())
                for server, flat in enumerate(flats)
            ]
            for kind, flats in (("params", buffers.host_params), ("grads", buffers.host_grads))
        }
        buffers.replace_host(mapped["params"], mapped["grads"])
        self.shared = True

    def _heartbeat(self) -> None:
        while not self.heartbeat_stop.wait(HEARTBEAT_S):
            try:
                self.store.add(f"ps/beat/{self.context.rank}", 1)
            except Exception:  # the store went away: the job is ending
                return

    def _stop_heartbeat(self) -> None:
        """Beats stop mattering once the servers hear DONE or FINISH (they watch live workers
        only), and a beat sent after server 0 has left (with the store it hosts) fails with a
        C++ traceback on stderr: stop them before, and wait for one under way."""
        self.heartbeat_stop.set()
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=self.strategy.timeout_s)

    def start(self) -> None:
        self.pull()  # everyone starts from the servers' parameters
        self.rounds = self.step // self.strategy.local_steps if self.averaging else 0

    def close(self, finished: bool) -> None:
        self.heartbeat_stop.set()
        # No barrier: servers may still be answering workers that run late. A finished worker
        # has nothing in flight and leaves its group; after a failure the launcher reaps it.
        if finished and dist.is_initialized():
            dist.destroy_process_group()

    def gather(self, value):
        """No collectives between workers (one that dies must not hold up the others): a
        checkpoint holds worker 0's random state only; the summaries travel at `finish`."""
        return [value] if self.is_main else None

    def resume_step(self, step: int) -> int:
        return self.step  # what the servers recorded for this worker

    # ---- around the step

    def zero_grad(self, optimizer) -> None:
        self.t_step = time.perf_counter()
        if self.accumulated == 0:  # Downpour sums n_push steps' gradients before a push
            self.gradients_free()
            self.buffers.zero_grads()

    def after_backward(self, step) -> None:
        self.compute_s = time.perf_counter() - self.t_step

    def after_update(self, step) -> None:
        if self.slow > 1.0:  # the straggler experiment: this worker computes `slow` times slower
            time.sleep((self.slow - 1.0) * self.compute_s)
        self.step += 1
        if self.averaging:
            if rules.averaging_due(self.step, self.strategy.local_steps):
                self.rounds += 1
                self.average(self.rounds)
            return
        self.accumulated += 1
        push, fetch = rules.downpour_actions(
            self.step, self.accumulated, self.n_push, self.n_fetch, self.last_step
        )
        if push and step.unscale():  # fp16: the summed gradients overflowed; drop them
            self.accumulated = 0
            step.update_scale()
            return
        if push:
            # Parameters for the next step come back with the push that they follow (one
            # request: the server applies the gradients, then replies with them).
            self.push(self.accumulated, fetch)
            self.accumulated = 0
            step.update_scale()

    def comm_totals(self) -> tuple[float, int]:
        return self.wait_s, self.bytes_moved

    # ---- requests

    def _header(self, op: int, version: int = 0, steps: int = 0) -> torch.Tensor:
        return header(op, version, steps, self.step)

    def _timed(self, t0: float) -> None:
        self.wait_s += time.perf_counter() - t0

    def pull(self) -> None:
        t0 = time.perf_counter()
        for server in range(self.servers):
            dist.send(self._header(PULL), dst=server)
        self._receive_parameters()
        self._timed(t0)

    def _receive_parameters(self, servers: range | None = None) -> None:
        answer = empty_header()
        for server in servers or range(self.servers):
            flat = self.buffers.host_params[server]
            self._await_acks(server, answer)
            dist.recv(answer, src=server)
            if not self.shared:
                dist.recv(flat, src=server)
            self.versions[server] = int(answer[0])
            self.bytes_moved += flat.numel() * flat.element_size()
        self.buffers.params_from_host()

    def push(self, steps: int, fetch: bool = False) -> None:
        """Send the gradients of the last `steps` steps; with `fetch`, take the parameters the
        server holds once it has applied them."""
        t0 = time.perf_counter()
        self.buffers.grads_to_host()
        for server, flat in enumerate(self.buffers.host_grads):
            op = PUSH_PULL if fetch else PUSH
            dist.send(self._header(op, self.versions[server], steps), dst=server)
            if not self.shared:
                dist.send(flat, dst=server)
            elif not fetch:
                self.acks_due[server] += 1  # the server reads them in place; confirmed later
            self.bytes_moved += flat.numel() * flat.element_size()
        if fetch:
            self._receive_parameters()  # the reply is also the acknowledgement
        self._timed(t0)

    def _await_acks(self, server: int, answer: torch.Tensor) -> None:
        while self.acks_due[server]:
            dist.recv(answer, src=server)
            self.acks_due[server] -= 1

    def gradients_free(self) -> None:
        """Wait until every server has applied the gradients pushed from the shared buffers,
        before backward writes new ones there (shm only; a gloo push sent a copy)."""
        if any(self.acks_due):
            t0 = time.perf_counter()
            answer = empty_header()
            for server in range(self.servers):
                self._await_acks(server, answer)
            self._timed(t0)

    def average(self, round_: int) -> None:
        t0 = time.perf_counter()
        self.buffers.params_to_host()
        for server, flat in enumerate(self.buffers.host_params):
            dist.send(self._header(AVERAGE, round_), dst=server)
            if not self.shared:
                dist.send(flat, dst=server)
        answer = empty_header()
        for server, flat in enumerate(self.buffers.host_params):
            dist.recv(answer if self.shared else flat, src=server)  # shm: the mean is in place
            self.bytes_moved += 2 * flat.numel() * flat.element_size()
        self.buffers.params_from_host()
        self._timed(t0)

    # ---- the end

    def finish(self, summary: dict) -> list[dict | None] | None:
        """Settle what is owed (a last average, accumulated gradients), hand in the summary;
        the main worker then waits for every live worker, takes the servers' final parameters
        and the others' summaries (a dead worker's is None)."""
        if self.averaging and self.step % self.strategy.local_steps:
            self.average(self.rounds + 1)
        if self.accumulated:
            self.push(self.accumulated)
            self.accumulated = 0
        self.gradients_free()
        put_record(self.store, f"summary/{self.rank}", summary)
        self._stop_heartbeat()
        if not self.is_main:
            for server in range(self.servers):
                dist.send(self._header(DONE), dst=server)
            return None
        for server in range(self.servers):
            dist.send(self._header(FINISH), dst=server)
        for server in range(self.servers):  # the answer comes once the slowest worker is done
            while not self.store.check([f"ps/final/{server}"]):
                time.sleep(FINAL_POLL_S)
        self._receive_parameters()
        self.server_stats = [get_record(self.store, f"stats/{s}") for s in range(self.servers)]
        dropped = {w for stats in self.server_stats for w in stats["dropped_workers"]}
        summaries = [
            None if index in dropped else get_record(self.store, f"summary/{index}")
            for index in range(self.trainers)
        ]
        self.store.set(GATHERED, "1")  # server 0 hosts the store: now it may leave
        return summaries

    def worker_extras(self) -> dict:
        return {"role": "worker", "wait_s": self.wait_s, "bytes_moved": self.bytes_moved}

    def sections(self, summaries: list[dict | None]) -> dict[str, dict]:
        return ps_sections(self.strategy, self.server_stats, self.payload["shards"])
