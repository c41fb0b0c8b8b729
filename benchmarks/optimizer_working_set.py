"""The optimizer's update, predicted per tensor vs for the whole model, against measured steps.

torch's CPU optimizers loop over parameter tensors and run all of one tensor's kernels before
the next tensor's, so the caches must hold one tensor's parameter, gradient and state at a time,
not the model's. The roofline prices each tensor's update at the rate `bench machine` measured
for that working set. This prints, for each workload of `predict_accuracy.py`, the update
measured inside real training steps (`dlscale train`'s own step: forward and backward, then the
timed update) beside two predictions from the same calibration: per tensor (what the roofline
does) and with one working set for the whole model (its parameters, gradients and state). Each
round recalibrates, then measures every workload.

    .venv/bin/python benchmarks/optimizer_working_set.py [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dlscale import profiler
from dlscale.bench.batch import synthetic_spec
from dlscale.bench.machine import machine_hardware, run_machine_bench
from dlscale.profiler.roofline import optimizer_seconds, phase_time
from dlscale.profiler.target import resolve
from dlscale.train.loop import Trainer
from predict_accuracy import WORKLOADS


def measured_update_s(spec, steps: int, warmup: int = 3) -> float:
    """Median seconds of the optimizer update, each after its step's forward and backward."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec, Path(scratch))
        x, y = next(iter(trainer.train_loader))
        updates = []
        for _ in range(warmup + steps):
            trainer.step_fn.forward_backward(x, y)
            start = time.perf_counter()
            trainer.step_fn.apply()
            updates.append(time.perf_counter() - start)
    return statistics.median(updates[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="calibration + workloads, repeated")
    parser.add_argument("--steps", type=int, default=10, help="timed updates per workload")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")

    ratios: dict[str, list[tuple[float, float]]] = {}
    for number in range(1, args.rounds + 1):
        local = machine_hardware(run_machine_bench())
        print(f"round {number}")
        print(f"  {'workload':<20} {'measured':>9} {'per tensor':>11} {'whole model':>12}")
        for model, kwargs, shape, tokens, batches in WORKLOADS:
            for batch in batches:
                spec = synthetic_spec(model, kwargs, shape, tokens, batch, batch * 40, "cpu")
                measured = measured_update_s(spec, args.steps)
                workload = resolve(model, batch, shape, "fp32", "adam", tokens, kwargs)
                trace = profiler.profile(workload, []).trace
                per_tensor = optimizer_seconds(trace, local)
                footprint = trace.optimizer_working_set_bytes
                whole = phase_time(trace.optimizer, local, "fp32", working_set_bytes=footprint)
                label = f"{model} batch {batch}"
                print(
                    f"  {label:<20} {measured * 1e3:>7.2f}ms {per_tensor * 1e3:>9.2f}ms "
                    f"{whole.seconds * 1e3:>10.2f}ms"
                )
                ratios.setdefault(label, []).append(
                    (per_tensor / measured, whole.seconds / measured)
                )

    print(f"\n{'workload':<20} {'per tensor / measured':>22} {'whole model / measured':>23}")
    for label, pairs in ratios.items():
        per_tensor = statistics.median(p for p, _ in pairs)
        whole = statistics.median(w for _, w in pairs)
        print(f"{label:<20} {per_tensor:>22.2f} {whole:>23.2f}")
    for column, name in ((0, "per tensor"), (1, "whole model")):
        errors = [
            abs(1 - statistics.median(pair[column] for pair in pairs)) for pairs in ratios.values()
        ]
        print(
            f"{name}: median |1 - ratio| {statistics.median(errors):.2f}, worst {max(errors):.2f}"
        )


if __name__ == "__main__":
    main()
