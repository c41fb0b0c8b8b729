"""Roofline prediction against measured training steps on this machine's GPU.

For each workload and precision: one process trains on synthetic data of the workload's shape
on `cuda` (the one loop, the spec's default optimizer), the median of `--steps` timed
steps after 5 warm-up steps is the measured step; the profiler's prediction for the catalogue
entry `--hardware` (default: h200-sxm; several, comma-separated, each get a column: `local` is
what `dlscale bench machine --device cuda` saved) at the same batch and precision is beside it.

    python benchmarks/gpu_predict.py [--hardware h200-sxm[,local]] [--steps 20]
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

# (model, kwargs, one sample's shape, token input?, batch)
WORKLOADS = [  # ~2 min on one H200
    ("resnet50", {"num_classes": 1000}, [3, 224, 224], False, 64),
    ("gpt", {"n_layer": 12, "d_model": 768, "n_head": 12, "context_length": 1024}, [1024], True, 8),
    ("alexnet_2gpu", {"num_classes": 1000}, [3, 224, 224], False, 128),
    ("mlp", {"hidden": [4096, 4096]}, [784], False, 512),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_predict: no CUDA GPU is visible here; nothing was measured")
    entries = [get_hardware(name) for name in args.hardware.split(",")]
    print(f"measured on {torch.cuda.get_device_name(0)}")
    heads = "".join(f" {h.name[:12]:>12} {'ratio':>6}" for h in entries)
    print(f"{'workload':<28} {'precision':<9} {'measured':>10}{heads}")
    for model, kwargs, shape, tokens, batch in WORKLOADS:
        for precision in ("fp32", "bf16"):
            spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 30, "cuda")
            spec = spec.model_copy(update={"precision": precision})
            with tempfile.TemporaryDirectory() as scratch:
                trainer = Trainer(spec, Path(scratch))
                times = sorted(measure_steps(trainer, warmup=5, steps=args.steps))
                del trainer
            torch.cuda.empty_cache()
            measured = times[len(times) // 2]
            workload = resolve(model, batch, shape, precision, spec.optimizer.name, tokens, kwargs)
            reports = profiler.profile(workload, entries).reports
            cells = "".join(
                f" {r.prediction.step_s * 1e3:>10.2f}ms {r.prediction.step_s / measured:>6.2f}"
                for r in reports
            )
            label = f"{model} batch {batch}"
            print(f"{label:<28} {precision:<9} {measured * 1e3:>8.2f}ms{cells}", flush=True)


if __name__ == "__main__":
    main()
