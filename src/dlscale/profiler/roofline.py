"""The roofline model: each layer's time on a device from its FLOPs, bytes and op count.

For one phase of one layer (Williams, Waterman and Patterson, "Roofline", CACM 2009):

    time = max(matmul FLOPs / (rate at the training precision and the products' size)
               + other FLOPs / (fp32 peak × compute efficiency),
               bytes moved / (memory bandwidth × memory efficiency))
         + ops × per-op overhead

Matrix products run on the precision's fastest units (tensor cores for bf16/fp16), at the rate a
product of their size reaches where the device's curve was measured (`local`), else at the
peak × the precision's efficiency (3×3 stride-1 convolutions on a catalogue GPU at fp32 faster by
Winograd's saving, hardware.device.winograd_speedup); elementwise work runs on the vector units,
at the fp32 rate. The overhead term is the fixed cost of launching one kernel or dispatching one
eager op (autograd included), which is what small layers mostly pay. A step adds the
optimizer update, the host→device copy of the batch over the host link (not overlapped) and the
fixed cost of one step of dlscale's own loop (`Hardware.overhead_per_step_s`).

Each phase says where the rate that sets its time came from: `measured` (a curve or share that
`bench machine` timed here, or the measured per-op cost) or `roofline` (a datasheet peak × an
efficiency, a default share or the default per-op cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.hardware.device import Hardware
from dlscale.profiler.gemms import PRODUCTS, UNBATCHED_PRODUCTS, Gemm
from dlscale.profiler.recorder import PhaseCost
from dlscale.profiler.trace import StepTrace


@dataclass(frozen=True)
class PhaseTime:
    seconds: float
    compute_s: float
    memory_s: float
    overhead_s: float
    compute_measured: bool = False  # the larger part of compute_s ran at measured rates
    memory_measured: bool = False  # the larger part of memory_s ran at measured shares
    overhead_measured: bool = False  # the per-op cost was measured
    # Page faults of the phase's new tensors above the allocator's threshold (a CPU's), in
    # `seconds` beside the phase's work (the larger of compute and memory; in a fused recurrent
    # kernel its products, then its gates): the kernel's work, not the op's.
    first_touch_s: float = 0.0
    # A fused recurrent kernel's products alone (None elsewhere): its work is these, then the
    # longer of its gates' FLOPs (the rest of compute_s) and their bytes (memory_s), so
    # compute_s + memory_s is not its time.
    kernel_products_s: float | None = None

    @property
    def source(self) -> str:
        """Where the rate that sets this phase's time came from: 'measured', 'roofline' (a
        peak × efficiency or a default) or 'none' (no op runs)."""
        measured = {
            "none": None,
            "compute": self.compute_measured,
            "memory": self.memory_measured,
            "overhead": self.overhead_measured,
        }[self.bound]
        if measured is None:
            return "none"
        return "measured" if measured else "roofline"

    @property
    def bound(self) -> str:
        """What limits this phase: 'compute', 'memory', 'overhead' (launch/dispatch) or 'none'."""
        if self.seconds == 0:
            return "none"  # a view (flatten, reshape): no op runs
        if self.kernel_products_s is not None:  # products, then the gates' longer part
            if self.overhead_s > self.seconds - self.overhead_s - self.first_touch_s:
                return "overhead"
            gates_flops_s = self.compute_s - self.kernel_products_s
            longest = max(self.kernel_products_s, gates_flops_s)
            return "memory" if self.memory_s > longest else "compute"
        if self.overhead_s > max(self.compute_s, self.memory_s):
            return "overhead"
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class LayerTime:
    name: str
    forward: PhaseTime
    backward: PhaseTime
    intensity: float  # forward FLOPs per byte moved

    @property
    def seconds(self) -> float:
        return self.forward.seconds + self.backward.seconds

    @property
    def bound(self) -> str:
        return self.forward.bound


@dataclass(frozen=True)
class Prediction:
    hardware: str
    precision_used: str  # the peak used for matrix products (fp32 if the device lacks bf16)
    layers: list[LayerTime]
    forward_s: float
    backward_s: float
    optimizer_s: float
    h2d_s: float
    loop_s: float  # dlscale's own loop per step: sampler, timers, loss read-back, progress
    step_s: float
    samples_per_s: float
    steps_per_epoch: int | None
    epoch_s: float | None
    h2d_memory: str = ""  # how the batch's copy was priced: pinned, pageable, ... ("": none)
    # Micro-batches of the traced batch per optimizer step (the spec's `accumulate`): forward,
    # backward and host→device above are the whole step's, the K micro-batches' together.
    accumulate: int = 1
    # The step's state passes the device's last-level cache: its products were priced with their
    # operands read from memory (Hardware.reads_cold).
    products_cold: bool = False

    @property
    def micro_batch_s(self) -> float:
        """One micro-batch's forward, backward and copy in (the step without its update and
        loop cost, when there is one micro-batch a step)."""
        return (self.forward_s + self.backward_s + self.h2d_s) / self.accumulate

    def bound_layers(self, bound: str) -> list[str]:
        return [layer.name for layer in self.layers if layer.bound == bound]

    def phase_sources(self) -> dict[str, int]:
        """How many layer phases (forward and backward apart) took their time from measured
        rates and how many from the roofline's peaks; phases where no op runs are left out."""
        counts = {"measured": 0, "roofline": 0}
        for layer in self.layers:
            for phase in (layer.forward, layer.backward):
                if phase.source != "none":
                    counts[phase.source] += 1
        return counts

    def roofline_layers(self) -> list[str]:
        """Layers with a phase whose time came from the roofline's peaks, not a measurement."""
        return [
            layer.name
            for layer in self.layers
            if "roofline" in (layer.forward.source, layer.backward.source)
        ]

    def time_share(self, bound: str) -> float:
        """Share of forward+backward time spent in layers limited by `bound`."""
        total = sum(layer.seconds for layer in self.layers) or 1.0
        return sum(layer.seconds for layer in self.layers if layer.bound == bound) / total


def phase_time(
    cost: PhaseCost,
    hardware: Hardware,
    precision: str,
    phase: str = "forward",
    working_set_bytes: int | None = None,
    fresh_pages: bool = False,
    cold: bool = False,
) -> PhaseTime:
    """One phase of one layer; `working_set_bytes`: the optimizer's update of one tensor (or of
    all of them, for foreach kernels), whose bytes moved run at the rate measured for updates
    of that working set; `fresh_pages`: the process hands large freed blocks back to the
    kernel (the spec's `keep_freed_memory: false`), so the phase's large new tensors fault
    their pages in (Hardware.first_touch_seconds); by default dlscale's loop keeps them;
    `cold`: the step reads its products' operands from memory (Hardware.reads_cold), so its
    plain products and small pointwise convolutions' per-sample products run at the rates of
    products timed that way."""
    products: list[tuple[float, bool]] = [
        conv_seconds(hardware, precision, phase, *conv, cold=cold)
        for conv in cost.conv_shapes()
        if conv[0]
    ]
    products += [
        (
            flops / hardware.attention_rate(precision, flops, keys, causal, phase),
            hardware.measures_rate(
                precision, ("attention_flops_per_s", "causal" if causal else "full", phase)
            ),
        )
        for flops, keys, causal in cost.attention
        if flops
    ]
    products += plain_products(cost, hardware, precision, cold)
    products_s = sum(seconds for seconds, _ in products)
    # Elementwise FLOPs run on the vector units at the fp32 peak: a roofline figure everywhere.
    vector_s = cost.other_flops / (hardware.peak_flops["fp32"] * hardware.efficiency_compute)
    compute_s = products_s + vector_s
    bandwidth = hardware.memory_bandwidth_bytes_per_s
    # Memory-bound ops at their own measured efficiency (max-pooling on a CPU reaches a tenth of
    # the stream bandwidth that ReLU reaches); everything else at the device's default.
    moves = [
        (
            moved / (bandwidth * hardware.op_efficiency(op, working_set_bytes)),
            hardware.measures_memory_op(op, working_set_bytes),
        )
        for op, moved in cost.bytes_by_op.items()
    ]
    rest = cost.bytes - sum(cost.bytes_by_op.values())
    moves.append((rest / (bandwidth * hardware.efficiency_memory), False))
    in_kernel = cost.kernel_step_bytes and hardware.cache_copy_rate(cost.kernel_step_bytes)
    if in_kernel:
        # A fused recurrent kernel: each time step's products, then its gates on what they
        # made, the next step waiting on both. The gates' bytes stay in the caches (a step's
        # working set is one layer and direction's weights and a few of the batch's rows),
        # moved at the rate copies of that working set ran; the products' operands are in
        # their grid rates already.
        moves = [(sum(cost.bytes_by_op.values()) / in_kernel, True)]
    memory_s = sum(seconds for seconds, _ in moves)
    overhead_s = cost.ops * hardware.overhead_per_op_s
    # An update's page faults are in its measured share (optimizer_efficiency timed them).
    faults = fresh_pages and not working_set_bytes
    first_touch_s = hardware.first_touch_seconds(cost.new_outputs) if faults else 0.0
    # In the kernel the gates' FLOPs and their bytes are one pass after the products.
    work_s = products_s + max(vector_s, memory_s) if in_kernel else max(compute_s, memory_s)
    return PhaseTime(
        work_s + overhead_s + first_touch_s,
        compute_s,
        memory_s,
        overhead_s,
        compute_measured=_mostly_measured([*products, (vector_s, False)]),
        memory_measured=_mostly_measured(moves),
        overhead_measured="training_op_overhead_s" in hardware.measured,
        first_touch_s=first_touch_s,
        kernel_products_s=products_s if in_kernel else None,
    )


def conv_seconds(
    hardware: Hardware,
    precision: str,
    phase: str,
    flops: int,
    weight: int,
    pixels: int,
    winograd: bool,
    per_sample: Gemm | None,
    cold: bool = False,
) -> tuple[float, bool]:
    """(seconds, measured?) of one convolution or its backward: at the convolution grid's rate
    for its weight and output pixels; a small pointwise one (`per_sample`, see
    recorder.small_pointwise) on a device that computes those one sample at a time at the rate
    of that sample's product (hardware.per_sample_pointwise_convs), read from memory where the
    step is `cold` (phase_time)."""
    if per_sample is not None and hardware.per_sample_pointwise_convs():
        rate = hardware.gemm_rate(precision, per_sample.m, per_sample.k, per_sample.n, cold)
        return flops / rate, hardware.measures_gemm(precision)
    return (
        flops / hardware.conv_rate(precision, flops, weight, pixels, phase, winograd),
        hardware.measures_rate(precision, ("conv_flops_per_s", phase)),
    )


def plain_products(
    cost: PhaseCost, hardware: Hardware, precision: str, cold: bool = False
) -> list[tuple[float, bool]]:
    """(seconds, measured?) of the phase's plain matrix products (neither convolution nor
    attention): each GEMM the tracer mapped (profiler/gemms.py) at the rate of its own shape,
    timed with its operands read from memory where the step is `cold` (phase_time) and the
    product is a layer's, not batched (gemms.UNBATCHED_PRODUCTS: inside GPT-2's step at batch 1
    its batched [4, 64, 64] products took 43 µs a call, 29–31 µs hot and 89–100 cold alone); a
    batched product's batch counts as more rows (M × batch), as its kernel streams through them.
    Products known only by FLOPs (an op not mapped, a cost built by hand) at the square curve's
    rate for their mean FLOPs per op."""
    others = cost.matmul_flops - cost.conv_flops - cost.attention_flops
    ops = cost.matmul_ops - len(cost.convs) - len(cost.attention)
    found = []
    for gemm in cost.gemms:
        if gemm.name in PRODUCTS and gemm.macs:
            flops = 2 * gemm.macs
            read_cold = cold and gemm.name in UNBATCHED_PRODUCTS
            rate = hardware.gemm_rate(precision, gemm.m * gemm.repeats, gemm.k, gemm.n, read_cold)
            found.append((flops / rate, hardware.measures_gemm(precision)))
            others -= flops
            ops -= 1
    if others > 0:
        seconds = others / hardware.matmul_rate(precision, others / max(1, ops))
        found.append((seconds, hardware.measures_matmul(precision)))
    return found


def _mostly_measured(parts: list[tuple[float, bool]]) -> bool:
    """Whether the measured parts of a sum of (seconds, measured?) outweigh the others."""
    measured = sum(seconds for seconds, is_measured in parts if is_measured)
    return measured > 0 and measured >= sum(seconds for seconds, _ in parts) - measured


def host_to_device_s(batch_bytes: int, hardware: Hardware, pinned: bool = True) -> float:
    """The batch crosses the host link once per step, from pinned or pageable host memory as
    the loader leaves it (on `local` a pageable copy measured 5.8–9.1 GB/s on an H100 against 53
    pinned); a CPU trains from its own memory. The loop waits for the copy before the step
    (it times the copy apart), so nothing overlaps it."""
    rate, _ = hardware.host_copy_bytes_per_s(pinned)
    if hardware.kind == "cpu" or not rate:
        return 0.0
    return batch_bytes / rate


def optimizer_seconds(trace: StepTrace, hardware: Hardware) -> float:
    """The update as dlscale's trainer runs it: on a CPU torch's fused kernel, tensor by tensor
    (torch's loop of kernels for an optimizer without one), each tensor at the rate of its own
    working set (its parameter, gradient and state); torch's foreach kernels over all tensors
    at once on accelerators."""
    if hardware.kind == "cpu":
        return sum(
            phase_time(
                tensor.cost, hardware, "fp32", working_set_bytes=tensor.working_set_bytes
            ).seconds
            for tensor in trace.optimizer_tensors
        )
    return phase_time(
        trace.optimizer_foreach,
        hardware,
        "fp32",
        working_set_bytes=trace.optimizer_working_set_bytes,
    ).seconds


def predict(
    trace: StepTrace,
    hardware: Hardware,
    dataset_size: int | None = None,
    pinned: bool = True,
    accumulate: int = 1,
    fresh_pages: bool = False,
) -> Prediction:
    """Step (and epoch) time of a traced training step on `hardware`; `pinned`: whether the
    loader's batches sit in pinned host memory (the loop's default on CUDA). With `accumulate`
    K, an optimizer step runs K micro-batches of the traced batch, as the training loop does
    (each its forward, backward and copy in; the update and the loop's per-step cost once),
    and an epoch has dataset_size // (K × batch) such steps. `fresh_pages`: see phase_time."""
    layers = []
    cold = hardware.reads_cold(trace.optimizer_working_set_bytes, trace.precision)
    for layer in trace.layers:
        forward_cost, backward_cost = layer.phases(hardware.kind)  # an LSTM fused on a CPU
        forward = phase_time(
            forward_cost, hardware, trace.precision, fresh_pages=fresh_pages, cold=cold
        )
        backward = phase_time(
            backward_cost, hardware, trace.precision, "backward", fresh_pages=fresh_pages, cold=cold
        )
        intensity = layer.forward.flops / layer.forward.bytes if layer.forward.bytes else 0.0
        layers.append(LayerTime(layer.name, forward, backward, intensity))
    optimizer_s = optimizer_seconds(trace, hardware)
    h2d_s = host_to_device_s(trace.batch_bytes, hardware, pinned)
    forward_s = accumulate * sum(layer.forward.seconds for layer in layers)
    backward_s = accumulate * sum(layer.backward.seconds for layer in layers)
    h2d_s *= accumulate
    loop_s = hardware.overhead_per_step_s
    step_s = forward_s + backward_s + optimizer_s + h2d_s + loop_s
    step_batch = accumulate * trace.batch_size
    steps = dataset_size // step_batch if dataset_size else None
    return Prediction(
        hardware=hardware.name,
        precision_used=hardware.peak(trace.precision)[1],
        layers=layers,
        forward_s=forward_s,
        backward_s=backward_s,
        optimizer_s=optimizer_s,
        h2d_s=h2d_s,
        h2d_memory=hardware.host_copy_bytes_per_s(pinned)[1] if h2d_s else "",
        loop_s=loop_s,
        step_s=step_s,
        samples_per_s=step_batch / step_s,
        steps_per_epoch=steps,
        epoch_s=steps * step_s if steps is not None else None,
        accumulate=accumulate,
        products_cold=cold,
    )


def prediction_spread(hardware: Hardware) -> float | None:
    """The relative uncertainty of a prediction on `hardware`: the median spread of the probes
    its calibration timed (a measured entry only; catalogue figures carry none)."""
    spread = hardware.measured.get("spread") if isinstance(hardware.measured, dict) else None
    return float(spread["median"]) if spread and "median" in spread else None
