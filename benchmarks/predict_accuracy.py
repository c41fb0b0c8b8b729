"""Roofline prediction vs measured training step on this machine (`local`): every zoo model and
Hugging Face GPT-2 and BERT, three batch sizes each.

A round: measure the machine (`bench machine --quick` unless --full-machine: matmul curve and
products by shape, bandwidth, per-op cost, dlscale's loop per step, convolution and attention
rates, elementwise shares), then for every workload train real steps through dlscale's own loop
(`Trainer.run_epoch` on seeded synthetic data of the model's input shape; each step's time as the
loop records it, the median after warm-up; at least --min-seconds of timed steps, so a small
model's median is not four steps that one burst of the host's other work decides) and take
predicted / measured. Rounds repeat the whole (calibration and measurement side by side each
time), since this shared machine's speed drifts by tens of percent within minutes; each
workload's figure is its median ratio over the rounds, printed beside every round's, and the
spread of its measured step across rounds (max / min). The load average is printed with every
round. Goal: every median ratio within 0.8–1.2. Beside it, the ratio the same calibration gives
with every matrix product priced at the square curve's rate for its FLOPs instead of its own
shape's (the model before the (M, K, N) grid), and the ratio with every product at its rate
timed hot (where the step's state passes the last-level cache its products are priced at the
grid timed cold, marked "(cold)"): paired before/afters.

Image models run at reduced inputs (64×64; VGG at 32×32) and GPT-2/BERT at
reduced sizes (benchmarks/hf_lm.py), so that a round takes minutes on two cores.

    .venv/bin/python benchmarks/predict_accuracy.py [--rounds 2] [--quick] [--models mlp,gpt2]
        [--full-machine] [--threads 1] [--min-seconds 0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dlscale import profiler
from dlscale.bench.machine import machine_hardware, run_machine_bench
from dlscale.hardware.device import COLD_GRID, HOT_GRID
from dlscale.jobspec import parse_spec
from dlscale.profiler.target import resolve
from dlscale.train.loop import Trainer

GOAL = (0.8, 1.2)
MAX_STEPS = 400  # timed steps of one workload, however small its step
IMAGE, LM, SEQUENCE = "image", "language_modeling", "classification"


@dataclass(frozen=True)
class Case:
    label: str
    model: str  # a zoo name or package.module:factory
    shape: list[int]  # one sample
    data: str  # IMAGE | LM (tokens, next-token targets) | SEQUENCE (tokens, one class)
    batches: tuple[int, int, int]
    kwargs: dict = field(default_factory=dict)


CASES = [
    Case("mlp", "mlp", [784], IMAGE, (32, 128, 512)),
    Case("lenet", "lenet", [1, 28, 28], IMAGE, (32, 128, 512)),
    Case("alexnet", "alexnet", [3, 64, 64], IMAGE, (4, 8, 16), {"num_classes": 10}),
    Case("alexnet_2gpu", "alexnet_2gpu", [3, 64, 64], IMAGE, (4, 8, 16), {"num_classes": 10}),
    Case("vgg11", "vgg11", [3, 32, 32], IMAGE, (2, 4, 8), {"num_classes": 10}),
    Case("vgg16", "vgg16", [3, 32, 32], IMAGE, (2, 4, 8), {"num_classes": 10}),
    Case("resnet18", "resnet18", [3, 64, 64], IMAGE, (4, 8, 16), {"num_classes": 10}),
    Case("resnet50", "resnet50", [3, 64, 64], IMAGE, (2, 4, 8), {"num_classes": 10}),
    Case("gpt", "gpt", [64], LM, (8, 16, 32), {"vocab_size": 256}),
    Case("lstm", "lstm", [64], SEQUENCE, (8, 32, 128), {"vocab_size": 256}),
    Case("gpt2", "hf_lm:gpt2", [64], LM, (1, 2, 4)),
    Case("bert", "hf_lm:bert", [64], LM, (1, 2, 4)),
]


def spec_for(case: Case, batch: int, steps: int):
    """`steps` steps of `case` at `batch` on seeded synthetic data shaped like its input."""
    if case.data == IMAGE:
        data = {"name": "synthetic", "shape": case.shape, "num_classes": 10}
    else:
        data = {
            "name": "synthetic",
            "kind": "tokens",
            "task": case.data,
            "seq_len": case.shape[0],
            "vocab_size": 256,
            "num_classes": 10,
        }
    data["num_samples"] = 2 * batch * steps  # the reader keeps a fifth aside for validation
    return parse_spec(
        {
            "name": f"accuracy-{case.label}",
            "model": {"name": case.model, "kwargs": case.kwargs},
            "data": data,
            "batch_size": batch,
            "steps": steps,
            "device": "cpu",
        }
    )


def step_counts(args, predicted_s: float) -> tuple[int, int]:
    """(warm-up, timed) steps for a workload predicted at `predicted_s` a step: at least
    --warmup and --steps, and enough for --min-seconds of timed steps (a fifth of it warming
    up), at most MAX_STEPS: four steps of a 2 ms model are 8 ms, which one burst of the host's
    other work decides."""
    wanted = math.ceil(args.min_seconds / max(predicted_s, 1e-6))
    steps = max(args.steps, min(MAX_STEPS, wanted))
    warmup = max(args.warmup, min(MAX_STEPS // 5, math.ceil(wanted / 5)))
    return warmup, steps


def measured_step_s(case: Case, batch: int, warmup: int, steps: int) -> float:
    """The median step of dlscale's loop, as it records each step, after `warmup` steps."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec_for(case, batch, warmup + steps), Path(scratch))
        trainer.run_epoch(0)
        records = trainer.history.steps.records[warmup:]
    return statistics.median(record["step_s"] for record in records)


def predicted(case: Case, batch: int, local):
    tokens = case.data != IMAGE
    workload = resolve(case.model, batch, case.shape, "fp32", "adam", tokens, case.kwargs)
    return profiler.profile(workload, [local]).reports[0].prediction


def without(local, *keys: str):
    """The same calibration without the measured tables `keys`: without both product grids,
    products at the square curve (the model before the grid); without the cold one, every
    product at its rate timed hot (the model before a step's state past the cache counted)."""
    measured = {k: v for k, v in local.measured.items() if k not in keys}
    return dataclasses.replace(local, measured=measured)


def _cache_held(local) -> str:
    """', cache held 128 of 300 MiB': what `bench machine` found this process keeps of the
    last-level cache (a step whose state passes it is priced cold), where it measured it."""
    cache, held = local.measured.get("last_level_cache_bytes"), local.cache_held_bytes()
    if not cache or held is None:
        return ""
    return f", cache held {held / 2**20:.0f} of {cache / 2**20:.0f} MiB"


def measure_round(cases: list[Case], args) -> list[dict]:
    """One round: measure the machine, then each case at each batch."""
    load = os.getloadavg()
    print(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads"
    )
    start = time.perf_counter()
    local = machine_hardware(run_machine_bench(quick=not args.full_machine))
    print(
        f"local ({time.perf_counter() - start:.0f} s): fp32 "
        f"{local.peak_flops['fp32'] / 1e9:,.1f} GFLOP/s, "
        f"{local.memory_bandwidth_bytes_per_s / 1e9:,.1f} GB/s, "
        f"op {local.overhead_per_op_s * 1e6:.1f} µs, loop {local.overhead_per_step_s * 1e3:.3f} ms"
        f", spread {local.measured['spread']['median']:.0%}" + _cache_held(local)
    )
    print(f"  {'workload':<22} {'measured':>10} {'predicted':>10} {'ratio':>6}  parts")
    found = []
    for case in cases:
        for batch in case.batches:
            prediction = predicted(case, batch, local)
            warmup, steps = step_counts(args, prediction.step_s)
            measured = measured_step_s(case, batch, warmup, steps)
            square = predicted(case, batch, without(local, HOT_GRID, COLD_GRID))
            hot = predicted(case, batch, without(local, COLD_GRID))
            sources = prediction.phase_sources()
            row = {
                "label": f"{case.label} batch {batch}",
                "measured_s": measured,
                "predicted_s": prediction.step_s,
                "square_predicted_s": square.step_s,
                "hot_predicted_s": hot.step_s,
                "products_cold": prediction.products_cold,
                "loop_s": prediction.loop_s,
                "optimizer_s": prediction.optimizer_s,
                "roofline_phases": sources["roofline"],
                "phases": sources["roofline"] + sources["measured"],
                "timed_steps": steps,
            }
            print(
                f"  {row['label']:<22} {measured * 1e3:>8.2f}ms {prediction.step_s * 1e3:>8.2f}ms "
                f"{prediction.step_s / measured:>6.2f}  (square curve "
                f"{square.step_s / measured:.2f}, products hot {hot.step_s / measured:.2f}"
                f"{', cold' if prediction.products_cold else ''}) "
                f"loop {prediction.loop_s * 1e3:.2f} ms, "
                f"optimizer {prediction.optimizer_s * 1e3:.2f} ms, roofline phases "
                f"{row['roofline_phases']}/{row['phases']}, {steps} steps timed"
            )
            found.append(row)
    return found


def summary(rounds: list[list[dict]]) -> list[dict]:
    """Per workload over the rounds: median measured and predicted, drift, median ratio."""
    rows = []
    for index, first in enumerate(rounds[0]):
        found = [each[index] for each in rounds]
        measured = [row["measured_s"] for row in found]
        ratios = [row["predicted_s"] / row["measured_s"] for row in found]
        rows.append(
            {
                "label": first["label"],
                "measured_s": statistics.median(measured),
                "measured_max_over_min": max(measured) / min(measured),
                "predicted_s": statistics.median(row["predicted_s"] for row in found),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "square_ratio": statistics.median(
                    row["square_predicted_s"] / row["measured_s"] for row in found
                ),
                "hot_ratio": statistics.median(
                    row["hot_predicted_s"] / row["measured_s"] for row in found
                ),
                "products_cold": first["products_cold"],
                "roofline_phases": first["roofline_phases"],
                "phases": first["phases"],
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "\n| workload | measured | measured max/min | predicted | ratio | ratios by round "
        "| ratio, products at the square curve | ratio, products hot |"
        "\n|---|---|---|---|---|---|---|---|"
    )
    for row in rows:
        outside = not GOAL[0] <= row["ratio"] <= GOAL[1]
        ratio = f"**{row['ratio']:.2f}**" if outside else f"{row['ratio']:.2f}"
        print(
            f"| {row['label']} | {row['measured_s'] * 1e3:.2f} ms | "
            f"{row['measured_max_over_min']:.2f} | {row['predicted_s'] * 1e3:.2f} ms | {ratio} | "
            f"{' '.join(f'{r:.2f}' for r in row['ratios'])} | {row['square_ratio']:.2f} | "
            f"{row['hot_ratio']:.2f}{' (cold)' if row['products_cold'] else ''} |"
        )
    inside = sum(GOAL[0] <= row["ratio"] <= GOAL[1] for row in rows)
    every = [r for row in rows for r in row["ratios"]]
    print(
        f"\n{inside}/{len(rows)} median ratios within {GOAL[0]}–{GOAL[1]} (medians "
        f"{min(r['ratio'] for r in rows):.2f}–{max(r['ratio'] for r in rows):.2f}; single rounds "
        f"{sum(GOAL[0] <= r <= GOAL[1] for r in every)}/{len(every)} within)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="machine bench + workloads, repeated")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per workload")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    parser.add_argument(
        "--quick", action="store_true", help="at least 4 timed steps after 2 warm-up"
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.5,
        help="time at least this much of a workload's steps (more steps for a small model; "
        "0: exactly --steps)",
    )
    parser.add_argument("--models", default="", help="comma-separated labels (default: all)")
    parser.add_argument("--full-machine", action="store_true", help="full machine bench")
    parser.add_argument("--json", type=Path, help="write every round's rows here")
    parser.add_argument(
        "--threads", type=int, help="torch threads for calibration and training alike"
    )
    args = parser.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if args.quick:
        args.steps, args.warmup = 4, 2
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be at least 1, --warmup not negative")
    wanted = [name for name in args.models.split(",") if name]
    unknown = set(wanted) - {case.label for case in CASES}
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {[c.label for c in CASES]}")
    cases = [case for case in CASES if not wanted or case.label in wanted]

    rounds = []
    for number in range(1, args.rounds + 1):
        print(f"round {number}")
        rounds.append(measure_round(cases, args))
        if args.json:  # kept after every round: a long run stopped early still has its rounds
            args.json.write_text(json.dumps({"rounds": rounds}, indent=1))
    rows = summary(rounds)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": rows}, indent=1))


if __name__ == "__main__":
    main()
