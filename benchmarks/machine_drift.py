"""How far a training step drifts on this machine, beside the calibration probes, in one run.

Measures the machine once (`bench machine`) and predicts the MLP's step (784-512-256-10, Adam,
batch 32) on it. Then, for `--seconds`, it repeats: the per-op overhead probe (a training step of
tiny layers, as `bench machine` times it), a 256² matrix product, and the median of 10 real
training steps of that MLP. It prints each one's spread over the run (min, median, max, max/min)
and the prediction's ratio to the MLP's fastest, median and slowest step: on a shared machine the
step can move far more than the probes that calibrate its prediction.

    .venv/bin/python benchmarks/machine_drift.py [--seconds 90] [--quick-machine]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dlscale import profiler
from dlscale.bench.batch import synthetic_spec
from dlscale.bench.machine import machine_hardware, run_machine_bench
from dlscale.bench.matmul import median_time_s
from dlscale.profiler.calibrate import training_op_overhead_s
from dlscale.profiler.estimate import measure_steps
from dlscale.profiler.target import resolve
from dlscale.train.loop import Trainer

MLP = ("mlp", {"hidden": [512, 256]}, [784], 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to keep sampling")
    parser.add_argument("--quick-machine", action="store_true", help="quick machine bench")
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error("--seconds must be positive")

    model, kwargs, shape, batch = MLP
    local = machine_hardware(run_machine_bench(quick=args.quick_machine))
    workload = resolve(model, batch, shape, "fp32", "adam", False, kwargs)
    predicted = profiler.profile(workload, [local]).reports[0].prediction.step_s
    cpu = torch.device("cpu")
    product = torch.randn(256, 256)
    samples: dict[str, list[float]] = {"overhead probe": [], "256² product": [], "mlp step": []}
    with tempfile.TemporaryDirectory() as scratch:
        spec = synthetic_spec(model, kwargs, shape, False, batch, batch * 40, "cpu")
        trainer = Trainer(spec, Path(scratch))
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            samples["overhead probe"].append(training_op_overhead_s(cpu, 0.1))
            samples["256² product"].append(median_time_s("torch.mm(m, m)", {"m": product}, 0.1))
            samples["mlp step"].append(statistics.median(measure_steps(trainer, 3, 10)))

    count = len(samples["mlp step"])
    print(f"{count} samples over {args.seconds:.0f} s")
    print(f"{'':<16} {'min':>10} {'median':>10} {'max':>10} {'max/min':>8}")
    for name, values in samples.items():
        print(
            f"{name:<16} {min(values) * 1e6:>8.1f}µs {statistics.median(values) * 1e6:>8.1f}µs "
            f"{max(values) * 1e6:>8.1f}µs {max(values) / min(values):>8.2f}"
        )
    steps = samples["mlp step"]
    print(
        f"predicted mlp step {predicted * 1e3:.2f} ms: predicted / measured "
        f"{predicted / min(steps):.2f} (fastest), {predicted / statistics.median(steps):.2f} "
        f"(median), {predicted / max(steps):.2f} (slowest)"
    )


if __name__ == "__main__":
    main()
