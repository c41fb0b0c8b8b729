"""What one collective costs on a link, in a training step: ring all-reduces (flat, and
hierarchical across nodes) and all-gathers, each with its launch, its contention with compute
and its framework's wait; how much of a bucketed all-reduce hides behind backward; and how late
the slowest of N devices is (synchronisation skew). profiler/scaling.py says where each is used
and where its figures come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

from dlscale.hardware.links import Link

BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default
# One device's step-to-step variation (std / mean) where nothing measured says otherwise: a
# stated default, not a measurement (no published per-step spread was found). A step of fixed
# shapes on a dedicated accelerator varies by about a percent; give a measured spread as
# Framework(step_cv=...). At 1% the slowest of 8 devices is 1.4% late, of 512 3.0%.
STEP_CV = 0.01
NCCL_RING_PLATEAU = 1.9  # NCCL's latency factor for a ring across nodes (src/graph/tuning.cc)


@dataclass(frozen=True)
class Framework:
    """How a data-parallel framework groups and starts its all-reduces, and how much one
    device's step varies (what the slowest of N waits for)."""

    name: str
    bucket_bytes: float = BUCKET_BYTES
    bucket_s: float = 0.0  # what each bucket waits beyond the link's launch
    step_cv: float = STEP_CV  # std / mean of one device's step time
    hierarchical: bool = True  # across nodes: rings within, then between (else one flat ring)
    # torch DDP's reducer: its copies of the gradients into buckets (their views), the comm hook's
    # division, its per-step bookkeeping, at any worker count (scaling.ddp_reducer_s)
    reducer: bool = False


TORCH_DDP = Framework("torch DDP", reducer=True)


def expected_max_normal(count: int) -> float:
    """E[max of `count` independent standard normals], Blom's approximation; 0 for one."""
    if count <= 1:
        return 0.0
    return NormalDist().inv_cdf((count - 0.375) / (count + 0.25))


def skew_s(step_s: float, step_cv: float, count: int) -> float:
    """How late the slowest of `count` devices is against the mean step: cv × step × E[max]."""
    return step_cv * step_s * expected_max_normal(count)


def ring_allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce of `nbytes` among `ranks`: reduce-scatter then all-gather, each N−1 steps
    sending 1/N of the data."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / link.effective_bytes_per_s + steps * link.latency_s


def flat_ring_allreduce_s(nbytes: float, devices: int, link: Link, nodes: int, network: Link):
    """One ring through every device of every node, as NCCL runs an all-reduce across nodes
    unless told otherwise (Horovod's default before HOROVOD_HIERARCHICAL_ALLREDUCE). Bytes: the
    ring's 2(N−1)/N × bytes at its slowest edge, a node's port (the network's per-device rate
    × devices per node) or the link inside. Latency, NCCL's own model (src/graph/tuning.cc):
    every one of the 2(N−1) steps pays a hop, over the network for the 2(nodes−1) that leave a
    node and over the link for the rest, and a ring across nodes moving large messages pays
    that 1.9 times ("plateau effect of ring")."""
    per_node = max(1, devices // nodes)
    rate = min(link.effective_bytes_per_s, network.effective_bytes_per_s * per_node)
    steps, leaving = 2 * (devices - 1), 2 * (nodes - 1)
    hops = (steps - leaving) * link.latency_s + leaving * network.latency_s
    return steps / devices * nbytes / rate + NCCL_RING_PLATEAU * hops


def allreduce_s(
    nbytes: float,
    devices: int,
    link: Link,
    nodes: int,
    network: Link | None,
    hierarchical: bool = True,
):
    """(seconds, slowest part) of one collective, alone: its launch, then a ring on one node;
    across nodes, hierarchical (rings within, then between) or one flat ring."""
    if devices <= 1 or nbytes <= 0:
        return 0.0, "link"
    if nodes <= 1 or network is None:
        return link.launch_s + ring_allreduce_s(nbytes, devices, link), "link"
    launch = max(link.launch_s, network.launch_s)  # one collective, started once
    if not hierarchical:
        return launch + flat_ring_allreduce_s(nbytes, devices, link, nodes, network), "network"
    per_node = max(1, devices // nodes)
    inside = ring_allreduce_s(nbytes, per_node, link)
    between = ring_allreduce_s(nbytes / per_node, nodes, network)
    return launch + inside + between, "network" if between > inside else "link"


def bucket_allreduce_s(nbytes, devices, link, nodes, network, framework: Framework):
    """(seconds, slowest part) of one bucket inside training: the collective slowed by the
    link's contention with compute, plus the framework's own wait per bucket."""
    seconds, part = allreduce_s(nbytes, devices, link, nodes, network, framework.hierarchical)
    if seconds == 0.0:
        return 0.0, part
    return seconds * link.contention + framework.bucket_s, part


def overlapped_allreduce(
    buckets, backward_s: float, reduce, overlap: float = 1.0
) -> tuple[float, float]:
    """(exposed seconds after backward, total all-reduce seconds): buckets reduced in order on
    one link, each starting when ready and when the one before it is done; of what that
    timeline hides behind backward, no more than `overlap` × the total counts as hidden.

    What hides is summed bucket by bucket (the part of each before backward ends), so a bucket
    that starts when backward ends hides exactly nothing, not a float residue of end − start."""
    done = total = before = 0.0
    for nbytes, ready in buckets:
        seconds = reduce(nbytes)
        start = max(done, ready)
        done = start + seconds
        total += seconds
        before += max(0.0, min(done, backward_s) - start)
    hidden = min(before, overlap * total)
    return total - hidden, total


def all_gather_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-gather of a tensor of `nbytes` in all: N−1 steps, each sending 1/N of it."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / link.effective_bytes_per_s + (ranks - 1) * link.latency_s
