"""Roofline prediction vs measured training step time on this machine (`local`), per workload.

A round: measure the machine (`bench machine`: matmul FLOP/s, memory bandwidth, per-op overhead,
convolution and attention rates), then for mlp, lenet, resnet18 and gpt at two batch sizes each,
time real training steps on synthetic data of the same shape and take predicted / measured.
Rounds repeat the whole (calibration and measurement side by side each time), since this shared
machine's speed drifts by tens of percent within minutes; each workload's figure is its median
ratio over the rounds, printed beside every round's, and the spread of its measured step across
rounds (max / min), which shows how far the machine moved under the same workload. Goal: every
median ratio in 0.7–1.3.

    .venv/bin/python benchmarks/predict_accuracy.py [--rounds 3] [--quick-machine] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
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


def measure_round(args) -> list[tuple[str, float, float]]:
    """One round: measure the machine, then each workload: (label, measured s, predicted s)."""
    local = machine_hardware(run_machine_bench(quick=args.quick_machine))
    print(
        f"local: fp32 {local.peak_flops['fp32'] / 1e9:,.1f} GFLOP/s, "
        f"{local.memory_bandwidth_bytes_per_s / 1e9:,.1f} GB/s, "
        f"op overhead {local.overhead_per_op_s * 1e6:.1f} µs"
    )
    print(f"  {'workload':<20} {'measured':>10} {'predicted':>10} {'ratio':>6}")
    found = []
    for model, kwargs, shape, tokens, batches in WORKLOADS:
        for batch in batches:
            spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 40, "cpu")
            with tempfile.TemporaryDirectory() as scratch:
                trainer = Trainer(spec, Path(scratch))
                times = sorted(measure_steps(trainer, warmup=3, steps=args.steps))
            measured = times[len(times) // 2]
            workload = resolve(model, batch, shape, "fp32", "adam", tokens, kwargs)
            predicted = profiler.profile(workload, [local]).reports[0].prediction.step_s
            label = f"{model} batch {batch}"
            print(
                f"  {label:<20} {measured * 1e3:>8.2f}ms {predicted * 1e3:>8.2f}ms "
                f"{predicted / measured:>6.2f}"
            )
            found.append((label, measured, predicted))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick-machine", action="store_true", help="quick machine bench")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per workload")
    parser.add_argument("--rounds", type=int, default=3, help="machine bench + workloads, repeated")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")

    rounds = []
    for number in range(1, args.rounds + 1):
        print(f"round {number}")
        rounds.append(measure_round(args))
    print(
        f"\n{'workload':<20} {'median measured':>16} {'measured max/min':>17} "
        f"{'median predicted':>17} {'median ratio':>13}  ratios by round"
    )
    medians = []
    for index, (label, _, _) in enumerate(rounds[0]):
        rows = [found[index] for found in rounds]
        ratios = [predicted / measured for _, measured, predicted in rows]
        ratio = statistics.median(ratios)
        medians.append(ratio)
        steps = [measured for _, measured, _ in rows]
        spread = max(steps) / min(steps)  # the same step, minutes apart: the machine's drift
        predicted = statistics.median(predicted for _, _, predicted in rows)
        by_round = " ".join(f"{r:.2f}" for r in ratios)
        print(
            f"{label:<20} {statistics.median(steps) * 1e3:>14.2f}ms {spread:>17.2f} "
            f"{predicted * 1e3:>15.2f}ms {ratio:>13.2f}  {by_round}"
        )
    inside = sum(GOAL[0] <= r <= GOAL[1] for r in medians)
    every = [predicted / measured for found in rounds for _, measured, predicted in found]
    print(
        f"{inside}/{len(medians)} median ratios within ±30% "
        f"(medians {min(medians):.2f}–{max(medians):.2f}; single rounds {min(every):.2f}–"
        f"{max(every):.2f}, {sum(GOAL[0] <= r <= GOAL[1] for r in every)}/{len(every)} within)"
    )


if __name__ == "__main__":
    main()
