"""dlscale's systolic-array cycles against SCALE-Sim's, layer by layer, for LeNet and ResNet-18,
and which dataflow suits which layer (a chart).

For every forward GEMM of LeNet-5 (28×28 digits) and ResNet-18 (224×224, batch 1), each
dataflow (os, ws, is), on a 32×32 array: dlscale's analytical cycles (profiler/systolic.py)
beside SCALE-Sim's compute cycles (the length of the demand matrices its cycle-accurate compute
module builds for the same operand matrices), their ratio, and the time each took. Goal: every
ratio within 10%.

    .venv/bin/python benchmarks/systolic_vs_scalesim.py [--array 32] [--plot FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

from dlscale.models import build_model
from dlscale.profiler.systolic import DATAFLOWS, compute_cycles, step_gemms
from dlscale.profiler.trace import trace_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.test_systolic import scalesim_cycles  # one harness for test and benchmark

MODELS = [("lenet", {}, (1, 28, 28)), ("resnet18", {}, (3, 224, 224))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--array", type=int, default=32)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    size = args.array
    rows, worst = [], 0.0
    print(
        f"{'layer':<26} {'M×K×N':>18} "
        + " ".join(f"{df + ' ours/scalesim':>24}" for df in DATAFLOWS)
    )
    for name, kwargs, shape in MODELS:
        step = trace_step(
            partial(build_model, name, kwargs),
            torch.zeros(shape),
            1,
            "fp32",
            lambda params: torch.optim.SGD(params, lr=0.1),
            "sgd",
        )
        for gemm in step_gemms(step):
            if " forward: " not in gemm.name:
                continue
            cells, found = [], {}
            for df in DATAFLOWS:
                ours = compute_cycles(df, gemm.m, gemm.k, gemm.n, size, size)[1]
                start = time.perf_counter()
                theirs = scalesim_cycles(df, gemm.m, gemm.k, gemm.n, size, size)
                seconds = time.perf_counter() - start
                ratio = ours / theirs
                worst = max(worst, abs(ratio - 1))
                found[df] = ours
                cells.append(f"{ours:>9,}/{theirs:<9,} {ratio:.3f}")
                del seconds
            label = f"{name}.{gemm.name.replace(' forward: ', ' ')}"
            print(f"{label:<26} {gemm.m:>6}×{gemm.k:>5}×{gemm.n:<5} " + " ".join(cells))
            rows.append((label, found))
    print(f"largest difference from SCALE-Sim: {worst:.1%} (goal ≤ 10%)")
    if args.plot:
        plot(rows, size, args.plot)
        print(f"wrote {args.plot}")


def plot(rows, size: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.27
    for index, df in enumerate(DATAFLOWS):
        ax.bar(
            [i + (index - 1) * width for i in range(len(rows))],
            [found[df] for _, found in rows],
            width,
            label=df,
        )
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], rotation=70, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(f"cycles on a {size}×{size} array (log)")
    ax.set_title(
        "forward GEMMs of LeNet-5 and ResNet-18, batch 1: output-, weight- and input-stationary"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
