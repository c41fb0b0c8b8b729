"""Roofline prediction against measured training steps on this machine's GPU.

For each workload and precision (fp32, bf16): one process trains on synthetic data of the
workload's shape on `cuda` (the one loop, the spec's default optimizer), the median of `--steps`
timed steps after 5 warm-up steps is the measured step; the profiler's prediction for the
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
from pathlib import Path

import torch

from dlscale import profiler
from dlscale.bench.batch import synthetic_spec
from dlscale.hardware import get_hardware
from dlscale.profiler.estimate import measure_steps
from dlscale.profiler.target import resolve
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


def measured_step_s(spec, steps: int) -> float:
    """Median seconds of `steps` timed training steps of `spec` after 5 warm-up steps."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec, Path(scratch))
        times = sorted(measure_steps(trainer, warmup=5, steps=steps))
        del trainer
    torch.cuda.empty_cache()
    return times[len(times) // 2]


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
    heads = "".join(f" {h.name[:12]:>12} {'ratio':>6}" for h in entries)
    print(f"{'workload':<28} {'precision':<9} {'measured':>10}{heads}")
    for model, kwargs, shape, tokens, batch in WORKLOADS:
        for precision in PRECISIONS:
            spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 30, "cuda")
            spec = spec.model_copy(update={"precision": precision})
            measured = measured_step_s(spec, args.steps) if gpu else None
            optimizer = spec.optimizer.name
            workload = resolve(model, batch, shape, precision, optimizer, tokens, kwargs)
            reports = profiler.profile(workload, entries).reports
            cells = "".join(
                f" {r.prediction.step_s * 1e3:>10.2f}ms "
                + (f"{r.prediction.step_s / measured:>6.2f}" if measured else f"{'-':>6}")
                for r in reports
            )
            label = f"{model} batch {batch}"
            shown = f"{measured * 1e3:>8.2f}ms" if measured else f"{'-':>10}"
            print(f"{label:<28} {precision:<9} {shown}{cells}", flush=True)


if __name__ == "__main__":
    main()
