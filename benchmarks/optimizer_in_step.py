"""Adam's update timed alone vs inside training steps, side by side in one run.

`bench machine` calibrates the optimizer's cache-resident rate from updates timed inside training
steps, each after a forward and a backward. This prints why: for a square linear layer of each
width, the median update timed over and over on its own (its state stays in the caches) beside
the median update timed after each step's forward and backward at two batch sizes (the
activations they touch evict part of it), and the ratio in-step / alone. Rounds alternate the
two, so both see the same machine.

    .venv/bin/python benchmarks/optimizer_in_step.py [--rounds 3] [--widths 512,1024]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from dlscale.profiler.calibrate import seconds_per_call, update_seconds_in_step

BATCHES = (32, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alone / in-step pairs per row")
    parser.add_argument("--widths", default="512,1024", help="layer widths (width² parameters)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds timed per figure")
    args = parser.parse_args()
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        parser.error(f"--widths must be integers separated by commas (got {args.widths!r})")
    if args.rounds < 1 or min(widths) < 1 or args.min_time <= 0:
        parser.error("--rounds, --widths and --min-time must be positive")

    cpu = torch.device("cpu")
    print(
        f"{'width':>6} {'params':>9} {'batch':>6} {'alone':>9} {'in step':>9} {'ratio':>6}"
        "  ratios by round"
    )
    for width in widths:
        for batch in BATCHES:
            torch.manual_seed(0)
            model = nn.Linear(width, width)
            x = torch.randn(batch, width)
            alone, in_step = [], []
            for _ in range(args.rounds):
                in_step.append(update_seconds_in_step(model, x, cpu, args.min_time))
                optimizer = torch.optim.Adam(model.parameters())  # gradients from the last step
                alone.append(seconds_per_call(optimizer.step, cpu, args.min_time))
            ratios = [s / a for s, a in zip(in_step, alone, strict=True)]
            params = sum(p.numel() for p in model.parameters())
            print(
                f"{width:>6} {params:>9,} {batch:>6} {statistics.median(alone) * 1e3:>7.3f}ms "
                f"{statistics.median(in_step) * 1e3:>7.3f}ms {statistics.median(ratios):>6.2f}  "
                + " ".join(f"{r:.2f}" for r in ratios)
            )


if __name__ == "__main__":
    main()
