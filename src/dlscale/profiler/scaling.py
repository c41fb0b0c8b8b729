"""Predicted training on many devices: data parallel, pipeline, parameter servers and hybrid.

Every strategy starts from one traced step and its roofline prediction on one device (or a step
time the caller measured), and adds what moving tensors between devices costs over a Link:

- ddp: a ring all-reduce of the fp32 gradients, 2(N−1)/N × bytes / bandwidth + 2(N−1) hops of
  latency (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms", JPDC 2009). As torch's
  DistributedDataParallel does (Li et al., "PyTorch Distributed", VLDB 2020), gradients fill
  buckets (the framework's size: 25 MiB for torch DDP, 64 MiB for Horovod's fusion buffer) in
  reverse layer order, and a bucket's all-reduce starts once backward has produced its last
  gradient. What that costs beyond bytes and hops, each term in a point's detail:
  - every bucket pays a fixed cost: the link's launch (NCCL's model charges 8.4 µs a ring
    all-reduce) plus the framework's own (Horovod waits for its next negotiation cycle);
  - a collective inside training runs `link.contention` times slower than alone (a CPU link
    whose threads share the cores with compute);
  - at most `link.overlap` of the all-reduce hides behind backward, and no bucket before it is
    ready (the timeline): the rest is exposed after backward;
  - synchronisation skew: every step waits for the slowest of N devices. With a device's step
    time varying by a coefficient of variation cv from step to step (independent, normal), the
    slowest of N is late by cv × step × E[max of N standard normals], which grows like
    √(2 ln N) (the tail-at-scale effect, Dean & Barroso, CACM 2013); E[max] is Blom's
    approximation Φ⁻¹((N − 0.375)/(N + 0.25)) (Blom, "Statistical Estimates and Transformed
    Beta-Variables", 1958), 0 for one device.
  - DDP's own work (torch DDP only, at every count, one device included: dlscale's ddp wraps
    each worker's model even alone): the reducer's copies of the gradients into buckets and
    the hook's division (the gradients are views of the buckets: nothing is copied back), two
    passes over them, an op a tensor and one a bucket, and a fixed part `bench machine`
    measures on a CPU (ddp_reducer_s).
  With SyncBatchNorm (--sync-batchnorm), every batch-norm layer also runs an all-gather of its
  statistics in forward and an all-reduce of two gradient sums in backward, blocking, on the
  critical path (profiler/batchnorm_sync.py counts them from torch's implementation).
  Across nodes, the ring is hierarchical: within a node over the link, then between nodes over
  the network, each device carrying its 1/(devices per node) share (one NIC per device; a port
  shared by k devices is a network link of 1/k its rate).
- pipeline: the traced layers split into S contiguous stages balanced by predicted time (the
  planner's partition), M microbatches; a GPipe/1F1B step takes (M + S − 1) slots of the
  slowest stage's microbatch time (the bubble, Huang et al., "GPipe", NeurIPS 2019), each slot
  also sending a microbatch's activations forward and their gradients back over the link, each
  send paying the link's hop latency and launch (the per-microbatch overhead).
- ps: dlscale's parameter servers in their default mode, async: each worker computes, pushes
  its fp32 gradients to every server and waits for the weights the server replies with once it
  has applied them (its share of the optimizer step, under its shard's lock), then computes
  again; no worker waits for another. One step with no other worker: compute + the gradients
  out + the update + the weights back + four blocking messages' latency (dlscale's wire:
  request, gradients, reply, weights; to and from each server). With N workers they queue at
  the servers (each server's link in, its update under its lock, its link out): a closed loop
  of N workers, solved by exact mean-value analysis (Reiser and Lavenberg, JACM 1980), so the
  servers' link and update rate bound the throughput as the workers grow. The update is priced
  at the workers' device's rate (dlscale's servers step on the host's CPU).
- hybrid: S pipeline stages × R data-parallel replicas; each stage's gradients are all-reduced
  among its replicas after the schedule (launch, contention and skew as ddp).
- tensor: the auto plan's layers split N ways (profiler/tensor_plan.py): their forward and
  backward time divided by N, every other layer whole on every device; each collective the plan
  implies (ring all-reduce, or all-gather: (N−1)/N × bytes + N−1 hops) runs on the critical
  path, not behind compute (Megatron-LM, Shoeybi et al. 2019). Weights, gradients and optimizer
  state shrink to the device's share; so do the split layers' saved activations.

Gradient accumulation (the spec's `accumulate` K, ddp and tensor): an optimizer step runs the
traced batch K times, forward, backward and the copy in each time, and the update and the loop's
per-step cost once; DDP's no_sync keeps the first K−1 backwards local, so one all-reduce of the
gradients per optimizer step overlaps only the last backward; a tensor-parallel group sends its
activation collectives in every micro-batch (K times), its weights' update once. The other
strategies are left out of a prediction with K > 1 (ps and pipeline refuse it).

Weak scaling: each device (ddp, ps) or replica (hybrid) keeps the traced batch, as
`dlscale scale` runs; a pipeline and a tensor-parallel group split one batch.
Efficiency = throughput / (N × one device's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.hardware.device import REDUCER_OPS_PER_TENSOR, Hardware
from dlscale.hardware.links import Link
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION
from dlscale.profiler.batchnorm_sync import sync_batchnorm_collectives, sync_batchnorm_s
from dlscale.profiler.collectives import (
    BUCKET_BYTES,
    TORCH_DDP,
    Framework,
    all_gather_s,
    bucket_allreduce_s,
    overlapped_allreduce,
    ring_allreduce_s,
    skew_s,
)
from dlscale.profiler.memory import FP32_BYTES, training_memory
from dlscale.profiler.pipeline_split import in_flight, partition
from dlscale.profiler.recorder import LOSS
from dlscale.profiler.request import ScalingRequest
from dlscale.profiler.roofline import Prediction, predict
from dlscale.profiler.trace import StepTrace

MICROBATCHES_PER_STAGE = 4  # a pipeline's default microbatches: 4 × stages keeps the bubble ≤ 20%
HYBRID_STAGES = 2
ACCUMULATING = ("ddp", "tensor")  # the strategies whose points model gradient accumulation
WEIGHT_SNAPSHOTS_2BW = 2  # 2bw's weight copies per stage besides the optimizer's (twobw.py)
PS_MESSAGES = 4  # a ps step's blocking messages a server: request, gradients, reply, weights


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


def gradient_buckets(
    trace: StepTrace, prediction: Prediction, bucket_bytes: float = BUCKET_BYTES
) -> list[tuple[float, float]]:
    """(bytes, seconds into backward when its last gradient is ready) per DDP bucket: layers in
    reverse order, each layer's gradients ready when its backward ends, that is backward's
    total less the backward of the layers before it (still to run). Counted from the total, the
    last bucket is ready at exactly `prediction.backward_s`, not at a re-summed total a float
    residue away from it."""
    params = {layer.name: layer.params for layer in trace.layers}
    to_run = [0.0]  # per layer, in forward order: the backward of the layers before it
    for layer in prediction.layers[:-1]:
        to_run.append(to_run[-1] + layer.backward.seconds)
    buckets: list[tuple[float, float]] = []
    filled = 0.0
    for layer, later_s in zip(reversed(prediction.layers), reversed(to_run), strict=True):
        filled += params.get(layer.name, 0) * FP32_BYTES
        if filled >= bucket_bytes:
            buckets.append((filled, prediction.backward_s - later_s))
            filled = 0.0
    if filled:
        buckets.append((filled, prediction.backward_s))
    return buckets


# torch DDP's reducer, at any worker count (dlscale's ddp wraps each worker's model even alone),
# as dlscale runs it (train/ddp_hook.wrap: the gradients are views of the buckets): it copies
# each gradient into its bucket as backward produces it, and the comm hook divides each bucket
# by the world size in place: two passes over the gradients, each reading and writing them
# (torch's default, buckets apart from the gradients, copies them back too: a third).
REDUCER_PASSES = 2


def ddp_reducer_s(trace: StepTrace, hardware: Hardware, buckets: int) -> float:
    """What torch DDP itself adds to a step on `hardware`, beyond the all-reduce: its fixed
    bookkeeping (measured on a CPU, Hardware.ddp_fixed_step_s), an op a gradient tensor and
    one a bucket at a bare op's dispatch, and its two passes over the gradients at the copy
    rate of their working set (the gradients and the buckets: Hardware.copy_rate). On a CPU the
    thread that issues the ops runs them: their dispatch and their bytes add up. On an
    accelerator the host launches them and the device copies, the launches running ahead of the
    copies: the longer of the two counts (unvalidated there: no torch DDP run on a GPU checks
    it)."""
    grads = trace.trainable_params * FP32_BYTES
    dispatch_s = (
        REDUCER_OPS_PER_TENSOR * len(trace.optimizer_tensors) + buckets
    ) * hardware.dispatch_s
    copies_s = REDUCER_PASSES * 2 * grads / hardware.copy_rate(2 * grads)
    work_s = dispatch_s + copies_s if hardware.kind == "cpu" else max(dispatch_s, copies_s)
    return hardware.ddp_fixed_step_s + work_s


def cores_shared(hardware: Hardware, processes: int, threads: int | None = None) -> float:
    """How many times over its cores this machine is asked for by `processes` workers, at least
    1: on a CPU entry `bench machine` measured (`local`: the cores it counted are there), whose
    devices are processes on that machine, each with the calibration's threads (or `threads`);
    1 for any other entry (its devices are devices)."""
    if hardware.kind != "cpu":
        return 1.0
    cores = (hardware.measured.get("load") or {}).get("cores")
    per_process = threads or hardware.measured.get("threads")
    if not cores or not per_process:
        return 1.0
    return max(1.0, processes * per_process / cores)


@dataclass(frozen=True)
class _Single:
    """One device's step, scaled to a measured step time when the caller has one, and slowed
    where its processes share cores (`crowd`: cores_shared)."""

    prediction: Prediction
    scale: float  # measured / predicted step time (1.0 without a measurement), × crowd
    crowd: float = 1.0  # how many times over the machine's cores its processes ask for

    @property
    def step_s(self) -> float:
        return self.prediction.step_s * self.scale

    def compute(self, part: float) -> float:
        return part * self.scale

    @property
    def per_step_s(self) -> float:
        """What the step holds beyond forward, backward, the update and the copy in, scaled:
        whatever predict() adds to its step_s (such as the loop's own per-step cost), paid once
        a step whatever the strategy."""
        p = self.prediction
        parts = p.forward_s + p.backward_s + p.optimizer_s + p.h2d_s
        return self.compute(max(0.0, p.step_s - parts))

    def accumulated_s(self, accumulate: int) -> float:
        """One device's optimizer step over `accumulate` micro-batches of the traced batch:
        forward, backward and the copy in run for each, the update and per-step cost once."""
        p = self.prediction
        micro = self.compute(p.forward_s + p.backward_s + p.h2d_s)
        return self.step_s + (accumulate - 1) * micro


def predict_scaling(
    trace: StepTrace,
    hardware: Hardware,
    request: ScalingRequest,
    link: Link,
    network: Link | None = None,
    *,
    single_step_s: float | None = None,
    tensor_plans=None,
    framework: Framework = TORCH_DDP,
    accumulate: int = 1,
    pinned: bool = True,
    fresh_pages: bool = False,
    threads_per_device: int | None = None,
) -> list[ScalePoint]:
    """A point per strategy and device count of `request`, within a node over `link` and
    between its nodes over `network` (hybrid only where stages × replicas fit; tensor where
    `tensor_plans`, degree -> TensorPlan or None, has a plan for the count); `framework`: how
    the data-parallel strategies bucket their all-reduces and how much a step varies.

    `single_step_s` replaces the roofline's one-device step (a measured one, or the
    prediction with costs the roofline lacks, such as the loop's per-step cost): every part of
    the step is scaled by the same factor. `accumulate`: micro-batches of the traced batch per
    optimizer step (the strategies in ACCUMULATING; one device's baseline accumulates as
    well). `pinned` and `fresh_pages`: as predict() takes them. On the `local` CPU entry the
    devices are processes on one machine: where N of them ask for more threads than it has
    cores (each the calibration's, or `threads_per_device`), each computes N × threads / cores
    times slower (cores_shared)."""
    prediction = predict(trace, hardware, pinned=pinned, fresh_pages=fresh_pages)
    scale = single_step_s / prediction.step_s if single_step_s else 1.0
    single = _Single(prediction, scale)
    baseline = accumulate * trace.batch_size / single.accumulated_s(accumulate)
    nodes, servers = request.nodes, request.ps_servers
    points = []
    for count in request.devices:
        crowd = cores_shared(hardware, count, threads_per_device)
        here = single if crowd == 1 else _Single(prediction, scale * crowd, crowd)
        for strategy in request.strategy_names:
            if accumulate > 1 and strategy not in ACCUMULATING:
                continue
            where = _Where(
                link,
                nodes,
                network,
                servers,
                framework,
                request.sync_batchnorm,
                accumulate,
                request.pipeline_schedule,
            )
            point = _POINT[strategy](trace, hardware, here, count, where, tensor_plans)
            if point is None:
                continue
            efficiency = point["samples_per_s"] / (count * baseline)
            points.append(
                ScalePoint(
                    strategy=strategy, devices=count, efficiency=efficiency, link=link.name, **point
                )
            )
    return points


@dataclass(frozen=True)
class _Where:
    """What a point runs over: the links, the nodes, the ps servers, the framework."""

    link: Link
    nodes: int
    network: Link | None
    servers: int
    framework: Framework
    sync_batchnorm: bool = False  # ddp: torch's SyncBatchNorm in place of every batch norm
    accumulate: int = 1  # micro-batches per optimizer step
    schedule: str = "gpipe"  # a pipeline's: gpipe, 1f1b or 2bw

    def reduce(self, nbytes: float, devices: int, parts: dict) -> float:
        """One bucket's all-reduce inside training; its slowest part noted in `parts`."""
        seconds, parts["part"] = bucket_allreduce_s(
            nbytes, devices, self.link, self.nodes, self.network, self.framework
        )
        return seconds


def _usable(hardware: Hardware) -> float:
    return hardware.memory_bytes * USABLE_MEMORY_FRACTION


def _ddp(trace, hardware, single, count, where, _plans):
    p, framework, link, k = single.prediction, where.framework, where.link, where.accumulate
    backward = single.compute(p.backward_s)
    one_device = single.accumulated_s(k)
    fixed = one_device - backward  # everything else of the step runs before or after it
    buckets = [
        (b, single.compute(t)) for b, t in gradient_buckets(trace, p, framework.bucket_bytes)
    ]
    parts = {"part": "link"}
    exposed, total = 0.0, 0.0
    if count > 1:

        def reduce(nbytes: float) -> float:
            return where.reduce(nbytes, count, parts)

        # With accumulation only the last micro-batch's backward reduces (no_sync before it).
        exposed, total = overlapped_allreduce(buckets, backward, reduce, link.overlap)
    # DDP's own work is host work too where the processes share cores.
    reducer = (
        single.crowd * ddp_reducer_s(trace, hardware, len(buckets)) if framework.reducer else 0.0
    )
    compute = fixed + backward + reducer
    skew = skew_s(one_device, framework.step_cv, count)
    # On one process torch's SyncBatchNorm falls back to plain batch norm: nothing is sent.
    # Its collectives run in every micro-batch's forward and backward (no_sync spares only
    # DDP's gradient all-reduce), so K micro-batches send them K times.
    synced = sync_batchnorm_collectives(trace) if where.sync_batchnorm and count > 1 else []
    sync_s = k * sync_batchnorm_s(synced, count, link, where.nodes, where.network)
    step = compute + exposed + sync_s + skew
    per_bucket = link.launch_s + framework.bucket_s if count > 1 else 0.0
    # The loop copies a whole step's inputs (K micro-batches) to the device at once.
    peak = training_memory(trace).step_peak_bytes(k)
    return {
        "step_s": step,
        "samples_per_s": count * k * trace.batch_size / step,
        "compute_s": compute,
        "comm_s": exposed + sync_s,
        "bound": parts["part"] if total > backward or sync_s > compute else "compute",
        "global_batch": count * k * trace.batch_size,
        "fits": peak <= _usable(hardware),
        "detail": {
            "framework": framework.name,
            "accumulate": k,
            "buckets": len(buckets),
            "reducer_s": reducer,  # DDP's own work a step (ddp_reducer_s), in compute_s
            "bucket_fixed_s": per_bucket,  # launch + framework wait, each bucket
            "fixed_s": per_bucket * len(buckets) if count > 1 else 0.0,
            "contention": link.contention,
            "overlap": link.overlap,
            "allreduce_s": total,
            "hidden_s": total - exposed,
            "exposed_s": exposed,
            "skew_s": skew,
            **_sync_detail(synced, count, sync_s),
        },
    }


def _sync_detail(synced, count: int, seconds: float) -> dict:
    """SyncBatchNorm's collectives of a ddp step, when it has them."""
    if not synced:
        return {}
    return {
        "sync_batchnorm": {
            "layers": len({each.layer for each in synced}),
            "all_gathers": sum(each.kind == "all_gather" for each in synced),
            "all_reduces": sum(each.kind == "all_reduce" for each in synced),
            "payload_bytes": sum(each.payload_bytes for each in synced),
            "bytes_sent_per_device": sum(each.bytes_sent_per_device(count) for each in synced),
            "seconds": seconds,
        }
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


def _pipeline_step(trace, hardware, single, stages, link, microbatches, schedule="gpipe"):
    """(step seconds, compute seconds, comm seconds, fits, detail) of one batch on S stages.
    2bw (PipeDream-2BW) runs on across steps: in steady state a step is M slots, no fill, and
    each stage keeps two snapshots of its weights (the batch finishing and the batch starting)
    beside the optimizer's own (Narayanan et al., ICML 2021, section 3.1)."""
    p = single.prediction
    split = _stages(trace, p, stages)
    if split is None:
        return None
    groups, times = split
    stage_s = [single.compute(sum(times.get(r.name, 0.0) for r in group)) for group in groups]
    # A boundary sends a microbatch's activations forward and their gradients back, each send
    # paying a hop's latency and a launch: the per-microbatch overhead.
    boundary = [group[-1].output_bytes / microbatches for group in groups[:-1]]
    per_send = link.latency_s + link.launch_s
    send_s = max((2 * (b / link.effective_bytes_per_s + per_send) for b in boundary), default=0.0)
    slot = max(stage_s) / microbatches
    slots = microbatches if schedule == "2bw" else microbatches + stages - 1
    update = single.compute(p.optimizer_s + p.h2d_s) / stages
    compute = slots * slot + update + single.per_step_s
    comm = slots * send_s
    memory = training_memory(trace)
    state_per_param = (memory.static_bytes / trace.params) if trace.params else 0.0
    worst = 0.0
    versions = WEIGHT_SNAPSHOTS_2BW if schedule == "2bw" else 0
    for index, group in enumerate(groups):
        held = in_flight("1f1b", microbatches, stages, index)
        saved = sum(r.saved_bytes for r in group) / microbatches * held
        params = sum(r.params for r in group)
        stash = versions * params * FP32_BYTES
        worst = max(worst, params * state_per_param + saved + stash)
    detail = {
        "stages": stages,
        "microbatches": microbatches,
        "schedule": schedule,
        "bubble": (slots - microbatches) / slots,
        "weight_versions": versions,
        "stage_s": stage_s,
        "boundary_bytes": boundary,
        "microbatch_overhead_s": slots * 2 * per_send if boundary else 0.0,
        "stage_memory_bytes": worst,
    }
    return compute + comm, compute, comm, worst <= _usable(hardware), detail


def microbatches(trace: StepTrace, stages: int) -> int:
    """4 per stage, but no more than the batch has samples (a microbatch holds one at least)."""
    return max(1, min(MICROBATCHES_PER_STAGE * stages, trace.batch_size))


def _pipeline(trace, hardware, single, count, where, _plans):
    if count < 2:
        return None
    micro = microbatches(trace, count)
    step = _pipeline_step(trace, hardware, single, count, where.link, micro, where.schedule)
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


def closed_loop_cycle_s(think_s: float, demands: list[float], customers: int) -> float:
    """One customer's mean cycle in a closed loop of `customers`, each spending `think_s` on its
    own and then visiting every station in turn, a station serving one customer at a time for
    its demand in `demands` (seconds a visit): exact mean-value analysis (Reiser and Lavenberg,
    "Mean-Value Analysis of Closed Multichain Queuing Networks", JACM 27(2), 1980; exact where
    service times are exponential). One customer never waits: think + the demands."""
    queues = [0.0] * len(demands)
    cycle = think_s + sum(demands)
    for customer in range(1, customers + 1):
        residence = [demand * (1 + queue) for demand, queue in zip(demands, queues, strict=True)]
        cycle = think_s + sum(residence)
        queues = [customer / cycle * seconds for seconds in residence]
    return cycle


def _ps(trace, hardware, single, count, where, _plans):
    nodes, network, servers = where.nodes, where.network, where.servers
    over = network if nodes > 1 and network is not None else where.link
    grad_bytes = trace.trainable_params * FP32_BYTES
    # dlscale's ps in its default mode, async (strategies/ps/exchange.py): a worker computes its
    # gradients, pushes them to every server and waits for the weights each replies with once it
    # has applied them under its shard's lock; no worker waits for another. One way, all shards:
    transfer_s = grad_bytes / over.effective_bytes_per_s * over.contention
    update_s = single.compute(single.prediction.optimizer_s)  # on the servers, not the worker
    compute = single.step_s - update_s
    # The wire (strategies/ps/server.py): to each server a request header and the gradients,
    # then from each a reply header and the weights, each a blocking message: four hops of
    # latency a server, a step.
    messages_s = PS_MESSAGES * servers * over.latency_s * over.contention + 2 * over.launch_s
    # A server serves a push in three parts: its shard of the gradients in over its link, its
    # share of the update (one push at a time, under its lock), its shard of the weights out
    # (full duplex: in and out apart). Its thread per worker moves several pushes' bytes at once,
    # sharing the link: each part is a queue with the same mean wait. The S servers serve a
    # push's S shards side by side, taken as one set of stations S times as fast; the rest of a
    # worker's own transfer (all shards, both ways, beyond one server's share) is its own
    # link's, which no other worker uses. The update is priced at the workers' device's rate
    # (dlscale's servers step on the host's CPU: for GPU workers an under-price, named).
    shard_s = transfer_s / servers
    stations = [shard_s, update_s / servers, shard_s]
    own_s = 2 * (transfer_s - shard_s)
    alone_s = compute + messages_s + own_s + sum(stations)  # a step with no other worker
    step = closed_loop_cycle_s(compute + messages_s + own_s, stations, count)
    waiting_s = step - alone_s  # queueing at the servers behind the other workers' pushes
    comm = step - compute
    busy = count / step * max(stations)  # the busiest server part's share of the time
    # Bound by the longest part of a step: the worker's compute, its time at the servers
    # (waiting and served), or its own link's (its transfer beyond the servers', the messages).
    side = "network" if over is network else "link"
    parts = {"compute": compute, "server": waiting_s + sum(stations), side: own_s + messages_s}
    bound = max(parts, key=parts.get)
    return {
        "step_s": step,
        "samples_per_s": count * trace.batch_size / step,
        "compute_s": compute,
        "comm_s": comm,
        "bound": bound,
        "global_batch": count * trace.batch_size,
        "fits": training_memory(trace).total_bytes <= _usable(hardware),
        "detail": {
            "priced_as": "async",  # whatever the spec's mode (averaging, downpour): named
            "servers": servers,
            "worker_s": 2 * transfer_s,  # its gradients out and the weights back, a step
            "server_link_s": 2 * shard_s,  # one server's share of one push, in and out
            "server_update_s": update_s / servers,  # one server's share of one push's update
            "server_busy": busy,
            "waiting_s": waiting_s,
            "messages_s": messages_s,
            "contention": over.contention,
        },
    }


def _hybrid(trace, hardware, single, count, where, _plans):
    stages = HYBRID_STAGES
    if count < 2 * stages or count % stages:
        return None
    replicas = count // stages
    micro = microbatches(trace, stages)
    step = _pipeline_step(trace, hardware, single, stages, where.link, micro, where.schedule)
    if step is None:
        return None
    seconds, compute, comm, fits, detail = step
    stage_bytes = trace.trainable_params * FP32_BYTES / stages  # roughly each stage's share
    parts = {"part": "link"}
    sync = where.reduce(stage_bytes, replicas, parts)
    skew = skew_s(single.step_s, where.framework.step_cv, replicas)
    total = seconds + sync + skew
    bound = parts["part"] if comm + sync > compute else "compute"
    return {
        "step_s": total,
        "samples_per_s": replicas * trace.batch_size / total,
        "compute_s": compute,
        "comm_s": comm + sync,
        "bound": bound,
        "global_batch": replicas * trace.batch_size,
        "fits": fits,
        "detail": {**detail, "replicas": replicas, "replica_sync_s": sync, "skew_s": skew},
    }


def _tensor(trace, hardware, single, plan, link, accumulate: int = 1):
    """One optimizer step over a tensor-parallel group of plan.degree devices (one node's
    link): `accumulate` micro-batches of the traced batch, each its forward, backward, copy in
    and the plan's activation collectives (every micro-batch sends them, as training counts
    them: K × one micro-batch's), the update of the device's share once."""
    p, count, k = single.prediction, plan.degree, accumulate
    split = split_layers(trace, plan)
    layer_s = sum(lt.seconds / count if lt.name in split else lt.seconds for lt in p.layers)
    share = plan.params_per_device / plan.params if plan.params else 1.0
    micro = single.compute(layer_s + p.h2d_s)
    compute = k * micro + single.compute(p.optimizer_s * share) + single.per_step_s
    comm = 0.0
    for kind, payload in plan.collectives(trace.batch_size):
        reduce = ring_allreduce_s if kind == "all_reduce" else all_gather_s
        comm += reduce(payload, count, link)
    comm *= k
    memory = training_memory(trace)
    saved = {layer.name: layer.saved_bytes for layer in trace.layers}
    activations = sum(b / count if name in split else b for name, b in saved.items())
    # One micro-batch's activations at a time; the step's other K − 1 batches of inputs wait
    # on the device (the loop copies them together).
    per_device = memory.static_bytes * share + activations + (k - 1) * memory.batch_bytes
    step = compute + comm
    return {
        "step_s": step,
        "samples_per_s": k * trace.batch_size / step,
        "compute_s": compute,
        "comm_s": comm,
        "bound": "link" if comm > compute else "compute",
        "global_batch": k * trace.batch_size,
        "fits": per_device <= _usable(hardware),
        "detail": {
            "degree": count,
            "accumulate": k,
            "split_layers": len(split & set(plan.styles)),
            "params_per_device": plan.params_per_device,
            "memory_per_device_bytes": per_device,
            "collectives": plan.comm_per_step(trace.batch_size),
        },
    }


def _tensor_at(trace, hardware, single, count, where, plans):
    """Where `plans` (degree -> TensorPlan or None) has a plan for `count` devices."""
    plan = plans(count) if plans is not None and count > 1 else None
    if plan is None:
        return None
    return _tensor(trace, hardware, single, plan, where.link, where.accumulate)


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
