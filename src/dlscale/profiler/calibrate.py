"""Calibrate the per-op cost of training on this machine: dispatch, autograd and optimizer."""

from __future__ import annotations

import time

import torch
from torch import nn

from dlscale.profiler.trace import trace_step
from dlscale.train.device import synchronize

TINY_WIDTH = 8  # products this small cost nothing; what remains is the per-op overhead
TINY_DEPTH = 16
TINY_BATCH = 4


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

    for _ in range(10):
        step()
    synchronize(device)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time_s or steps < 20:
        step()
        steps += 1
    synchronize(device)
    return (time.perf_counter() - start) / steps / ops
