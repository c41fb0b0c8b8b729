"""Predicted training on many devices: data parallel, pipeline, parameter servers and hybrid.

Every strategy starts from one traced step and its roofline prediction on one device (or a step
time the caller measured), and adds what moving tensors between devices costs over a Link:

- ddp: a ring all-reduce of the fp32 gradients, 2(N−1)/N × bytes / bandwidth + 2(N−1) hops of
  latency (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009). As torch's
  DistributedDataParallel does (Li et al., "PyTorch Distributed", VLDB 2020), gradients fill
  25 MiB buckets in reverse layer order, and a bucket's all-reduce starts once backward has
  produced its last gradient, so all but what is left after backward hides behind compute.
  Across nodes, the ring is hierarchical: within a node over the link, then between nodes over
  the network, each device carrying its 1/(devices per node) share (one NIC per device).
- pipeline: the traced layers split into S contiguous stages balanced by predicted time (the
  planner's partition), M microbatches; a GPipe/1F1B step takes (M + S − 1) slots of the
  slowest stage's microbatch time (the bubble, Huang et al., "GPipe", NeurIPS 2019), each slot
  also sending a microbatch's activations forward and their gradients back over the link.
- ps: synchronous parameter servers; each worker pushes its gradients and pulls the weights
  (2 × fp32 parameter bytes), and every server's link carries its shard for all N workers.
- hybrid: S pipeline stages × R data-parallel replicas; each stage's gradients are all-reduced
  among its replicas after the schedule.
- tensor: the auto plan's layers split N ways (profiler/tensor_plan.py): their forward and
  backward time divided by N, every other layer whole on every device; each collective the plan
  implies (ring all-reduce, or all-gather: (N−1)/N × bytes + N−1 hops) runs on the critical
  path, not behind compute (Megatron-LM, Shoeybi et al. 2019). Weights, gradients and optimizer
  state shrink to the device's share; so do the split layers' saved activations.

Weak scaling: each device (ddp, ps) or replica (hybrid) keeps the traced batch, as
`dlscale scale` runs; a pipeline and a tensor-parallel group split one batch.
Efficiency = throughput / (N × one device's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.hardware.device import Hardware
from dlscale.hardware.links import Link
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION
from dlscale.profiler.memory import FP32_BYTES, training_memory
from dlscale.profiler.pipeline_split import in_flight, partition
from dlscale.profiler.recorder import LOSS
from dlscale.profiler.request import ScalingRequest
from dlscale.profiler.roofline import Prediction, predict
from dlscale.profiler.trace import StepTrace

BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default
MICROBATCHES_PER_STAGE = 4  # a pipeline's default microbatches: 4 × stages keeps the bubble ≤ 20%
HYBRID_STAGES = 2


@dataclass(frozen=True)
class ScalePoint:
    strategy: str
    devices: int
    step_s: float
    samples_per_s: float
    efficiency: float
    compute_s: float  # per device, the bubble included for a pipeline
    comm_s: float  # communication not hidden behind compute
    bound: str  # compute | link | network | server | bubble
    link: str
    global_batch: int
    fits: bool
    detail: dict = field(default_factory=dict)


def ring_allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce of `nbytes` among `ranks`: reduce-scatter then all-gather, each N−1 steps
    sending 1/N of the data."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / link.effective_bytes_per_s + steps * link.latency_s


def allreduce_s(nbytes: float, devices: int, link: Link, nodes: int, network: Link | None):
    """(seconds, slowest part): flat ring on one node, hierarchical across nodes."""
    if nodes <= 1 or network is None:
        return ring_allreduce_s(nbytes, devices, link), "link"
    per_node = max(1, devices // nodes)
    inside = ring_allreduce_s(nbytes, per_node, link)
    between = ring_allreduce_s(nbytes / per_node, nodes, network)
    return inside + between, "network" if between > inside else "link"


def gradient_buckets(trace: StepTrace, prediction: Prediction) -> list[tuple[float, float]]:
    """(bytes, seconds into backward when its last gradient is ready) per DDP bucket: layers in
    reverse order, each layer's gradients ready when its backward ends."""
    params = {layer.name: layer.params for layer in trace.layers}
    buckets: list[tuple[float, float]] = []
    elapsed = filled = 0.0
    for layer in reversed(prediction.layers):
        elapsed += layer.backward.seconds
        filled += params.get(layer.name, 0) * FP32_BYTES
        if filled >= BUCKET_BYTES:
            buckets.append((filled, elapsed))
            filled = 0.0
    if filled:
        buckets.append((filled, elapsed))
    return buckets


def overlapped_allreduce(buckets, backward_s: float, reduce) -> tuple[float, float]:
    """(exposed seconds after backward, total all-reduce seconds): buckets reduced in order on
    one link, each starting when ready and when the one before it is done."""
    done = total = 0.0
    for nbytes, ready in buckets:
        seconds = reduce(nbytes)
        done = max(done, ready) + seconds
        total += seconds
    return max(0.0, done - backward_s), total


@dataclass(frozen=True)
class _Single:
    """One device's step, scaled to a measured step time when the caller has one."""

    prediction: Prediction
    scale: float  # measured / predicted step time (1.0 without a measurement)

    @property
    def step_s(self) -> float:
        return self.prediction.step_s * self.scale

    def compute(self, part: float) -> float:
        return part * self.scale


def predict_scaling(
    trace: StepTrace,
    hardware: Hardware,
    request: ScalingRequest,
    link: Link,
    network: Link | None = None,
    *,
    single_step_s: float | None = None,
    tensor_plans=None,
) -> list[ScalePoint]:
    """A point per strategy and device count of `request`, within a node over `link` and
    between its nodes over `network` (hybrid only where stages × replicas fit; tensor where
    `tensor_plans`, degree -> TensorPlan or None, has a plan for the count)."""
    prediction = predict(trace, hardware)
    scale = single_step_s / prediction.step_s if single_step_s else 1.0
    single = _Single(prediction, scale)
    baseline = trace.batch_size / single.step_s
    nodes, servers = request.nodes, request.ps_servers
    points = []
    for count in request.devices:
        for strategy in request.strategy_names:
            point = _POINT[strategy](
                trace, hardware, single, count, link, nodes, network, servers, tensor_plans
            )
            if point is None:
                continue
            efficiency = point["samples_per_s"] / (count * baseline)
            points.append(
                ScalePoint(
                    strategy=strategy, devices=count, efficiency=efficiency, link=link.name, **point
                )
            )
    return points


def _usable(hardware: Hardware) -> float:
    return hardware.memory_bytes * USABLE_MEMORY_FRACTION


def _ddp(trace, hardware, single, count, link, nodes, network, _servers, _plans):
    p = single.prediction
    backward = single.compute(p.backward_s)
    fixed = single.compute(p.forward_s + p.optimizer_s + p.h2d_s)
    buckets = [(b, single.compute(t)) for b, t in gradient_buckets(trace, p)]
    parts = {"part": "link"}

    def reduce(nbytes: float) -> float:
        seconds, parts["part"] = allreduce_s(nbytes, count, link, nodes, network)
        return seconds

    exposed, total = overlapped_allreduce(buckets, backward, reduce) if count > 1 else (0.0, 0.0)
    step = fixed + backward + exposed
    compute = fixed + backward
    return {
        "step_s": step,
        "samples_per_s": count * trace.batch_size / step,
        "compute_s": compute,
        "comm_s": exposed,
        "bound": parts["part"] if total > backward else "compute",
        "global_batch": count * trace.batch_size,
        "fits": training_memory(trace).total_bytes <= _usable(hardware),
        "detail": {"buckets": len(buckets), "allreduce_s": total, "hidden_s": total - exposed},
    }


def _stages(trace: StepTrace, prediction: Prediction, stages: int):
    """Contiguous runs of the traced layers balanced by predicted time: (seconds, layers)."""
    rows = [layer for layer in trace.layers if layer.name != LOSS]
    times = {layer.name: layer.seconds for layer in prediction.layers}
    costs = [times.get(row.name, 0.0) for row in rows]
    if stages > len(rows):
        return None
    starts = partition(costs, stages)
    bounds = [*starts, len(rows)]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(stages)], times


def _pipeline_step(trace, hardware, single, stages, link, microbatches):
    """(step seconds, compute seconds, comm seconds, fits, detail) of one batch on S stages."""
    p = single.prediction
    split = _stages(trace, p, stages)
    if split is None:
        return None
    groups, times = split
    stage_s = [single.compute(sum(times.get(r.name, 0.0) for r in group)) for group in groups]
    # A boundary sends a microbatch's activations forward and their gradients back.
    boundary = [group[-1].output_bytes / microbatches for group in groups[:-1]]
    send_s = max(
        (2 * (b / link.effective_bytes_per_s + link.latency_s) for b in boundary), default=0.0
    )
    slot = max(stage_s) / microbatches
    slots = microbatches + stages - 1
    update = single.compute(p.optimizer_s + p.h2d_s) / stages
    compute = slots * slot + update
    comm = slots * send_s
    memory = training_memory(trace)
    state_per_param = (memory.static_bytes / trace.params) if trace.params else 0.0
    worst = 0.0
    for index, group in enumerate(groups):
        held = in_flight("1f1b", microbatches, stages, index)
        saved = sum(r.saved_bytes for r in group) / microbatches * held
        worst = max(worst, sum(r.params for r in group) * state_per_param + saved)
    detail = {
        "stages": stages,
        "microbatches": microbatches,
        "bubble": (stages - 1) / slots,
        "stage_s": stage_s,
        "boundary_bytes": boundary,
        "stage_memory_bytes": worst,
    }
    return compute + comm, compute, comm, worst <= _usable(hardware), detail


def microbatches(trace: StepTrace, stages: int) -> int:
    """4 per stage, but no more than the batch has samples (a microbatch holds one at least)."""
    return max(1, min(MICROBATCHES_PER_STAGE * stages, trace.batch_size))


def _pipeline(trace, hardware, single, count, link, _nodes, _network, _servers, _plans):
    if count < 2:
        return None
    step = _pipeline_step(trace, hardware, single, count, link, microbatches(trace, count))
    if step is None:
        return None
    seconds, compute, comm, fits, detail = step
    bubble_s = detail["bubble"] * (compute - single.compute(single.prediction.optimizer_s) / count)
    bound = "link" if comm > compute else "bubble" if bubble_s > comm else "compute"
    return {
        "step_s": seconds,
        "samples_per_s": trace.batch_size / seconds,
        "compute_s": compute,
        "comm_s": comm,
        "bound": bound,
        "global_batch": trace.batch_size,
        "fits": fits,
        "detail": detail,
    }


def _ps(trace, hardware, single, count, link, nodes, network, servers, _plans):
    over = network if nodes > 1 and network is not None else link
    grad_bytes = trace.trainable_params * FP32_BYTES
    # Each way at once (full duplex): a worker sends its gradients and receives the weights; a
    # server receives every worker's shard of the gradients and sends its shard of the weights.
    worker_s = grad_bytes / over.effective_bytes_per_s
    server_s = count * grad_bytes / servers / over.effective_bytes_per_s
    comm = max(worker_s, server_s) + 2 * over.latency_s
    compute = single.step_s
    step = compute + comm
    side = "server" if server_s > worker_s else ("network" if over is network else "link")
    return {
        "step_s": step,
        "samples_per_s": count * trace.batch_size / step,
        "compute_s": compute,
        "comm_s": comm,
        "bound": side if comm > compute else "compute",
        "global_batch": count * trace.batch_size,
        "fits": training_memory(trace).total_bytes <= _usable(hardware),
        "detail": {"servers": servers, "worker_s": worker_s, "server_s": server_s},
    }


def _hybrid(trace, hardware, single, count, link, nodes, network, _servers, _plans):
    stages = HYBRID_STAGES
    if count < 2 * stages or count % stages:
        return None
    replicas = count // stages
    step = _pipeline_step(trace, hardware, single, stages, link, microbatches(trace, stages))
    if step is None:
        return None
    seconds, compute, comm, fits, detail = step
    stage_bytes = trace.trainable_params * FP32_BYTES / stages  # roughly each stage's share
    sync, part = allreduce_s(stage_bytes, replicas, link, nodes, network)
    total = seconds + sync
    bound = part if comm + sync > compute else "compute"
    return {
        "step_s": total,
        "samples_per_s": replicas * trace.batch_size / total,
        "compute_s": compute,
        "comm_s": comm + sync,
        "bound": bound,
        "global_batch": replicas * trace.batch_size,
        "fits": fits,
        "detail": {**detail, "replicas": replicas, "replica_sync_s": sync},
    }


def all_gather_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-gather of a tensor of `nbytes` in all: N−1 steps, each sending 1/N of it."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * nbytes / link.effective_bytes_per_s + (ranks - 1) * link.latency_s


def _tensor(trace, hardware, single, plan, link):
    """One batch over a tensor-parallel group of plan.degree devices (one node's link)."""
    p, count = single.prediction, plan.degree
    split = split_layers(trace, plan)
    layer_s = sum(lt.seconds / count if lt.name in split else lt.seconds for lt in p.layers)
    share = plan.params_per_device / plan.params if plan.params else 1.0
    compute = single.compute(layer_s + p.optimizer_s * share + p.h2d_s)
    comm = 0.0
    for kind, payload in plan.collectives(trace.batch_size):
        reduce = ring_allreduce_s if kind == "all_reduce" else all_gather_s
        comm += reduce(payload, count, link)
    memory = training_memory(trace)
    saved = {layer.name: layer.saved_bytes for layer in trace.layers}
    activations = sum(b / count if name in split else b for name, b in saved.items())
    per_device = memory.static_bytes * share + activations
    step = compute + comm
    return {
        "step_s": step,
        "samples_per_s": trace.batch_size / step,
        "compute_s": compute,
        "comm_s": comm,
        "bound": "link" if comm > compute else "compute",
        "global_batch": trace.batch_size,
        "fits": per_device <= _usable(hardware),
        "detail": {
            "degree": count,
            "split_layers": len(split & set(plan.styles)),
            "params_per_device": plan.params_per_device,
            "memory_per_device_bytes": per_device,
            "collectives": plan.comm_per_step(trace.batch_size),
        },
    }


def _tensor_at(trace, hardware, single, count, link, _nodes, _network, _servers, plans):
    """Where `plans` (degree -> TensorPlan or None) has a plan for `count` devices."""
    plan = plans(count) if plans is not None and count > 1 else None
    return _tensor(trace, hardware, single, plan, link) if plan else None


# strategy -> its point at a device count, or None where it cannot run there
_POINT = {"ddp": _ddp, "pipeline": _pipeline, "ps": _ps, "hybrid": _hybrid, "tensor": _tensor_at}


def split_layers(trace: StepTrace, plan) -> set[str]:
    """The traced layers that work on one device's share: the planned ones, and every layer run
    while an output is left split (between a column split and its row partner: the attention
    core on its heads, the activation between an MLP's two layers, a column's pooling)."""
    styles = plan.styles
    split: set[str] = set()
    inside = False
    for layer in trace.layers:
        style = styles.get(layer.name)
        if style is None:
            if inside:
                split.add(layer.name)
            continue
        split.add(layer.name)
        inside = style in ("colwise", "grouped")
    return split
