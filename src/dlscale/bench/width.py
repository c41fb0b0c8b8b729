"""`bench width`: an MLP's training-step time as its hidden width grows, against each cache and RAM.

While a model's weights, gradients, Adam state and activations (its working set) fit in a cache,
a step reads them from there; past the last one, every step streams them from memory, and past
the memory it may use (the memory wall), from swap on disk. Small widths show the opposite cost:
fixed per-op overhead spread over few parameters. Each width also gets the lecture's estimate of
what 1,000 epochs would take at that step time. This module holds the arithmetic, the timing and
the in-process run; width_wall.py runs each width in a memory-limited cgroup instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch

from dlscale.bench.io_verdict import relative_spread
from dlscale.bench.machine import bench_device, data_caches, last_level_cache_bytes
from dlscale.bench.memory import over_share
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.jobspec import OptimizerSpec
from dlscale.models import build_model, count_parameters
from dlscale.train.device import synchronize
from dlscale.train.step import TrainStep, build_optimizer
from dlscale.train.threads import check_threads, intra_op_threads

SCHEMA = "dlscale.bench.width/1"
DEFAULT_WIDTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
INPUT_SIZE = 784  # MNIST-shaped inputs
NUM_CLASSES = 10
# Training state per parameter in fp32 with Adam: weight, gradient, and the two moment estimates.
STATE_BYTES_PER_PARAMETER = 4 + 4 + 4 + 4
FLOAT_BYTES = 4
# The inputs are MNIST-shaped, so the epoch is MNIST's: "a training set of 60,000 examples"
# (LeCun, Cortes, Burges, The MNIST database of handwritten digits, http://yann.lecun.com/exdb/mnist/,
# as mirrored at https://zoo.cs.yale.edu/classes/cs470/aima/aima-data/MNIST/Digits/mnist.txt,
# read 2026-11-27). --dataset-size sets another.
DEFAULT_DATASET_SIZE = 60_000
EPOCHS = 1000  # the lecture's "1,000 epochs would take"
WARMUP_STEPS = 2  # the first step makes Adam's state; the second runs as every later one does
MIN_TIMED_STEPS = 3


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
) -> tuple[float, float]:
    """Median seconds of one forward + backward + Adam step of the zoo's MLP, fp32, and the
    steps' spread (90th over 10th percentile, less 1): at least MIN_TIMED_STEPS steps, and
    `min_run_time_s` of them, after warm-up. Each step is timed on its own, so a width whose
    steps take seconds (in swap) is timed in a few steps, not a fixed count."""
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
    for _ in range(WARMUP_STEPS):
        step(x, y)
    synchronize(device)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MIN_TIMED_STEPS or time.perf_counter() - started < min_run_time_s:
        begin = time.perf_counter()
        step(x, y)
        synchronize(device)
        times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2], relative_spread(times)


def thousand_epochs_s(step_time_s: float, dataset_size: int, batch_size: int) -> float:
    """The lecture's "1,000 epochs would take": the step time × the steps of one epoch (the last
    batch may be partial, and is a step all the same) × 1,000."""
    return step_time_s * math.ceil(dataset_size / batch_size) * EPOCHS


def memory_levels(device: torch.device, ram_bytes: int | None) -> list[tuple[str, int]]:
    """Where a working set can live, smallest first: each data cache (a GPU: its L2), then RAM
    (`ram_bytes`: the memory this bench may use)."""
    if device.type == "cuda":
        l2 = last_level_cache_bytes(device)
        caches = [("L2", l2)] if l2 else []
    else:
        caches = data_caches()
    ram = [("RAM", ram_bytes)] if ram_bytes else []
    return sorted([*caches, *ram], key=lambda level: level[1])


def level_of(working_set_bytes: int, levels: list[tuple[str, int]], beyond: str) -> str:
    """The smallest level the working set fits in, or `beyond` (past them all)."""
    return next((name for name, size in levels if working_set_bytes <= size), beyond)


def crossings(rows: list[dict], levels: list[tuple[str, int]]) -> dict[str, int | None]:
    """Level -> the first width whose working set is larger than it (None: no width is)."""
    return {name: first_width(rows, "memory_estimate_bytes", size) for name, size in levels}


def first_width(rows: list[dict], key: str, limit: int | None) -> int | None:
    """The smallest width whose `key` bytes exceed `limit`."""
    if not limit:
        return None
    return next((row["width"] for row in rows if row[key] > limit), None)


def width_row(width: int, batch_size: int) -> dict:
    """One width's sizes in bytes and FLOPs, before anything is timed."""
    params = parameter_count(width)
    return {
        "width": width,
        "parameters": params,
        "state_bytes": STATE_BYTES_PER_PARAMETER * params,
        "weight_matrix_bytes": FLOAT_BYTES * width * width,
        "memory_estimate_bytes": memory_estimate_bytes(width, batch_size),
        "flops": step_matmul_flops(width, batch_size),
        "step_time_s": None,
        "step_spread": None,
        "time_per_parameter_s": None,
        "flops_per_s": None,
        "thousand_epochs_s": None,
        "skipped": None,
    }


def with_step_time(row: dict, step_s: float, spread: float, dataset_size: int, batch: int) -> dict:
    """The row with its measured step and what follows from it."""
    row.update(
        step_time_s=step_s,
        step_spread=spread,
        time_per_parameter_s=step_s / row["parameters"],
        flops_per_s=row["flops"] / step_s,
        thousand_epochs_s=thousand_epochs_s(step_s, dataset_size, batch),
    )
    return row


def check_options(
    widths: list[int], batch_size: int, dataset_size: int, threads: int | None
) -> None:
    if not widths or widths[0] < 1:
        raise UserError("widths must be positive integers")
    if batch_size < 1:
        raise UserError(f"batch size must be a positive integer (got {batch_size})")
    if dataset_size < 1:
        raise UserError(f"--dataset-size: must be a positive integer (got {dataset_size})")
    check_threads(threads)


def summary(rows: list[dict], levels: list[tuple[str, int]], beyond: str) -> dict:
    """Each row's level, and the widths where the working set crosses each level."""
    for row in rows:
        row["level"] = level_of(row["memory_estimate_bytes"], levels, beyond)
    return {
        "levels": [{"name": name, "bytes": size} for name, size in levels],
        "working_set_exceeds_from_width": crossings(rows, levels),
    }


def run_width_bench(
    widths: Iterable[int] | None = None,
    batch_size: int = 64,
    device: str = "auto",
    min_run_time_s: float = 0.3,
    dataset_size: int = DEFAULT_DATASET_SIZE,
    threads: int | None = None,
) -> dict:
    """Step time, time per parameter, FLOP/s and 1,000 epochs per width, in this process
    with `threads` intra-op threads (None: torch's default); where the working set leaves each
    cache. Widths over half the free memory are skipped."""
    widths = sorted(set(widths or DEFAULT_WIDTHS))
    check_options(widths, batch_size, dataset_size, threads)
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
    rows = []
    with intra_op_threads(threads):
        used_threads = torch.get_num_threads()
        for width in widths:
            row = width_row(width, batch_size)
            row["skipped"] = over_share(row["memory_estimate_bytes"], free_bytes)
            if not row["skipped"]:
                step_s, spread = time_train_step_s(width, batch_size, dev, min_run_time_s)
                with_step_time(row, step_s, spread, dataset_size, batch_size)
            rows.append(row)
    return {
        **header(dev, batch_size, dataset_size, cache_bytes, rows, used_threads),
        "free_memory_bytes": free_bytes,
        "memory_limit_bytes": None,
        **summary(rows, memory_levels(dev, free_bytes), "over RAM"),
        "rows": rows,
    }


def header(
    dev: torch.device, batch: int, dataset_size: int, cache: int | None, rows, threads: int
) -> dict:
    """What every width bench records beside its rows."""
    return {
        "schema": SCHEMA,
        "device": str(dev),
        "batch_size": batch,
        "input_size": INPUT_SIZE,
        "threads": threads,
        "dataset_size": dataset_size,
        "epochs": EPOCHS,
        "last_level_cache_bytes": cache,
        "state_exceeds_cache_from_width": first_width(rows, "state_bytes", cache),
        "weight_matrix_exceeds_cache_from_width": first_width(rows, "weight_matrix_bytes", cache),
    }
