"""Roofline prediction against measured training steps on this machine's GPU.

For each workload and precision (fp32, bf16): one process trains on synthetic data of the
workload's shape on `cuda` (the one loop, the spec's default optimizer), the median of `--steps`
timed steps after 5 warm-up steps is the measured step; beside it the same step on one batch kept
on the GPU ('device'), and the host loader's batch and its host→device copy timed alone (the
synthetic data is gathered on the host by a loader with no workers, into pinned memory on CUDA
by default, so both sit on the step's critical path); the profiler's prediction for the
catalogue entry `--hardware` at the same batch and precision is beside it (several,
comma-separated, each get a column: `local` is what `dlscale bench machine --device cuda` saved).
Without `--hardware`, the catalogue entry whose name the GPU's own name matches (an "NVIDIA H100
80GB HBM3" is h100-sxm). `--dry-run` predicts every row without a GPU and measures nothing: the
CPU-side half, to check before a GPU is lent.

    python benchmarks/gpu_predict.py [--hardware h100-sxm[,local]] [--steps 20] [--dry-run]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dlscale import profiler
from dlscale.bench.batch import synthetic_spec
from dlscale.hardware import get_hardware
from dlscale.profiler.estimate import measure_steps
from dlscale.profiler.target import resolve
from dlscale.train.device import synchronize
from dlscale.train.loop import Trainer

# The catalogue entry for a GPU, by the first of these found in its name (torch's device name).
CATALOGUE_BY_GPU_NAME = (
    ("H200", "h200-sxm"),
    ("H100", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100", "a100-40gb"),
    ("V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("V100", "v100-sxm2-16gb"),
    ("L4", "l4"),
    ("MI300X", "mi300x"),
)
PRECISIONS = ("fp32", "bf16")
# (model, kwargs, one sample's shape, token input?, batch)
WORKLOADS = [  # ~2 min on one H200
    ("resnet50", {"num_classes": 1000}, [3, 224, 224], False, 64),
    ("gpt", {"n_layer": 12, "d_model": 768, "n_head": 12, "context_length": 1024}, [1024], True, 8),
    ("alexnet_2gpu", {"num_classes": 1000}, [3, 224, 224], False, 128),
    ("mlp", {"hidden": [4096, 4096]}, [784], False, 512),
]


def catalogue_name(gpu_name: str) -> str | None:
    """The catalogue entry a GPU's name matches, or None."""
    for marker, name in CATALOGUE_BY_GPU_NAME:
        if marker.lower() in gpu_name.lower():
            return name
    return None


@dataclass
class Measured:
    """One workload's step on the GPU, median seconds: as the loop runs it, and its parts."""

    step_s: float  # loader, host→device copy and the step, as the loop runs them
    resident_s: float  # the step alone, its batch already on the GPU
    loader_s: float  # the host loader's batch (workers 0: on the step's critical path)
    copy_s: float  # the batch's host→device copy (pinned unless the spec says not)


def _median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def measure(spec, steps: int) -> Measured:
    """`steps` timed training steps of `spec` after 5 warm-up steps, three ways: as the loop
    runs them, the same step on one batch kept on the GPU, and the loader and copy alone."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec, Path(scratch))
        step_s = _median(measure_steps(trainer, warmup=5, steps=steps))
        loader, copies, resident = [], [], []
        batches = iter(trainer.train_loader)
        for _ in range(steps):
            start = time.perf_counter()
            x, y, *_ = next(batches)
            loaded = time.perf_counter()
            x, y = x.to(trainer.device), y.to(trainer.device)
            synchronize(trainer.device)
            loader.append(loaded - start)
            copies.append(time.perf_counter() - loaded)
        for i in range(5 + steps):
            start = time.perf_counter()
            float(trainer.step_fn(x, y))  # reading the loss waits for the device
            synchronize(trainer.device)
            if i >= 5:
                resident.append(time.perf_counter() - start)
        del trainer, x, y
    torch.cuda.empty_cache()
    return Measured(step_s, _median(resident), _median(loader), _median(copies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="predict only; no GPU needed")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.dry_run
    if not gpu and not args.dry_run:
        raise SystemExit("gpu_predict: no CUDA GPU is visible here; nothing was measured")
    names = args.hardware
    if names is None:
        device_name = torch.cuda.get_device_name(0) if gpu else ""
        names = catalogue_name(device_name) or "h200-sxm"
        if gpu and catalogue_name(device_name) is None:
            print(f"no catalogue entry matches {device_name!r}: comparing with h200-sxm")
    entries = [get_hardware(name) for name in names.split(",")]
    print(f"measured on {torch.cuda.get_device_name(0)}" if gpu else "dry run: nothing measured")
    print(
        "ratio = predicted / measured; 'step' is the loop's step (loader, copy, step), 'device' "
        "the step on a batch already on the GPU against the prediction less its host→device copy"
    )
    heads = "".join(f" {h.name[:12]:>12} {'step':>5} {'device':>6}" for h in entries)
    print(
        f"{'workload':<26} {'prec':<4} {'step':>9} {'device':>9} {'loader':>8} {'copy':>8}{heads}"
    )
    for model, kwargs, shape, tokens, batch in WORKLOADS:
        for precision in PRECISIONS:
            spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 30, "cuda")
            spec = spec.model_copy(update={"precision": precision})
            got = measure(spec, args.steps) if gpu else None
            optimizer = spec.optimizer.name
            workload = resolve(model, batch, shape, precision, optimizer, tokens, kwargs)
            reports = profiler.profile(workload, entries).reports
            cells = ""
            for r in reports:
                p = r.prediction
                device_s = p.step_s - p.h2d_s
                ratios = (
                    f"{p.step_s / got.step_s:>5.2f} {device_s / got.resident_s:>6.2f}"
                    if got
                    else f"{'-':>5} {'-':>6}"
                )
                cells += f" {p.step_s * 1e3:>10.2f}ms {ratios}"
            parts = (got.step_s, got.resident_s, got.loader_s, got.copy_s) if got else (None,) * 4
            shown = "".join(
                f" {v * 1e3:>7.2f}ms" if v is not None else f" {'-':>9}" for v in parts[:2]
            ) + "".join(f" {v * 1e3:>6.2f}ms" if v is not None else f" {'-':>8}" for v in parts[2:])
            label = f"{model} batch {batch}"
            print(f"{label:<26} {precision:<4}{shown}{cells}", flush=True)


if __name__ == "__main__":
    main()
