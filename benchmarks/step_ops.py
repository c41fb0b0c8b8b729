"""One training step of a predict_accuracy.py case, op by op: where its time goes inside dlscale's
loop, and what the largest products, adds and fills take when they run alone.

`Trainer.run_epoch` runs `--steps` steps under torch.profiler (input shapes recorded); each
(aten op, input shapes) is printed with its median time a call, its calls a step and their
product, the time a step, largest first (the median over every call, the first steps'
included, so that a warm-up step's page faults do not count). `--alone` runs the largest
`aten::mm`, `aten::add` and `aten::fill_` entries again by themselves, on new contiguous
tensors of the same shapes, each call after a 64 MiB write that pushes them out of the caches,
and prints their median beside (the step's own operands may be transposed views: a product's
time alone is then only near its time in the step). `--no-update` makes the optimizer's step a
no-op: the step without its update, to see what the update does to the ops around it
(docs/performance.md, GPT-2 at batch 1).

    .venv/bin/python benchmarks/step_ops.py gpt2 1 [--steps 14] [--top 16] [--alone]
        [--no-update] [--threads 1]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dlscale.train.loop import Trainer
from predict_accuracy import CASES, spec_for  # the script beside this one

ALONE = ("aten::mm", "aten::add", "aten::fill_")
FLUSH_BYTES = 64 * 2**20


def profiled_step(label: str, batch: int, steps: int, no_update: bool) -> dict:
    """{(op, input shapes): [each call's own milliseconds]} over `steps` steps of the case."""
    case = next(c for c in CASES if c.label == label)
    calls: dict[tuple[str, tuple], list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec_for(case, batch, steps), Path(scratch))
        if no_update:
            trainer.optimizer.step = lambda *args, **kwargs: None
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            trainer.run_epoch(0)
        step_ms = [r["step_s"] * 1e3 for r in trainer.history.steps.records]
    for event in prof.events():
        shapes = tuple(tuple(shape) for shape in event.input_shapes)
        calls[(event.name, shapes)].append(event.self_cpu_time_total / 1e3)
    return {"calls": calls, "step_ms": step_ms}


def alone_ms(op: str, shapes: tuple[tuple[int, ...], ...]) -> float | None:
    """The op by itself on new contiguous tensors of `shapes`, the caches flushed before each
    call; None for ops or shapes it does not rebuild."""
    flush = torch.empty(FLUSH_BYTES // 4)
    tensors = [torch.randn(shape) for shape in shapes if shape]
    if op == "aten::mm" and len(tensors) == 2:
        a, b = tensors

        def call():
            return torch.mm(a, b)

    elif op == "aten::add" and len(tensors) == 2 and tensors[0].shape == tensors[1].shape:
        a, b = tensors

        def call():
            return torch.add(a, b)

    elif op == "aten::fill_" and len(tensors) == 1:
        (a,) = tensors

        def call():
            return a.fill_(0.0)

    else:
        return None

    def flushed() -> float:
        flush.fill_(1.0)
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    return statistics.median(flushed() for _ in range(20)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label", help=f"a case: {', '.join(c.label for c in CASES)}")
    parser.add_argument("batch", type=int)
    parser.add_argument("--steps", type=int, default=14, help="steps profiled")
    parser.add_argument("--top", type=int, default=16, help="entries printed")
    parser.add_argument("--alone", action="store_true", help="time the largest ops alone")
    parser.add_argument("--no-update", action="store_true", help="the optimizer's step skipped")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    if args.label not in {c.label for c in CASES}:
        parser.error(f"unknown case {args.label!r}; known: {[c.label for c in CASES]}")
    if args.batch < 1 or args.steps < 3 or args.top < 1 or args.threads < 1:
        parser.error("batch, --top and --threads must be at least 1, --steps at least 3")
    torch.set_num_threads(args.threads)
    found = profiled_step(args.label, args.batch, args.steps, args.no_update)
    steps = args.steps
    rows = []
    for (op, shapes), times in found["calls"].items():
        median = statistics.median(times)
        rows.append((median * len(times) / steps, median, len(times) / steps, op, shapes))
    rows.sort(reverse=True)
    step = statistics.median(found["step_ms"][2:])
    update = " (no update)" if args.no_update else ""
    print(f"{args.label} batch {args.batch}{update}: median step {step:.2f} ms, {steps} steps")
    print(f"{'ms/step':>8} {'ms/call':>8} {'calls':>6} {'alone':>7}  op, input shapes")
    for per_step, median, count, op, shapes in rows[: args.top]:
        alone = None
        if args.alone and op in ALONE:
            alone = alone_ms(op, shapes)
        shown = f"{alone:7.3f}" if alone is not None else f"{'':>7}"
        listed = str([list(shape) for shape in shapes]).replace(" ", "")
        print(f"{per_step:8.3f} {median:8.3f} {count:6.1f} {shown}  {op} {listed}")


if __name__ == "__main__":
    main()
