"""What torch's SyncBatchNorm sends in one training step, layer by layer, and what it costs.

Read off torch's own implementation (torch/nn/modules/_functions.py, class SyncBatchNorm, torch
2.13), for each call of a batch-norm layer of C channels in training, on N > 1 processes:

- forward: one all-gather of the process's mean and inverse std (C values each) and its sample
  count (1 value): 2C + 1 values from each process, N × (2C + 1) gathered, before the layer can
  normalise (`all_gather_into_tensor` on NCCL, a list `all_gather` on gloo: the same bytes);
- backward: one all-reduce (sum) of sum_dy and sum_dy_xmu (C values each): 2C values, before
  the layer's input gradient. A layer whose input needs no gradient (a batch norm applied to
  the data itself) skips it; the count here assumes every layer's input needs one.

The values are the statistics' accumulate type, fp32, whatever the training precision:
batch_norm_stats_cuda allocates mean and invstd as toAccumulateType(input) (fp32 for bf16 and
fp16; aten/src/ATen/native/cuda/Normalization.cu, read 2026-11-27), the count is cast to the
mean's type, and the backward sums come out in the statistics' type. Both collectives are
blocking (`async_op=False`) inside forward and backward, so nothing hides them behind compute:
each pays its launch and its hops on the step's critical path. The weight and bias gradients
are not sent here: DDP's buckets average them with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.hardware.links import Link
from dlscale.profiler.collectives import all_gather_s, allreduce_s
from dlscale.profiler.memory import FP32_BYTES
from dlscale.profiler.trace import StepTrace

# The module classes torch's convert_sync_batchnorm replaces (its _BatchNorm subclasses), and
# the class it puts in their place, as the trace names them.
BATCHNORM_TYPES = frozenset(
    {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"}
    | {"LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d"}
)
STATS_BYTES = FP32_BYTES  # one statistic: fp32, the accumulate type


@dataclass(frozen=True)
class SyncCollective:
    """One collective SyncBatchNorm runs: `values` statistics from each process."""

    layer: str
    kind: str  # all_gather (forward) | all_reduce (backward)
    values: int

    @property
    def payload_bytes(self) -> int:
        """What each process contributes."""
        return self.values * STATS_BYTES

    def bytes_sent_per_device(self, devices: int) -> float:
        """A ring all-gather forwards the N−1 other shares; a ring all-reduce sends 2(N−1)/N
        of the payload (reduce-scatter, then all-gather)."""
        if self.kind == "all_gather":
            return (devices - 1) * self.payload_bytes
        return 2 * (devices - 1) / devices * self.payload_bytes


def sync_batchnorm_collectives(trace: StepTrace) -> list[SyncCollective]:
    """Every collective of one training step, in the order forward runs the layers (a layer
    called twice in a step syncs twice); none for a model without batch norm."""
    found = []
    for layer in trace.layers:
        if layer.type not in BATCHNORM_TYPES or not layer.output_shape:
            continue
        channels = layer.output_shape[1]  # (B, C, ...): batch norm's channels are dim 1
        for _ in range(layer.calls):
            found.append(SyncCollective(layer.name, "all_gather", 2 * channels + 1))
            found.append(SyncCollective(layer.name, "all_reduce", 2 * channels))
    return found


def sync_batchnorm_s(
    collectives: list[SyncCollective],
    devices: int,
    link: Link,
    nodes: int = 1,
    network: Link | None = None,
) -> float:
    """Seconds the step spends in them on `devices` devices: each all-reduce as ddp's (its launch,
    then a ring, hierarchical across nodes), each all-gather its launch and a ring of N−1 hops
    over the slowest link it crosses (the network's, when the devices span nodes)."""
    if devices <= 1:
        return 0.0
    across = network if nodes > 1 and network is not None else link
    launch = max(link.launch_s, across.launch_s)
    total = 0.0
    for each in collectives:
        if each.kind == "all_gather":
            total += launch + all_gather_s(devices * each.payload_bytes, devices, across)
        else:
            total += allreduce_s(each.payload_bytes, devices, link, nodes, network)[0]
    return total
