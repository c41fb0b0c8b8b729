"""Roofline prediction vs measured training step time on this machine (`local`), per workload.

One run: measure the machine (`bench machine`: matmul FLOP/s, memory bandwidth, per-op overhead),
then for mlp, lenet, resnet18 and gpt at two batch sizes each, time real training steps on
synthetic data of the same shape and print predicted / measured. Goal: every ratio in 0.7–1.3.

    .venv/bin/python benchmarks/predict_accuracy.py [--quick-machine] [--steps 10]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dlscale import profiler
from dlscale.bench.batch import synthetic_spec
from dlscale.bench.machine import machine_hardware, run_machine_bench
from dlscale.profiler.estimate import measure_steps
from dlscale.profiler.target import resolve
from dlscale.train.loop import Trainer

GOAL = (0.7, 1.3)
# (model, kwargs, one sample's shape, token input?, two batch sizes)
WORKLOADS = [
    ("mlp", {"hidden": [512, 256]}, [784], False, (32, 256)),
    ("lenet", {}, [1, 28, 28], False, (32, 256)),
    ("resnet18", {"num_classes": 10}, [3, 64, 64], False, (8, 32)),
    ("gpt", {}, [64], True, (8, 32)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick-machine", action="store_true", help="quick machine bench")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per workload")
    args = parser.parse_args()

    local = machine_hardware(run_machine_bench(quick=args.quick_machine))
    print(
        f"local: fp32 {local.peak_flops['fp32'] / 1e9:,.1f} GFLOP/s, "
        f"{local.memory_bandwidth_bytes_per_s / 1e9:,.1f} GB/s, "
        f"op overhead {local.overhead_per_op_s * 1e6:.1f} µs"
    )
    print(f"{'workload':<22} {'measured':>10} {'predicted':>10} {'ratio':>7}")
    ratios = []
    for model, kwargs, shape, tokens, batches in WORKLOADS:
        for batch in batches:
            spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 40, "cpu")
            with tempfile.TemporaryDirectory() as scratch:
                trainer = Trainer(spec, Path(scratch))
                times = sorted(measure_steps(trainer, warmup=3, steps=args.steps))
            measured = times[len(times) // 2]
            workload = resolve(model, batch, shape, "fp32", "adam", tokens, kwargs)
            predicted = profiler.profile(workload, [local]).reports[0].prediction.step_s
            ratio = predicted / measured
            ratios.append(ratio)
            label = f"{model} batch {batch}"
            print(f"{label:<22} {measured * 1e3:>8.2f}ms {predicted * 1e3:>8.2f}ms {ratio:>7.2f}")
    inside = sum(GOAL[0] <= r <= GOAL[1] for r in ratios)
    spread = f"ratios {min(ratios):.2f}–{max(ratios):.2f}"
    print(f"{inside}/{len(ratios)} predictions within ±30% ({spread})")


if __name__ == "__main__":
    main()
