"""Calibrate the per-op cost of training on this machine: dispatch, autograd and optimizer."""

from __future__ import annotations

import time
from collections import Counter

import torch
from torch import nn

from dlscale.profiler.trace import LOSS, trace_step
from dlscale.train.device import synchronize

TINY_WIDTH = 8  # products this small cost nothing; what remains is the per-op overhead
TINY_DEPTH = 16
TINY_BATCH = 4


def seconds_per_call(fn, device: torch.device, min_time_s: float, warmup: int = 3) -> float:
    """Mean seconds of `fn()` over at least `min_time_s` (and 5 calls), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time_s or calls < 5:
        fn()
        calls += 1
    synchronize(device)
    return (time.perf_counter() - start) / calls


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
    trace = trace_step(_tiny_model, sample, TINY_BATCH, "fp32", torch.optim.Adam, "adam")
    ops = sum(layer.forward.ops + layer.backward.ops for layer in trace.layers)
    ops += trace.optimizer.ops
    model = _tiny_model().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(TINY_BATCH, TINY_WIDTH, device=device)
    y = torch.randint(0, TINY_WIDTH, (TINY_BATCH,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()

    return seconds_per_call(step, device, min_time_s, warmup=10) / ops


CONV_CHANNELS = (4, 8, 16, 32, 64, 128)
CONV_SIDE = 32
CONV_BATCH = 8


def _time_training_step(
    model: nn.Module, x: torch.Tensor, device: torch.device, min_time_s: float
) -> float:
    """Seconds of one forward + backward of `model` on `x` (a sum as the loss), median-ish."""
    model = model.to(device)
    x = x.to(device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    return seconds_per_call(step, device, min_time_s)


def _traced(build, sample: torch.Tensor, batch: int, input_requires_grad: bool = False):
    step = trace_step(build, sample, batch, "fp32", torch.optim.SGD, "sgd", input_requires_grad)
    layers = [layer for layer in step.layers if layer.name != LOSS]
    return layers


def conv_rates(
    device: torch.device, overhead_s: float, min_time_s: float = 0.3
) -> dict[str, dict[str, float]]:
    """Achieved FLOP/s of 3×3 convolutions, forward and backward apart, keyed by op FLOPs.

    Convolutions with few channels run far below a matrix product of the same FLOPs (im2col,
    layout changes), so they get curves of their own; the backward op (the gradients of the
    weights, and of the input where it needs one) is timed as a training step minus a forward.
    Rates count the tracer's FLOPs and are keyed by the FLOPs of the op they describe.
    """
    forward_rates, backward_rates = {}, {}
    for channels in CONV_CHANNELS:
        build = lambda c=channels: nn.Conv2d(c, c, 3, padding=1)  # noqa: E731
        sample = torch.zeros(channels, CONV_SIDE, CONV_SIDE)
        (conv,) = _traced(build, sample, CONV_BATCH, input_requires_grad=True)
        model = build().to(device)
        x = torch.randn(CONV_BATCH, channels, CONV_SIDE, CONV_SIDE, device=device)

        def forward(model=model, x=x) -> None:
            with torch.no_grad():
                model(x)

        forward_s = seconds_per_call(forward, device, min_time_s) - conv.forward.ops * overhead_s
        step_s = _time_training_step(model, x.requires_grad_(), device, min_time_s)
        backward_s = step_s - forward_s - (conv.forward.ops + conv.backward.ops) * overhead_s
        forward_rates[str(conv.forward.matmul_flops)] = conv.forward.matmul_flops / max(
            forward_s, 1e-9
        )
        backward_rates[str(conv.backward.matmul_flops)] = conv.backward.matmul_flops / max(
            backward_s, 1e-9
        )
    return {"forward": forward_rates, "backward": backward_rates}


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
        return self.batch_norm(x)


PROBES = ("relu", "gelu", "max_pool", "softmax", "add", "layer_norm", "batch_norm")
PROBE_SHAPE = (16, 64, 64)  # one sample: 256 KiB; batch 8 makes 2 MiB tensors
PROBE_BATCH = 8


def op_efficiencies(
    device: torch.device, bandwidth_bytes_per_s: float, overhead_s: float, min_time_s: float = 0.3
) -> dict[str, float]:
    """Share of stream bandwidth each common memory-bound op reaches here, by aten op name.

    Each probe runs forward and backward (its input needs a gradient, as mid-network); its bytes
    and ops come from the tracer, so the efficiency matches how the roofline counts. The
    optimizer's elementwise ops are probed with a real Adam step over 4M parameters.
    """
    found: dict[str, float] = {}
    channels = PROBE_SHAPE[-1]
    for kind in PROBES:
        step = trace_step(
            lambda k=kind: _Probe(k, channels if k == "layer_norm" else PROBE_SHAPE[0]),
            torch.zeros(PROBE_SHAPE), PROBE_BATCH, "fp32", torch.optim.SGD, "sgd", True,
        )  # fmt: skip
        rows = [layer for layer in step.layers if layer.name != LOSS]  # timed without a loss
        costs = [layer.forward for layer in rows] + [layer.backward for layer in rows]
        by_op = sum((cost.bytes_by_op for cost in costs), Counter())
        ops = sum(cost.ops for cost in costs)
        model = _Probe(kind, channels if kind == "layer_norm" else PROBE_SHAPE[0])
        x = torch.randn(PROBE_BATCH, *PROBE_SHAPE, requires_grad=True)
        seconds = _time_training_step(model, x, device, min_time_s) - ops * overhead_s
        efficiency = sum(by_op.values()) / max(seconds, 1e-9) / bandwidth_bytes_per_s
        for op in by_op:
            found[op] = _clamp(efficiency)
    found.update(_optimizer_efficiencies(device, bandwidth_bytes_per_s, overhead_s, min_time_s))
    return found


def _optimizer_efficiencies(device, bandwidth_bytes_per_s, overhead_s, min_time_s) -> dict:
    size = 1 << 22
    step = trace_step(
        lambda: nn.Linear(size, 1, bias=False), torch.zeros(size), 1, "fp32",
        torch.optim.Adam, "adam",
    )  # fmt: skip
    cost = step.optimizer if device.type == "cpu" else step.optimizer_foreach
    weight = nn.Parameter(torch.randn(size, device=device))
    weight.grad = torch.randn(size, device=device)
    optimizer = torch.optim.Adam([weight])
    seconds = seconds_per_call(optimizer.step, device, min_time_s) - cost.ops * overhead_s
    efficiency = _clamp(sum(cost.bytes_by_op.values()) / max(seconds, 1e-9) / bandwidth_bytes_per_s)
    return dict.fromkeys(cost.bytes_by_op, efficiency)


def _clamp(efficiency: float) -> float:
    return min(1.0, max(0.01, efficiency))
