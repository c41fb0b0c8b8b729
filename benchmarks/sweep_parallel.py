"""Sweep throughput: the same 8-trial grid with `--parallel 2` against `--parallel 1`.

Two workloads, each a grid of 8 configurations (8 trials, held-out validation, one run per
trial), trained through `dlscale.api.sweep` on local processes:
  mlp    the zoo's MLP on the 8×8 digits, 10 epochs; 4 learning rates × hidden 32 or 128
  lenet  LeNet-5 on the digits at 28×28, 4 epochs; 4 learning rates × batch 32 or 64
Each trial trains for 2 seconds or so; starting its process (spawn, importing torch, reading the
data) costs about as much again, and is part of what parallel trials overlap.
With --parallel 1 the one trial in flight gets both cores (2 threads); with --parallel 2 each
trial is pinned to one core. Printed per workload: wall time of each sweep, trials per minute,
and the ratio (parallel 2 over parallel 1) of trial throughput, which is the ratio of wall times.
The runs alternate (1, 2, 1, 2, ...) over --rounds rounds; medians are printed.

    .venv/bin/python benchmarks/sweep_parallel.py [--rounds 1] [--workloads mlp,lenet]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from dlscale.api import sweep

WORKLOADS = {
    "mlp": {
        "model": {"name": "mlp", "kwargs": {"hidden": 64}},
        "data": {"name": "digits"},
        "epochs": 10,
        "grid": {"optimizer.lr": [0.01, 0.03, 0.1, 0.3], "model.kwargs.hidden": [32, 128]},
    },
    "lenet": {
        "model": {"name": "lenet"},
        "data": {"name": "digits", "image_size": 28},
        "epochs": 4,
        "grid": {"optimizer.lr": [0.01, 0.03, 0.1, 0.3], "batch_size": [32, 64]},
    },
}


def write_spec(folder: Path, name: str) -> Path:
    workload = WORKLOADS[name]
    spec = {
        "name": f"bench-sweep-{name}",
        "model": workload["model"],
        "data": workload["data"],
        "batch_size": 32,
        "epochs": workload["epochs"],
        "device": "cpu",
        "optimizer": {"name": "momentum", "lr": 0.05},
        "sweep": {"grid": workload["grid"]},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_sweep(spec: Path, parallel: int, out: Path) -> dict:
    started = time.perf_counter()
    result = sweep(spec, out, parallel=parallel)
    wall = time.perf_counter() - started
    done = [t for t in result.trials if t.status == "completed"]
    assert len(done) == 8, f"{len(done)} of 8 trials completed"
    return {"wall_s": wall, "train_s": sum(t.wall_s for t in done), "slots": result.slots}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", default="mlp,lenet")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        folder = Path(tmp)
        print("workload | parallel | wall s | trials/min | in-trial s (sum) | ratio")
        print("---|---|---|---|---|---")
        for name in args.workloads.split(","):
            spec = write_spec(folder, name)
            measured: dict[int, list[dict]] = {1: [], 2: []}
            for round_ in range(args.rounds):
                for parallel in (1, 2):
                    out = folder / f"{name}-{parallel}-{round_}"
                    measured[parallel].append(one_sweep(spec, parallel, out))
            wall = {p: statistics.median(r["wall_s"] for r in runs) for p, runs in measured.items()}
            for parallel, runs in measured.items():
                train = statistics.median(r["train_s"] for r in runs)
                ratio = f"**{wall[1] / wall[2]:.2f}**" if parallel == 2 else "1.00"
                print(
                    f"{name} | {parallel} (slots {runs[0]['slots']}) | {wall[parallel]:.1f} | "
                    f"{8 * 60 / wall[parallel]:.1f} | {train:.1f} | {ratio}"
                )


if __name__ == "__main__":
    main()
