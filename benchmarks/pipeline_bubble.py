"""Pipeline bubble, measured against predicted, and schedule throughput against `naive`.

Model: the zoo's `mlp` with four hidden layers of 1024 on 784-value synthetic samples (3.9M
parameters), split into S = 2 stages (`split: auto`), batch 256, SGD, `--steps` steps per run
(default 40; the first epoch, no evaluation in the middle). Each run is `dlscale train` through
the API, one process per stage.

Measured bubble: per stage, 1 − (time in its forward and backward of microbatches) / (time in
the schedule's step), averaged over the stages: the share of a step each stage is idle or
sending. Predicted: (S − 1) / (M + S − 1), the GPipe / 1F1B bubble with equal stages and free
communication (Huang et al., 2019). Throughput: training samples per second over the run.

    .venv/bin/python benchmarks/pipeline_bubble.py [--steps 40] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from dlscale.api import train
from dlscale.jobspec import parse_spec

STAGES = 2
BATCH = 256
HIDDEN = [1024, 1024, 1024, 1024]
RUNS = [("naive", 1), ("gpipe", 2), ("gpipe", 4), ("gpipe", 8), ("1f1b", 4), ("1f1b", 8)]


def make_spec(schedule: str, microbatches: int, steps: int) -> dict:
    return {
        "name": f"bubble-{schedule}-{microbatches}",
        "model": {"name": "mlp", "kwargs": {"hidden": HIDDEN}},
        "data": {
            "name": "synthetic",
            "shape": [784],
            "num_samples": (steps + 8) * BATCH,
            "val_fraction": 0.02,
        },
        "batch_size": BATCH,
        "steps": steps,
        "optimizer": {"name": "sgd", "lr": 0.01},
        "device": "cpu",
        "strategy": {
            "name": "pipeline",
            "stages": STAGES,
            "schedule": schedule,
            "microbatches": microbatches,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1, help="runs per row; medians shown")
    args = parser.parse_args()
    print(f"mlp {HIDDEN} on 784 inputs, {STAGES} stages, batch {BATCH}, {args.steps} steps a run")
    print(
        f"{'schedule':<8} {'M':>3} {'bubble measured':>16} {'predicted':>10} "
        f"{'samples/s':>10} {'vs naive':>9}"
    )
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for schedule, micro in RUNS:
            bubbles, rates = [], []
            for repeat in range(args.repeats):
                out = Path(scratch) / f"{schedule}-{micro}-{repeat}"
                record = train(parse_spec(make_spec(schedule, micro, args.steps)), out_dir=out)
                pipe = record.pipeline
                bubbles.append(pipe["bubble_measured"])
                rates.append(record.final.train_samples_per_s)
            rows[schedule, micro] = (
                statistics.median(bubbles),
                pipe["bubble_predicted"],
                statistics.median(rates),
            )
            bubble, predicted, rate = rows[schedule, micro]
            naive = rows["naive", 1][2]
            print(
                f"{schedule:<8} {micro:>3} {bubble:>16.1%} {predicted:>10.1%} {rate:>10.0f} "
                f"{rate / naive:>8.2f}×"
            )


if __name__ == "__main__":
    main()
