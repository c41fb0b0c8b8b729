"""`bench width`: an MLP's training-step time as its hidden width doubles, against cache and RAM.

While a model's weights, gradients and Adam state fit in the last-level cache, a step reads them
from the cache; past it, every step streams them from memory, and the time per parameter rises.
Small widths show the opposite cost: fixed per-op overhead spread over few parameters.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dlscale.bench.machine import bench_device, last_level_cache_bytes
from dlscale.bench.matmul import median_time_s
from dlscale.bench.memory import over_share
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.jobspec import OptimizerSpec
from dlscale.models import build_model, count_parameters
from dlscale.train.step import TrainStep, build_optimizer

SCHEMA = "dlscale.bench.width/1"
DEFAULT_WIDTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
INPUT_SIZE = 784  # MNIST-shaped inputs
NUM_CLASSES = 10
# Training state per parameter in fp32 with Adam: weight, gradient, and the two moment estimates.
STATE_BYTES_PER_PARAMETER = 4 + 4 + 4 + 4
FLOAT_BYTES = 4


def linear_shapes(width: int, input_size: int = INPUT_SIZE) -> list[tuple[int, int]]:
    """(in, out) features of each Linear in mlp(hidden=[width, width])."""
    return [(input_size, width), (width, width), (width, NUM_CLASSES)]


def parameter_count(width: int, input_size: int = INPUT_SIZE) -> int:
    """Weights plus biases of every Linear."""
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in linear_shapes(width, input_size))


def step_matmul_flops(width: int, batch_size: int, input_size: int = INPUT_SIZE) -> int:
    """Matrix-product FLOPs of one training step, counted as torch's FlopCounterMode counts them.

    A Linear (in → out) on B samples costs 2·B·in·out forward; backward costs as much again for
    the weight gradient and again for the input gradient (the 2N + 4N of Kaplan et al., 2020),
    except in the first layer, whose input needs no gradient. Biases, ReLU and Adam are not
    products and are left out.
    """
    total = 0
    for index, (fan_in, fan_out) in enumerate(linear_shapes(width, input_size)):
        products = 3 if index > 0 else 2  # forward, weight gradient, input gradient
        total += products * 2 * batch_size * fan_in * fan_out
    return total


def memory_estimate_bytes(width: int, batch_size: int, input_size: int = INPUT_SIZE) -> int:
    """Training state plus activations: each layer's output, its ReLU copy and their gradients."""
    activations = batch_size * (input_size + 4 * width + NUM_CLASSES)
    return (
        STATE_BYTES_PER_PARAMETER * parameter_count(width, input_size)
        + 2 * FLOAT_BYTES * activations
    )


def time_train_step_s(
    width: int,
    batch_size: int,
    device: torch.device,
    min_run_time_s: float,
    input_size: int = INPUT_SIZE,
) -> float:
    """Median seconds of one forward + backward + Adam step of the zoo's MLP, fp32."""
    torch.manual_seed(0)
    model = build_model(
        "mlp", {"input_size": input_size, "hidden": [width, width], "num_classes": NUM_CLASSES}
    )
    assert count_parameters(model) == parameter_count(width, input_size)
    model.to(device)
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="adam"))
    step = TrainStep(model, optimizer, device, "fp32")
    x = torch.randn(batch_size, input_size, device=device)  # (B, input_size)
    y = torch.randint(NUM_CLASSES, (batch_size,), device=device)  # (B,)
    return median_time_s("step(x, y)", {"step": step, "x": x, "y": y}, min_run_time_s)


def first_width(rows: list[dict], key: str, limit: int | None) -> int | None:
    """The smallest width whose `key` bytes exceed `limit`."""
    if not limit:
        return None
    return next((row["width"] for row in rows if row[key] > limit), None)


def width_row(
    width: int, batch_size: int, device: torch.device, free_bytes: int, min_run_time_s: float
) -> dict:
    """One width: sizes in bytes, and the measured step unless it would not fit in memory."""
    params = parameter_count(width)
    flops = step_matmul_flops(width, batch_size)
    row = {
        "width": width,
        "parameters": params,
        "state_bytes": STATE_BYTES_PER_PARAMETER * params,
        "weight_matrix_bytes": FLOAT_BYTES * width * width,
        "memory_estimate_bytes": memory_estimate_bytes(width, batch_size),
        "flops": flops,
        "step_time_s": None,
        "time_per_parameter_s": None,
        "flops_per_s": None,
        "skipped": None,
    }
    row["skipped"] = over_share(row["memory_estimate_bytes"], free_bytes)
    if row["skipped"]:
        return row
    step_s = time_train_step_s(width, batch_size, device, min_run_time_s)
    row.update(step_time_s=step_s, time_per_parameter_s=step_s / params, flops_per_s=flops / step_s)
    return row


def run_width_bench(
    widths: Iterable[int] | None = None,
    batch_size: int = 64,
    device: str = "auto",
    min_run_time_s: float = 0.3,
) -> dict:
    """Step time, time per parameter and FLOP/s per width; where state leaves cache and RAM."""
    widths = sorted(set(widths or DEFAULT_WIDTHS))
    if not widths or widths[0] < 1:
        raise UserError("widths must be positive integers")
    if batch_size < 1:
        raise UserError(f"batch size must be a positive integer (got {batch_size})")
    dev = bench_device(device)
    cache_bytes = last_level_cache_bytes(dev)
    free_bytes = available_memory_bytes(dev)
    # Refused before anything is timed: a table of skipped rows and an empty plot say nothing.
    smallest = widths[0]
    reason = over_share(memory_estimate_bytes(smallest, batch_size), free_bytes)
    if reason:
        raise UserError(
            f"--widths: no width fits in memory: w = {smallest} at batch {batch_size} {reason}"
        )
    rows = [width_row(w, batch_size, dev, free_bytes, min_run_time_s) for w in widths]
    return {
        "schema": SCHEMA,
        "device": str(dev),
        "batch_size": batch_size,
        "input_size": INPUT_SIZE,
        "threads": torch.get_num_threads(),
        "last_level_cache_bytes": cache_bytes,
        "free_memory_bytes": free_bytes,
        "state_exceeds_cache_from_width": first_width(rows, "state_bytes", cache_bytes),
        "weight_matrix_exceeds_cache_from_width": first_width(
            rows, "weight_matrix_bytes", cache_bytes
        ),
        "rows": rows,
    }
