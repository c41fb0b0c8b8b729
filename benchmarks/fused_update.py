"""A CPU training step with dlscale's update (torch's fused kernel, train/step.py build_optimizer)
against the same step with torch's CPU default (its per-tensor loop of kernels), side by side.

Each case trains through dlscale's own loop (`Trainer.run_epoch` on seeded synthetic data, as
benchmarks/predict_accuracy.py runs its cases, at each case's smallest batch there), once with
the fused update and once with the loop (the same optimizer with `fused` switched off), in
alternating order round by round; a figure is the median step the loop records after warm-up.
Printed per case: each way's median over the rounds with its spread (max / min), and loop /
fused (above 1: the fused update is faster). Adam unless --optimizer says otherwise.

First, what the fused call costs a tensor (the tracer counts one op a tensor for it,
profiler/trace.py): the median step over 1 and over 64 tensors of 64 elements, each way.

    .venv/bin/python benchmarks/fused_update.py [--rounds 3] [--steps 8] [--threads 1]
        [--models alexnet,vgg16,gpt2] [--optimizer adam]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

from dlscale.profiler.calibrate import seconds_per_call
from dlscale.train.loop import Trainer
from predict_accuracy import CASES, Case, spec_for  # benchmarks/ is the script's own folder

WARMUP = 2


def step_s(case: Case, batch: int, steps: int, fused: bool, optimizer: str) -> float:
    """The median step of dlscale's loop, after WARMUP steps, with the update fused or not."""
    spec = spec_for(case, batch, WARMUP + steps)
    spec = spec.model_copy(
        update={"optimizer": spec.optimizer.model_copy(update={"name": optimizer})}
    )
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec, Path(scratch))
        for group in trainer.optimizer.param_groups:
            assert group["fused"], "dlscale's CPU update is expected to be fused"
            group["fused"] = fused
        trainer.run_epoch(0)
        records = trainer.history.steps.records[WARMUP:]
    return statistics.median(record["step_s"] for record in records)


def per_tensor_s(fused: bool, tensors: int) -> float:
    """Seconds of one Adam step over `tensors` tensors of 64 elements (the stable median of
    `bench machine`'s own timer)."""
    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(tensors)]
    for param in params:
        param.grad = torch.randn(8, 8)
    optimizer = torch.optim.Adam(params, fused=fused)
    return seconds_per_call(optimizer.step, torch.device("cpu"), 0.5, warmup=50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per figure")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    parser.add_argument("--models", default="", help="case labels (default: all)")
    parser.add_argument(
        "--optimizer", default="adam", choices=("sgd", "momentum", "adam", "adamw", "adagrad")
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.threads < 0:
        parser.error("--rounds and --steps must be positive, --threads at least 0")
    known = {case.label: case for case in CASES}
    labels = [label for label in args.models.split(",") if label] or list(known)
    unknown = [label for label in labels if label not in known]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}; known: {', '.join(known)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"uptime before: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    for fused in (True, False):
        one, many = per_tensor_s(fused, 1), per_tensor_s(fused, 64)
        print(
            f"Adam {'fused' if fused else 'loop'}: a step over 1 tensor {one * 1e6:.1f} µs, over "
            f"64 {many * 1e6:.1f} µs: {(many - one) / 63 * 1e6:.2f} µs a tensor"
        )
    print(f"\noptimizer {args.optimizer}; {args.rounds} rounds of {args.steps} steps\n")
    print("| case | batch | torch's loop | fused (dlscale) | loop / fused |")
    print("|---|---|---|---|---|")
    for label in labels:
        case = known[label]
        batch = case.batches[0]
        times: dict[bool, list[float]] = {True: [], False: []}
        for index in range(args.rounds):
            order = (True, False) if index % 2 == 0 else (False, True)
            for fused in order:
                times[fused].append(step_s(case, batch, args.steps, fused, args.optimizer))
        loop, fused = (statistics.median(times[way]) for way in (False, True))
        spread = {way: max(times[way]) / min(times[way]) for way in times}
        print(
            f"| {label} | {batch} | {loop * 1e3:.1f} ms (×{spread[False]:.2f}) | "
            f"{fused * 1e3:.1f} ms (×{spread[True]:.2f}) | {loop / fused:.2f} |",
            flush=True,
        )
    print(f"\nuptime after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
