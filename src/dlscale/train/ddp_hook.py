"""How dlscale's ddp wraps a worker's model in torch's DistributedDataParallel (`wrap`), with
the hook it gives DDP: DDP's default work (an all-reduce of each gradient bucket, divided by the
world size), timed and sized. Here, below the strategies, so that `bench machine` can time a
step under DDP exactly as a ddp worker runs it (bench/loop_cost.py)."""

from __future__ import annotations

import threading
import time

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
        self.allreduces = 0  # buckets reduced: a step that accumulates reduces once, not K times
        self._lock = threading.Lock()  # callbacks run on the backend's threads

    # No annotations here: DDP checks that `bucket` is annotated as the GradBucket class itself,
    # and `from __future__ import annotations` would make it a string.
    def hook(self, state, bucket):
        start = time.perf_counter()
        tensor = bucket.buffer().div_(self.world_size)
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            self.allreduces += 1
        future = dist.all_reduce(tensor, async_op=True).get_future()

        def record(done: torch.futures.Future) -> torch.Tensor:
            with self._lock:
                self.seconds += time.perf_counter() - start
                self.payload_bytes += size
            return done.value()[0]

        return future.then(record)

    def totals(self) -> tuple[float, int]:
        with self._lock:
            return self.seconds, self.payload_bytes


def wrap(
    module: nn.Module, timer: AllreduceTimer, device_ids: list[int] | None = None
) -> DistributedDataParallel:
    """`module` as a ddp worker trains it: torch's DDP with `timer`'s hook, its gradients views
    of DDP's buckets (`gradient_as_bucket_view`): backward's gradients are copied into the
    buckets once and the reduced buckets are the gradients, with no copy back and no second
    copy of the gradients held (torch's DDP keeps both by default). With accumulation the
    micro-batches inside `no_sync` sum into gradients of their own (zero_grad leaves none), so
    both are held until the last micro-batch's backward copies them in."""
    model = DistributedDataParallel(module, device_ids=device_ids, gradient_as_bucket_view=True)
    model.register_comm_hook(state=None, hook=timer.hook)
    return model
