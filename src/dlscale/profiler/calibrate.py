"""Calibrate the per-op cost of training on this machine: dispatch, autograd and optimizer."""

from __future__ import annotations

import math
import time
from collections import Counter

import torch
from torch import nn

from dlscale.free_memory import available_memory_bytes
from dlscale.jobspec import OptimizerSpec
from dlscale.profiler.recorder import LOSS
from dlscale.profiler.trace import trace_step
from dlscale.train.device import synchronize
from dlscale.train.step import build_optimizer

TINY_WIDTH = 8  # products this small cost nothing; what remains is the per-op overhead
TINY_DEPTH = 16
TINY_BATCH = 4


def settle_allocator() -> None:
    """Put the C allocator in the state a training process reaches after its first step.

    glibc serves blocks above its mmap threshold with fresh pages, one page fault per 4 KiB on
    first touch, and raises that threshold to the size of each such block freed (up to 32 MiB).
    A training loop frees its large activations after the first step, so from then on its
    temporaries come from the heap without faults; a fresh benchmark process has not yet, and
    an Adam step over 4M parameters runs 3× slower there. Freeing one large block first makes
    calibration measure the steady state.
    """
    torch.empty((32 << 20) - 4096, dtype=torch.uint8)  # allocated and freed at once


# Each probe is timed in rounds until the last three agree (their max / min − 1 within
# STABLE_SPREAD) or MAX_ROUNDS have run; the median round counts. A busy machine shows as spread.
ROUNDS, MAX_ROUNDS, STABLE_SPREAD = 3, 7, 0.10
_spreads: list[float] = []  # relative spread of every probe timed since start_spread_log()


def start_spread_log() -> None:
    _spreads.clear()


def spread_log() -> list[float]:
    return list(_spreads)


def relative_spread(values: list[float]) -> float:
    """max / min − 1 of a probe's rounds: 0 when they agree."""
    return max(values) / max(min(values), 1e-12) - 1


def stable_median(measure, rounds: int = ROUNDS, most: int = MAX_ROUNDS) -> float:
    """`measure()` repeated until its last `rounds` results agree within STABLE_SPREAD (or
    `most` results); their median, with their spread logged."""
    results = [measure() for _ in range(rounds)]
    while relative_spread(results[-rounds:]) > STABLE_SPREAD and len(results) < most:
        results.append(measure())
    last = sorted(results[-rounds:])
    _spreads.append(relative_spread(last))
    return last[len(last) // 2]


def seconds_per_call(fn, device: torch.device, min_time_s: float, warmup: int = 3) -> float:
    """Seconds of `fn()`, the stable median of rounds of at least `min_time_s` / ROUNDS (and 3
    calls) each, after `warmup` calls."""
    settle_allocator()
    for _ in range(warmup):
        fn()
    synchronize(device)

    def one_round() -> float:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_time_s / ROUNDS or calls < 3:
            fn()
            calls += 1
        synchronize(device)
        return (time.perf_counter() - start) / calls

    return stable_median(one_round)


def adam(params) -> torch.optim.Optimizer:
    """Adam as dlscale's trainer builds it (train/step.py): torch's fused kernel on a CPU,
    its foreach kernels on an accelerator. The probes time the update training runs."""
    return build_optimizer(params, OptimizerSpec(name="adam"))


def _tiny_model() -> nn.Module:
    layers = []
    for _ in range(TINY_DEPTH):
        layers += [nn.Linear(TINY_WIDTH, TINY_WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def training_op_overhead_s(device: torch.device, min_time_s: float = 0.5) -> float:
    """Seconds per aten op of a real training step of tiny layers, ops counted by the tracer.

    A bare `torch.add` measures dispatch alone; a training step also builds autograd nodes, runs
    the backward engine and steps the optimizer per parameter, and small models pay that per op.
    """
    sample = torch.zeros(TINY_WIDTH)
    trace = trace_step(_tiny_model, sample, TINY_BATCH, "fp32", adam, "adam")
    ops = sum(layer.forward.ops + layer.backward.ops for layer in trace.layers)
    # the update as `adam` builds it here: fused on a CPU, foreach kernels elsewhere
    ops += trace.optimizer.ops if device.type == "cpu" else trace.optimizer_foreach.ops
    model = _tiny_model().to(device)
    optimizer = adam(model.parameters())
    x = torch.randn(TINY_BATCH, TINY_WIDTH, device=device)
    y = torch.randint(0, TINY_WIDTH, (TINY_BATCH,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()

    return seconds_per_call(step, device, min_time_s, warmup=10) / ops


# The grid of convolutions timed: (input channels, output channels, kernel, input grad?) by
# (batch, side) of the input. The smallest is a first layer (one input channel, no gradient for
# the input, as every network's first convolution); the others are mid-network 3×3 layers. Their
# weights span 200 to 590k elements (2.4M on a CPU), and their outputs 8 to 8192 pixels on a
# CPU; a GPU times 128 to 8192 and also 65,536 and 1,048,576, the sizes of real layers there
# (ResNet-50 at batch 64: 3,136 to 802,816 output pixels; AlexNet at 128: 21,632 to 387,200): an
# H100's grid that stopped at 8,192 priced ResNet-50's fp32 step at 4.07× the measured one
# (docs/performance.md). A CPU trains small batches of small images, whose last layers have
# 512 channels on a 2×2 or 4×4 map: a 512-channel 3×3 layer at batch 4 on a 2×2 map ran at
# 14 GFLOP/s on the 2-core development machine, a 256-channel one on 4×4 at 48, against 60 at
# the old grid's smallest point (128 pixels), which priced them (ResNet-18 at batch 4 0.70 of its
# measured step, ResNet-50 at 2 0.66). ResNet-50's last stage at batch 2 has 8 pixels (2×2):
# priced at the 16-pixel rate it ran at 0.76 of its step; with the 8-pixel point 0.81 in a run of
# the ResNets alone and 0.75 in the next whole run, a slower one (docs/performance.md).
CONV_LAYERS = ((1, 8, 5, False), (16, 16, 3, True), (64, 64, 3, True), (256, 256, 3, True))
CPU_CONV_LAYERS = (*CONV_LAYERS, (512, 512, 3, True))
CONV_INPUTS = {  # (batch, side) by device type: output pixels 8, 16, 64, 128, 1024, 8192 on a CPU
    "cpu": ((2, 2), (4, 2), (4, 4), (2, 8), (16, 8), (8, 32)),
    "cuda": ((2, 8), (16, 8), (8, 32), (16, 64), (16, 256)),
}


def conv_inputs(device_type: str) -> tuple[tuple[int, int], ...]:
    """The (batch, side) inputs the convolution grid is timed at on this kind of device."""
    return CONV_INPUTS.get(device_type, CONV_INPUTS["cpu"])


def conv_layers(device_type: str) -> tuple[tuple[int, int, int, bool], ...]:
    """The layers the convolution grid times on this kind of device."""
    return CONV_LAYERS if device_type == "cuda" else CPU_CONV_LAYERS


def conv_point_bytes(c_in: int, c_out: int, batch: int, side: int) -> int:
    """Memory one grid point's training step holds, about: input and output, each with its
    gradient, in fp32, twice over for the library's workspace and the allocator's rounding
    (the largest CUDA point, 256 channels at batch 16 and side 256, about 8 GiB)."""
    return 2 * 2 * (c_in + c_out) * batch * side * side * 4


# A CPU skips the grid's points whose forward exceeds this: the 512-channel layer at 8,192
# pixels (39 GFLOP, over a second a step here, timed several times), a size no CPU-sized
# training reaches (ResNet-50 at 224 × 224 and batch 8 has 392 pixels at 512 channels).
CPU_CONV_MAX_FLOPS = 20e9


def conv_point_flops(layer: tuple[int, int, int, bool], batch: int, side: int) -> float:
    """A grid point's forward FLOPs (2 per multiply-add; padding keeps the side)."""
    c_in, c_out, kernel, _ = layer
    return 2.0 * c_in * c_out * kernel * kernel * batch * side * side


def conv_points_that_fit(device: torch.device, free_bytes: int | None = None):
    """The grid's (layer, input) points whose step fits in the memory free now: a small GPU
    or a MIG slice skips the largest sizes instead of failing the whole bench. A CPU also skips
    the points beyond CPU_CONV_MAX_FLOPS."""
    free = available_memory_bytes(device) if free_bytes is None else free_bytes
    most = math.inf if device.type == "cuda" else CPU_CONV_MAX_FLOPS
    return [
        (layer, (batch, side))
        for layer in conv_layers(device.type)
        for batch, side in conv_inputs(device.type)
        if conv_point_bytes(layer[0], layer[1], batch, side) <= free
        and conv_point_flops(layer, batch, side) <= most
    ]


def _time_training_step(
    model: nn.Module, x: torch.Tensor, device: torch.device, min_time_s: float
) -> float:
    """Seconds of one forward + backward of `model` on `x`: the ops the tracer counts, no more.

    The backward starts from a dense gradient of ones, as a layer inside a network receives it:
    a loss such as `.sum()` would add a read of the output per step that no traced row holds
    (and hand back a broadcast gradient, cheaper to read than a real one). The input's gradient
    is dropped before each step, as the parameters' are: kept, every step would add it to the
    last one, two reads and a write of the input that a layer inside a network never does (with
    the loss's read, 512 MiB a step beside the 640 MiB a 128 MiB ReLU probe's trace counts).
    `x` is copied to the device as a leaf of its own: a gradient that flowed back through the
    copy to the caller's tensor would add a device→host copy to every timed step.
    """
    model = model.to(device)
    x = x.detach().to(device).requires_grad_(x.requires_grad)
    with torch.no_grad():
        output_grad = torch.ones_like(model(x))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).backward(output_grad)

    return seconds_per_call(step, device, min_time_s)


def _time_forward(
    model: nn.Module, x: torch.Tensor, device: torch.device, min_time_s: float
) -> float:
    """Seconds of `model`'s forward on `x` as a training step runs it: autograd recording (a
    max pooling's training forward also writes the indices its backward reads, which one under
    `no_grad` does not), the graph dropped after each call."""
    model = model.to(device)
    x = x.detach().to(device).requires_grad_(x.requires_grad)
    return seconds_per_call(lambda: model(x), device, min_time_s)


def _traced(build, sample: torch.Tensor, batch: int, input_requires_grad: bool = False):
    step = trace_step(build, sample, batch, "fp32", torch.optim.SGD, "sgd", input_requires_grad)
    return [layer for layer in step.layers if layer.name != LOSS]


def conv_rates(
    device: torch.device, overhead_s: float, min_time_s: float = 0.3
) -> dict[str, list[list[float]]]:
    """Achieved FLOP/s of convolutions, forward and backward apart, on a grid of shapes.

    Each phase gets a list of [weight elements, output pixels, FLOP/s] points. The backward op
    (the gradients of the weights, and of the input where it needs one) is timed as a training
    step minus a forward. Rates count the tracer's FLOPs, so they match how the roofline counts.
    """
    forward, backward = [], []
    for (c_in, c_out, kernel, input_grad), (batch, side) in conv_points_that_fit(device):
        build = lambda c_in=c_in, c_out=c_out, k=kernel: nn.Conv2d(  # noqa: E731
            c_in, c_out, k, padding=k // 2
        )
        sample = torch.zeros(c_in, side, side)
        (conv,) = _traced(build, sample, batch, input_requires_grad=input_grad)
        model = build().to(device)
        x = torch.randn(batch, c_in, side, side, device=device).requires_grad_(input_grad)
        seconds = _phase_seconds(
            model, x, conv.forward.ops, conv.backward.ops, device, overhead_s, min_time_s
        )
        for phase, found, phase_s in zip(
            (conv.forward, conv.backward), (forward, backward), seconds, strict=True
        ):
            ((flops, weight, pixels),) = phase.convs
            found.append([weight, pixels, flops / max(phase_s, 1e-9)])
    return {"forward": forward, "backward": backward}


def _phase_seconds(
    model, x, forward_ops: int, backward_ops: int, device, overhead_s: float, min_time_s: float
):
    """Seconds of a forward and of its backward (a training step minus the forward), the forward
    timed as a training step runs it (`_time_forward`), each less the per-op overhead of the ops
    the tracer counted in it."""
    forward_s = _time_forward(model, x, device, min_time_s)
    step_s = _time_training_step(model, x, device, min_time_s)
    return forward_s - forward_ops * overhead_s, step_s - forward_s - backward_ops * overhead_s


# Fused self-attention timed at these keys per query (= queries), head size 64, forward and backward
# apart, causal and full: a causal kernel skips the masked half of its blocks while the FLOP
# formula counts them all. Elements per input: enough heads to keep every core (or a GPU's SMs)
# busy.
ATTENTION_KEYS = (64, 256, 1024)
ATTENTION_HEAD = 64
ATTENTION_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 24}


class _Attention(nn.Module):
    """Self-attention of its own query, key and value, held as parameters so that the timed
    backward is the kernel's alone (no input gradient to split); the input is ignored."""

    def __init__(self, heads: int, keys: int, causal: bool):
        super().__init__()
        shape = (1, heads, keys, ATTENTION_HEAD)
        self.q, self.k, self.v = (nn.Parameter(torch.randn(shape)) for _ in range(3))
        self.causal = causal

    def forward(self, x):
        return nn.functional.scaled_dot_product_attention(
            self.q, self.k, self.v, is_causal=self.causal
        )


def attention_rates(
    device: torch.device, overhead_s: float, min_time_s: float = 0.3
) -> dict[str, dict[str, list[list[float]]]]:
    """Achieved FLOP/s of fused self-attention by keys per query: causal and full, each with a
    forward and a backward list of [keys, FLOP/s] points.

    Rates count the tracer's FLOPs (torch's SDPA formulas, which ignore the causal mask), so
    they match how the roofline counts. A point whose time could not be told from the overhead
    is left out.
    """
    found: dict[str, dict[str, list[list[float]]]] = {}
    elements = ATTENTION_ELEMENTS.get(device.type, ATTENTION_ELEMENTS["cpu"])
    for causal, name in ((True, "causal"), (False, "full")):
        forward, backward = [], []
        found[name] = {"forward": forward, "backward": backward}
        for keys in ATTENTION_KEYS:
            heads = max(1, elements // (keys * ATTENTION_HEAD))
            build = lambda h=heads, k=keys, c=causal: _Attention(h, k, c)  # noqa: E731
            (layer,) = _traced(build, torch.zeros(1), 1)
            x = torch.zeros(1, 1, device=device)
            seconds = _phase_seconds(
                build(), x, layer.forward.ops, layer.backward.ops, device, overhead_s, min_time_s
            )
            for phase, points, phase_s in zip(
                (layer.forward, layer.backward), (forward, backward), seconds, strict=True
            ):
                if phase_s > 0:
                    points.append([keys, phase.attention_flops / phase_s])
    return found


class _Probe(nn.Module):
    """One memory-bound operation as a module, so it can be traced and timed alike."""

    def __init__(self, kind: str, channels: int):
        super().__init__()
        self.kind = kind
        self.norm = nn.LayerNorm(channels) if kind == "layer_norm" else None
        self.batch_norm = nn.BatchNorm2d(channels) if kind == "batch_norm" else None

    def forward(self, x):  # (B, C, H, W)
        if self.kind == "relu":
            return torch.relu(x)
        if self.kind == "gelu":
            return nn.functional.gelu(x)
        if self.kind == "max_pool":
            return nn.functional.max_pool2d(x, 2)
        if self.kind == "softmax":
            return torch.softmax(x, dim=-1)
        if self.kind == "add":
            return x + x.flip(0)
        if self.kind == "layer_norm":
            return self.norm(x)
        if self.kind == "dropout":
            return nn.functional.dropout(x, DROPOUT_P, training=True)
        return self.batch_norm(x)


PROBES = ("relu", "gelu", "max_pool", "softmax", "add", "layer_norm", "batch_norm", "dropout")
# A probe phase's time under this share of its step's is taken for noise (op_efficiencies).
MIN_PHASE_FRACTION = 0.05
DROPOUT_P = 0.1  # GPT-2's and BERT's
# A probe whose ops other layers also run (dropout on a CPU: its random mask by `bernoulli_`, then
# `div_` and `mul`, ops of every elementwise layer) gives its share to its own ops alone, the
# others priced as a `local` entry prices an op no probe measured (the stream bandwidth) and
# taken off its time. Its mask cost 6 ns an element on the 2-core development machine, several
# times what its bytes take at stream bandwidth (GPT-2 at batch 1: 1.2 ms of dropout a forward
# against 0.3 priced as memory-bound).
OWN_OPS = {
    "dropout": (
        "bernoulli_",
        "bernoulli",
        "native_dropout",
        "native_dropout_backward",
        "_fused_dropout",
    )
}
# One sample is 256 KiB. On a CPU, batch 8 makes 2 MiB tensors, what a small model's layers hold.
# A GPU streams 2 MiB in about a microsecond, well under one kernel launch, so it is timed on
# 128 MiB tensors: what its share of bandwidth is when a layer is big enough for bandwidth to count.
PROBE_SHAPE = (16, 64, 64)
# The normalizations' shares depend on the normalized axis, so each is probed at a size the
# models in the zoo have (same 256 KiB a sample): layer norm over 1,024 features (GPT-2's 768,
# BERT's 1,024), batch norm over 256 channels of 16 × 16 (ResNet-50 has 64 to 2,048). Measured on
# an H100 (2026-11-27, `benchmarks/norm_probe_sizes.py`, the whole step's share then): batch
# norm reached 0.09 of bandwidth at 16 channels, 0.35 at 64, 0.90 at 256, 0.81 at 1,024 — few
# channels leave most of the 132 SMs idle; layer norm 0.18 over 64 features, 0.47 over 256, 0.55
# over 1,024.
PROBE_SHAPES = {"layer_norm": (64, 1024), "batch_norm": (256, 16, 16)}
PROBE_BATCH = {"cpu": 8, "cuda": 512}


def probe_shape(kind: str) -> tuple[int, ...]:
    """One sample's shape for the probe of `kind`."""
    return PROBE_SHAPES.get(kind, PROBE_SHAPE)


def probe_module(kind: str) -> _Probe:
    """The probe of `kind`, its normalization sized for `probe_shape(kind)`."""
    shape = probe_shape(kind)
    return _Probe(kind, shape[-1] if kind == "layer_norm" else shape[0])


def _own_bytes_and_time(
    phases: tuple[str, ...],
    seconds: dict[tuple[str, ...], float],
    moved: dict[str, Counter],
    own: set[str],
    found: dict[str, float],
    bandwidth_bytes_per_s: float,
) -> tuple[Counter, float]:
    """A probe's own ops' bytes in `phases`, and the phases' time less the other ops' (priced at
    the share a probe before measured, else at the stream bandwidth)."""
    mine: Counter = Counter()
    others_s = 0.0
    for phase in phases:
        for op, size in moved[phase].items():
            if op in own:
                mine[op] += size
            else:
                others_s += size / bandwidth_bytes_per_s / found.get(op, 1.0)
    return mine, seconds[phases] - others_s


def op_efficiencies(
    device: torch.device, bandwidth_bytes_per_s: float, overhead_s: float, min_time_s: float = 0.3
) -> dict[str, float]:
    """Share of stream bandwidth each common memory-bound op reaches here, by aten op name.

    Each probe runs forward and backward (its input needs a gradient, as mid-network); its bytes
    and ops come from the tracer, so the efficiency matches how the roofline counts. Where the
    probe's own forward ops and backward ops differ (every probe but `add`, whose `add` and
    `flip` run in both), each op's share comes from the phase it runs in, the forward timed
    apart: max pooling's forward reached 0.05 of the stream bandwidth on the 2-core development
    machine and its backward 0.6–1.0 (LeNet at batch 512: 6.5 and 0.7 ms), which one share for
    both priced at 4.2 and 6.6 ms. An op both phases run takes the whole step's share, and so do
    all of a probe's ops when one phase's time, two medians subtracted, comes to under
    MIN_PHASE_FRACTION of the step's (noise, not a rate). The per-op overhead taken off each
    phase is the training step's average (`training_op_overhead_s`), backward engine and update
    included: a little too much for a forward op, too little for a backward one (a few µs an
    op). The optimizer's elementwise ops are probed apart, by `optimizer_efficiencies`.
    """
    found: dict[str, float] = {}
    batch = PROBE_BATCH.get(device.type, PROBE_BATCH["cpu"])
    whole = ("forward", "backward")
    for kind in PROBES:
        step = trace_step(
            lambda k=kind: probe_module(k),
            torch.zeros(probe_shape(kind)),
            batch,
            "fp32",
            torch.optim.SGD,
            "sgd",
            True,
        )
        rows = [layer for layer in step.layers if layer.name != LOSS]  # timed without a loss
        moved = {
            "forward": sum((layer.forward.bytes_by_op for layer in rows), Counter()),
            "backward": sum((layer.backward.bytes_by_op for layer in rows), Counter()),
        }
        ops = {
            "forward": sum(layer.forward.ops for layer in rows),
            "backward": sum(layer.backward.ops for layer in rows),
        }
        own = set(OWN_OPS.get(kind, set(moved["forward"]) | set(moved["backward"])))
        forward_own, backward_own = (own & set(moved[phase]) for phase in whole)
        model = probe_module(kind)
        x = torch.randn(batch, *probe_shape(kind), device=device, requires_grad=True)
        if forward_own & backward_own:  # an op in both phases: the whole step's share for all
            step_s = _time_training_step(model, x, device, min_time_s)
            seconds = {whole: step_s - (ops["forward"] + ops["backward"]) * overhead_s}
            groups = [whole]
        else:  # each phase's own ops apart
            forward_s, backward_s = _phase_seconds(
                model, x, ops["forward"], ops["backward"], device, overhead_s, min_time_s
            )
            seconds = {("forward",): forward_s, ("backward",): backward_s}
            seconds[whole] = forward_s + backward_s
            groups = [(phase,) for phase in whole if own & set(moved[phase])]
        parts = {
            phases: _own_bytes_and_time(phases, seconds, moved, own, found, bandwidth_bytes_per_s)
            for phases in (whole, *groups)
        }
        if any(parts[phases][1] < MIN_PHASE_FRACTION * parts[whole][1] for phases in groups):
            groups = [whole]
        for phases in groups:
            mine, left_s = parts[phases]
            share = sum(mine.values()) / max(left_s, 1e-9) / bandwidth_bytes_per_s
            for op in mine:
                found[op] = _clamp(share)
    return found


# Adam's update of one square linear layer (width² + width parameters), between the forward and
# backward of a batch of 32, as a training step runs it: its weight's working set (parameter,
# gradient and Adam's two moments, 16 bytes an element) goes from 1 MiB, which the last-level
# cache holds, to 1 GiB, which streams from memory. The 1 GiB point: with freed memory kept (no
# page faults) an update still ran at 1.26× stream bandwidth at 256 MiB on the 2-core
# development machine, and AlexNet's 604 MiB one at 0.79×; a point is skipped where the
# update's memory (OPTIMIZER_MEMORY_FACTOR × its working set) is not free.
OPTIMIZER_WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
OPTIMIZER_MEMORY_FACTOR = 2  # the working set, Adam's two temporaries, the batch: under 2×
OPTIMIZER_STREAMING_WIDTH = 2048  # its share is the optimizer's ops' in `op_efficiency`
OPTIMIZER_BATCH = 32


def optimizer_efficiencies(
    device: torch.device, bandwidth_bytes_per_s: float, overhead_s: float, min_time_s: float = 0.3
) -> dict:
    """Share of stream bandwidth an Adam update reaches inside a training step, by working set.

    `optimizer_efficiency`: [working set bytes, share] points. A CPU trainer's update (torch's
    fused kernel, train/step.py build_optimizer) finishes one tensor before the next, so the
    bytes the caches must hold are one tensor's: a small tensor's update reads its state from
    the cache, faster than the stream bandwidth implies, and a large one streams. On a GPU the
    foreach kernels take all tensors at once, and the working set is the model's.
    `op_efficiency`: the share at the streaming width, for the update's own ops.

    Each update is timed inside a training step, after its forward and backward: an update
    timed alone, over and over, finds its state in the caches more often than training leaves
    it there (on the 2-core development machine, 1.2–1.5× faster at 263k parameters).
    """
    curve, streaming = [], {}
    free = available_memory_bytes(device)
    for width in OPTIMIZER_WIDTHS:
        if OPTIMIZER_MEMORY_FACTOR * 16 * width * width > free:
            continue
        step = trace_step(
            lambda width=width: nn.Linear(width, width),
            torch.zeros(width),
            OPTIMIZER_BATCH,
            "fp32",
            adam,
            "adam",
        )
        if device.type == "cpu":
            cost = step.optimizer
            working_set = max(tensor.working_set_bytes for tensor in step.optimizer_tensors)
        else:
            cost = step.optimizer_foreach
            working_set = step.optimizer_working_set_bytes
        model = nn.Linear(width, width).to(device)
        x = torch.randn(OPTIMIZER_BATCH, width, device=device)
        seconds = update_seconds_in_step(model, x, device, min_time_s) - cost.ops * overhead_s
        del model, x
        moved = sum(cost.bytes_by_op.values())
        efficiency = moved / max(seconds, 1e-9) / bandwidth_bytes_per_s
        curve.append([working_set, _clamp(efficiency, 20.0)])
        if width == OPTIMIZER_STREAMING_WIDTH:
            streaming = dict.fromkeys(cost.bytes_by_op, _clamp(efficiency))
    return {"op_efficiency": streaming, "optimizer_efficiency": curve}


def update_seconds_in_step(
    model: nn.Module, x: torch.Tensor, device: torch.device, min_time_s: float, warmup: int = 3
) -> float:
    """Median seconds of an Adam step as dlscale trains (`adam`) on `model`, each timed after a
    forward and a backward (a sum as the loss), over at least `min_time_s` of updates (and 5 of
    them)."""
    optimizer = adam(model.parameters())
    settle_allocator()
    updates: list[float] = []
    while len(updates) < warmup + 5 or sum(updates[warmup:]) < min_time_s:
        optimizer.zero_grad(set_to_none=True)
        model(x).sum().backward()
        synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        synchronize(device)
        updates.append(time.perf_counter() - start)
    timed = sorted(updates[warmup:])
    return timed[len(timed) // 2]


def _clamp(efficiency: float, most: float = 1.0) -> float:
    return min(most, max(0.01, efficiency))
