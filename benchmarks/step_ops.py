"""One training step of a predict_accuracy.py case, op by op: where its time goes inside dlscale's
loop, and what the largest products, adds and fills take when they run alone.

`Trainer.run_epoch` runs `--steps` steps twice: once as it is, for the step's time and page
faults, then under a TorchDispatchMode that times each aten op a step dispatches (an op that
calls others internally, as the embedding's backward calls a zero-fill, is timed whole; a call's
time includes a few microseconds of dispatch from Python). Each (op, input shapes) is printed
with its median time a call over the steps after the first two, its calls a step and their
product, largest first. `--alone` runs the largest `mm`, `add` and `fill_` entries again by
themselves, on new contiguous tensors of the same shapes, each call after a 64 MiB write that
pushes them out of the caches ("cold"), then call after call ("hot", as `bench machine` times
its products), and prints both medians beside (the step's own operands may be transposed views:
a product's time alone is then only near its time in the step). `--no-update`
makes the optimizer's step a no-op (docs/performance.md, GPT-2 at batch 1).

`--modules` runs the steps a third time with forward hooks on every module (no dispatch mode)
and prints each module's own forward a step (its time less its children's), the modules with
the same name but for their block numbers together (`transformer.h.*.attn`), beside the
forward dlscale predicts for those layers with `--hardware`, largest difference first. Hooks
send every module's call through torch's slower call path, about 2 µs a call, which lands in the
parent's own time (a container's row reads high by that much a child); the loss is no module
(its predicted forward is printed apart).

Not torch.profiler: under it this process faulted about 5,000 pages a step (GPT-2 at batch 1;
none without it), and every op that writes a new 8 MB tensor ran 3-10× slower, its fault time
counted as the op's. The page faults a step are printed for both runs, so that a timing which
disturbs the step shows it.

    .venv/bin/python benchmarks/step_ops.py gpt2 1 [--steps 14] [--top 16] [--alone]
        [--no-update] [--threads 1] [--shape 1] [--hardware local] [--modules]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import re
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.errors import UserError
from dlscale.hardware.catalogue import get_hardware
from dlscale.profiler.recorder import LOSS, MODEL
from dlscale.train.loop import Trainer
from predict_accuracy import CASES, Case, predicted, spec_for  # the script beside this one

ALONE = ("aten.mm.default", "aten.add.Tensor", "aten.fill_.Scalar")
FLUSH_BYTES = 64 * 2**20
WARMUP = 2  # steps left out of the medians: the first steps fault their tensors' pages in


class OpTimer(TorchDispatchMode):
    """Each dispatched op's wall time, by (op, input shapes), with the step it ran in."""

    def __init__(self):
        super().__init__()
        self.step = 0
        self.calls: dict[tuple[str, tuple], list[tuple[int, float]]] = collections.defaultdict(list)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        took = time.perf_counter() - start
        shapes = tuple(_shape(arg) for arg in args if _shape(arg) is not None)
        self.calls[(str(func), shapes)].append((self.step, took * 1e3))
        return out


class ModuleTimer:
    """Each module's own forward time a step (its time less its children's), by name."""

    def __init__(self):
        self.step = 0
        self.own: dict[str, dict[int, float]] = collections.defaultdict(
            lambda: collections.defaultdict(float)
        )
        self._running: list[list] = []  # [name, start, children's time]

    def attach(self, model: torch.nn.Module) -> list:
        handles = []
        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(self._enter(name or MODEL)))
            handles.append(module.register_forward_hook(self._leave))
        return handles

    def _enter(self, name: str):
        def hook(module, args):
            self._running.append([name, time.perf_counter(), 0.0])

        return hook

    def _leave(self, module, args, output):
        name, start, children = self._running.pop()
        took = time.perf_counter() - start
        self.own[name][self.step] += took - children
        if self._running:
            self._running[-1][2] += took


def block_group(name: str) -> str:
    """A module's name with its block numbers as `*`: the blocks' modules together."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def print_modules(
    timer: ModuleTimer, steps: int, forward: dict[str, float] | None, top: int
) -> None:
    """Each group of modules' own forward a step, measured (median over the counted steps)
    and, given the predicted forward by layer name, predicted; the `top` largest differences
    (measured over predicted) first."""
    counted = range(WARMUP, steps)
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for name, by_step in timer.own.items():
        row = rows[block_group(name)]
        row[0] += statistics.median(by_step.get(step, 0.0) for step in counted)
        row[2] += 1
    predicted_loss = None
    for name, seconds in (forward or {}).items():
        if name == LOSS:
            predicted_loss = seconds
        else:
            rows[block_group(name)][1] += seconds
    measured = sum(row[0] for row in rows.values())
    head = f"modules' own forward a step: measured {measured * 1e3:.2f} ms"
    if forward is not None:
        head += (
            f", predicted {(sum(row[1] for row in rows.values())) * 1e3:.2f} ms (the loss apart: "
            f"{(predicted_loss or 0.0) * 1e3:.2f} ms predicted)"
        )
    print(head)
    print(f"{'measured':>9} {'predicted':>9} {'diff':>8} {'modules':>7}  name (ms a step)")
    order = sorted(rows.items(), key=lambda item: item[1][1] - item[1][0])
    for name, (took, guess, count) in order[:top]:
        guessed = f"{guess * 1e3:9.3f}" if forward is not None else f"{'':>9}"
        diff = f"{(took - guess) * 1e3:8.3f}" if forward is not None else f"{'':>8}"
        print(f"{took * 1e3:9.3f} {guessed} {diff} {count or '':>7}  {name}")


def _shape(arg) -> tuple[int, ...] | str | None:
    """A tensor argument's shape; a list of tensors (`cat`, a fused update) as their count."""
    if isinstance(arg, torch.Tensor):
        return tuple(arg.shape)
    if isinstance(arg, list | tuple) and arg and all(isinstance(a, torch.Tensor) for a in arg):
        return f"{len(arg)} tensors"
    return None


def run_steps(
    case: Case,
    batch: int,
    steps: int,
    no_update: bool,
    timer: OpTimer | None,
    modules: ModuleTimer | None = None,
):
    """`steps` steps of the case in dlscale's loop, under `timer` if given, its modules timed
    by `modules` if given: each step's milliseconds and minor page faults."""
    faults: list[int] = []
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec_for(case, batch, steps), Path(scratch))
        if no_update:
            trainer.optimizer.step = lambda *args, **kwargs: None
        inner = trainer.step_fn

        def counted(x, y):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            loss = inner(x, y)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            for each in (timer, modules):
                if each is not None:
                    each.step += 1
            return loss

        trainer.step_fn = counted
        if modules is not None:
            modules.attach(trainer.model)
        with timer if timer is not None else contextlib.nullcontext():
            trainer.run_epoch(0)
        step_ms = [r["step_s"] * 1e3 for r in trainer.history.steps.records]
    return step_ms, faults


def alone_ms(op: str, shapes: tuple[tuple[int, ...] | str, ...]) -> tuple[float, float] | None:
    """The op by itself on new contiguous tensors of `shapes`, median ms a call: the caches
    flushed before each call, and hot (called again and again, as the product grid of `bench
    machine` times it); None for ops or shapes it does not rebuild."""
    flush = torch.empty(FLUSH_BYTES // 4)
    if not all(isinstance(shape, tuple) for shape in shapes):
        return None
    tensors = [torch.randn(shape) for shape in shapes if shape]
    if op == "aten.mm.default" and len(tensors) == 2:
        a, b = tensors

        def call():
            return torch.mm(a, b)

    elif op == "aten.add.Tensor" and len(tensors) == 2 and tensors[0].shape == tensors[1].shape:
        a, b = tensors

        def call():
            return torch.add(a, b)

    elif op == "aten.fill_.Scalar" and len(tensors) == 1:
        (a,) = tensors

        def call():
            return a.fill_(0.0)

    else:
        return None

    def timed(cold: bool) -> float:
        if cold:
            flush.fill_(1.0)
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    call()
    cold = statistics.median(timed(True) for _ in range(20))
    return cold * 1e3, statistics.median(timed(False) for _ in range(20)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label", help=f"a case: {', '.join(c.label for c in CASES)}")
    parser.add_argument("batch", type=int)
    parser.add_argument("--steps", type=int, default=14, help="steps run, each way")
    parser.add_argument("--top", type=int, default=16, help="entries printed")
    parser.add_argument("--alone", action="store_true", help="time the largest ops alone")
    parser.add_argument("--no-update", action="store_true", help="the optimizer's step skipped")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--shape",
        help="one sample's shape instead of the case's, comma-separated ('1': GPT-2 or BERT on "
        "one token, where a step is nearly all fixed cost)",
    )
    parser.add_argument(
        "--hardware",
        help="also print the step dlscale predicts on this catalogue device ('local': this "
        "machine, after `dlscale bench machine`)",
    )
    parser.add_argument(
        "--modules",
        action="store_true",
        help="also time each module's own forward (hooks, a third run) beside its prediction",
    )
    args = parser.parse_args()
    if args.label not in {c.label for c in CASES}:
        parser.error(f"unknown case {args.label!r}; known: {[c.label for c in CASES]}")
    if args.batch < 1 or args.steps < 3 or args.top < 1 or args.threads < 1:
        parser.error("batch, --top and --threads must be at least 1, --steps at least 3")
    case = next(c for c in CASES if c.label == args.label)
    if args.shape is not None:
        try:
            shape = [int(size) for size in args.shape.split(",")]
        except ValueError:
            parser.error(
                f"--shape {args.shape!r}: give sizes separated by commas, e.g. 1 or 3,32,32"
            )
        if len(shape) != len(case.shape) or min(shape) < 1:
            parser.error(f"--shape: {len(case.shape)} positive sizes, as the case's {case.shape}")
        case = dataclasses.replace(case, shape=shape)
    torch.set_num_threads(args.threads)
    prediction = None
    if args.hardware is not None:  # first: a bad name or shape is told before minutes of steps
        try:
            hardware = get_hardware(args.hardware)
            prediction = hardware, predicted(case, args.batch, hardware)
        except (UserError, RuntimeError) as exc:
            parser.error(f"--hardware {args.hardware}: {str(exc).splitlines()[0]}")
    try:
        plain_ms, plain_faults = run_steps(case, args.batch, args.steps, args.no_update, None)
    except (UserError, RuntimeError) as exc:  # a --shape the model cannot take
        parser.error(f"{args.label} at {case.shape}: {str(exc).splitlines()[0]}")
    timer = OpTimer()
    timed_ms, timed_faults = run_steps(case, args.batch, args.steps, args.no_update, timer)
    counted = args.steps - WARMUP
    rows = []
    for (op, shapes), calls in timer.calls.items():
        times = [ms for step, ms in calls if step >= WARMUP]
        if times:
            median = statistics.median(times)
            rows.append((median * len(times) / counted, median, len(times) / counted, op, shapes))
    rows.sort(reverse=True)
    update = " (no update)" if args.no_update else ""
    print(
        f"{args.label} {case.shape} batch {args.batch}{update}, {args.steps} steps, "
        f"medians after {WARMUP}: "
        f"step {statistics.median(plain_ms[WARMUP:]):.2f} ms "
        f"({statistics.median(plain_faults[WARMUP:]):.0f} page faults a step); "
        f"timed op by op {statistics.median(timed_ms[WARMUP:]):.2f} ms "
        f"({statistics.median(timed_faults[WARMUP:]):.0f} faults), "
        f"its {sum(row[2] for row in rows):.0f} ops a step {sum(row[0] for row in rows):.2f} ms "
        "together"
    )
    if prediction is not None:
        hardware, p = prediction
        measured_threads = hardware.measured.get("threads")
        if measured_threads not in (None, args.threads):
            print(
                f"note: {hardware.name} was measured with {measured_threads} torch threads, this "
                f"run has {args.threads}: its prediction is for a different machine"
            )
        update_s = 0.0 if args.no_update else p.optimizer_s
        print(
            f"predicted on {hardware.name}: step {(p.step_s - p.optimizer_s + update_s) * 1e3:.2f} "
            f"ms (forward {p.forward_s * 1e3:.2f}, backward {p.backward_s * 1e3:.2f}, update "
            f"{update_s * 1e3:.2f}, loop {p.loop_s * 1e3:.2f})"
        )
    print(
        f"{'ms/step':>8} {'ms/call':>8} {'calls':>6} {'cold':>7} {'hot':>7}  op, input shapes "
        "(cold, hot: alone, ms a call)"
    )
    for per_step, median, count, op, shapes in rows[: args.top]:
        alone = alone_ms(op, shapes) if args.alone and op in ALONE else None
        shown = f"{alone[0]:7.3f} {alone[1]:7.3f}" if alone is not None else f"{'':>15}"
        listed = ",".join(
            str(list(shape)).replace(" ", "") if isinstance(shape, tuple) else f"[{shape}]"
            for shape in shapes
        )
        print(f"{per_step:8.3f} {median:8.3f} {count:6.1f} {shown}  {op} {listed}")
    if args.modules:
        modules = ModuleTimer()
        run_steps(case, args.batch, args.steps, args.no_update, None, modules)
        forward = None
        if prediction is not None:
            forward = {layer.name: layer.forward.seconds for layer in prediction[1].layers}
        print_modules(modules, args.steps, forward, args.top)


if __name__ == "__main__":
    main()
