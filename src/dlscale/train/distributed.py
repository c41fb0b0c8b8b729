"""Data-parallel plumbing for the Trainer: DDP wrapping, allreduce timing, gathering metrics."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class AllreduceTimer:
    """A DDP communication hook: averages each gradient bucket, timing and sizing it.

    It does what DDP's default hook does (allreduce the bucket, divide by the world size) and
    records, when each allreduce completes, how long it took from launch and how many bytes it
    carried. Buckets overlap with the rest of backward, so the sum is time spent communicating,
    not time the step waited for it.
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.seconds = 0.0
        self.payload_bytes = 0
        self.calls = 0
        self._lock = threading.Lock()  # callbacks run on the backend's threads

    # No annotations here: DDP checks that `bucket` is annotated as the GradBucket class itself,
    # and `from __future__ import annotations` would make it a string.
    def hook(self, state, bucket):
        start = time.perf_counter()
        tensor = bucket.buffer().div_(self.world_size)
        size = tensor.numel() * tensor.element_size()
        future = dist.all_reduce(tensor, async_op=True).get_future()

        def record(done: torch.futures.Future) -> torch.Tensor:
            with self._lock:
                self.seconds += time.perf_counter() - start
                self.payload_bytes += size
                self.calls += 1
            return done.value()[0]

        return future.then(record)

    def totals(self) -> tuple[float, int]:
        with self._lock:
            return self.seconds, self.payload_bytes


def wrap(module: nn.Module, device: torch.device, world_size: int):
    """DDP around `module` (its weights broadcast from rank 0), with the timing hook."""
    device_ids = [device.index or 0] if device.type == "cuda" else None
    model = DistributedDataParallel(module, device_ids=device_ids)
    timer = AllreduceTimer(world_size)
    model.register_comm_hook(state=None, hook=timer.hook)
    return model, timer


def bytes_sent_per_worker(payload_bytes: float, world_size: int) -> float:
    """A ring allreduce sends 2(N−1)/N of the payload from each worker (reduce-scatter, gather)."""
    return 2 * (world_size - 1) / world_size * payload_bytes


def gather(value: Any, world_size: int) -> list[Any]:
    """Every worker's `value`, by rank (a collective: every worker must call it)."""
    if world_size == 1:
        return [value]
    values: list[Any] = [None] * world_size
    dist.all_gather_object(values, value)
    return values
