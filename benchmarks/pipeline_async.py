"""The asynchronous pipeline (2bw, PipeDream-2BW) against GPipe on the same split: speed and the
loss after the same samples.

Model: the zoo's `mlp` with four hidden layers of 1024 (3.9M parameters) on the bundled digits
at 28 × 28 (784 inputs, 10 classes), split into S = 2 stages (`split: auto`, the same for both:
the planner does not look at the schedule), batch 256 in M microbatches, Adam lr 0.001, seed 0,
`--steps` steps a run (the same samples in the same order for both schedules). One process per
stage, through the API, as `dlscale train` runs it.

Per run: steps/s (1 / the median step time), samples/s over the run, the idle slots the
schedule has per stage between its first backward and its last forward (slots.py), the
measured bubble (1 − compute time / schedule time), and the losses: the mean training loss of
the first and last 5 steps and the validation loss and accuracy of the final weights (after 2bw's
drain). Rounds alternate the schedules; medians and the spread (min–max) are shown, with
`uptime` before and after.

`--one-process`: instead, the same update rule in one process in plain PyTorch, to tell the
algorithm from the pipeline: the model and data set above, Adam, batches of 256 drawn at random
(seed 0), each batch's gradient taken at the weights before the last update and applied to the
newest (W(t+1) = W(t) − ν·∇f(W(t−1))), against the synchronous rule; the validation loss after
`--steps` steps, at lr 0.001 and 0.0001.

    .venv/bin/python benchmarks/pipeline_async.py [--steps 60] [--rounds 3] [--microbatches 4]
    .venv/bin/python benchmarks/pipeline_async.py --one-process [--steps 60]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from dlscale.api import train
from dlscale.data import build_data
from dlscale.jobspec import parse_spec
from dlscale.models import build_model
from dlscale.train.record import RunRecord
from dlscale.train.score import compute_loss

STAGES = 2
BATCH = 256
HIDDEN = [1024, 1024, 1024, 1024]
SCHEDULES = ("gpipe", "2bw")


def make_spec(schedule: str, microbatches: int, steps: int) -> dict:
    return {
        "name": f"async-{schedule}-{microbatches}",
        "model": {"name": "mlp", "kwargs": {"hidden": HIDDEN}},
        "data": {"name": "digits", "image_size": 28},
        "batch_size": BATCH,
        "steps": steps,
        "optimizer": {"name": "adam", "lr": 0.001},
        "device": "cpu",
        "seed": 0,
        "strategy": {
            "name": "pipeline",
            "stages": STAGES,
            "schedule": schedule,
            "microbatches": microbatches,
        },
    }


def measure(record: RunRecord) -> dict:
    final, pipe = record.final, record.pipeline
    losses = [s.loss for s in record.steps if s.loss is not None]
    return {
        "steps_per_s": 1.0 / final.median_step_s,
        "samples_per_s": final.train_samples_per_s,
        "steady_idle": pipe["bubble_slots"]["steady_idle_slots"],
        "bubble": pipe["bubble_measured"],
        "first_loss": statistics.mean(losses[:5]),
        "last_loss": statistics.mean(losses[-5:]),
        "val_loss": final.val_loss,
        "val_accuracy": final.val_accuracy,
        "staleness": pipe["mean_staleness"],
    }


def spread(values: list[float], fmt: str) -> str:
    middle = statistics.median(values)
    return f"{middle:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def one_process(data, stale: bool, lr: float, steps: int) -> float:
    """Validation loss after `steps` of Adam, each gradient at the weights one update old if
    `stale` (the copy taken before the last update), else at the current weights."""
    torch.manual_seed(0)
    model = build_model("mlp", {"hidden": HIDDEN}, data.model_defaults())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    x_all, y_all = data.train.tensors
    generator = torch.Generator().manual_seed(0)
    before = model
    for _ in range(steps):
        rows = torch.randint(0, len(y_all), (BATCH,), generator=generator)
        where = before if stale else model
        where.zero_grad()
        compute_loss(where(x_all[rows]), y_all[rows]).backward()
        grads = [p.grad.clone() for p in where.parameters()]
        before = copy.deepcopy(model)  # W(t), for the next batch's gradient
        for param, grad in zip(model.parameters(), grads, strict=True):
            param.grad = grad
        optimizer.step()
    x_val, y_val = data.val.tensors
    with torch.no_grad():
        return float(compute_loss(model(x_val), y_val))


def main_one_process(steps: int) -> None:
    spec = parse_spec(make_spec("gpipe", 4, steps))
    data = build_data(spec.data, 0)
    print(f"one process, mlp {HIDDEN} on digits 28×28, Adam, batch {BATCH}, {steps} steps")
    for lr in (0.001, 0.0001):
        sync, stale = (one_process(data, s, lr, steps) for s in (False, True))
        print(f"lr {lr}: validation loss {sync:.3f} synchronous, {stale:.3f} one update stale")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--one-process", action="store_true", help="the rule without a pipeline")
    args = parser.parse_args()
    if args.one_process:
        main_one_process(args.steps)
        return
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime before: {uptime}")
    print(
        f"mlp {HIDDEN} on digits 28×28, {STAGES} stages, batch {BATCH} in {args.microbatches} "
        f"microbatches, {args.steps} steps a run, {args.rounds} rounds"
    )
    runs: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for schedule in SCHEDULES:
                spec = parse_spec(make_spec(schedule, args.microbatches, args.steps))
                out = Path(scratch) / f"{schedule}-{round_}"
                runs[schedule].append(measure(train(spec, out_dir=out)))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime after: {uptime}")
    columns = [
        ("steps/s", "steps_per_s", ".2f"),
        ("samples/s", "samples_per_s", ",.0f"),
        ("steady idle slots", "steady_idle", "d"),
        ("bubble measured", "bubble", ".1%"),
        ("loss, first 5 steps", "first_loss", ".3f"),
        ("loss, last 5 steps", "last_loss", ".3f"),
        ("val loss", "val_loss", ".3f"),
        ("val accuracy", "val_accuracy", ".1%"),
        ("mean staleness", "staleness", ".2f"),
    ]
    print("| schedule | " + " | ".join(title for title, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for schedule in SCHEDULES:
        cells = [spread([r[key] for r in runs[schedule]], fmt) for _, key, fmt in columns]
        print(f"| {schedule} | " + " | ".join(cells) + " |")
    ratios = [
        a["steps_per_s"] / g["steps_per_s"] for a, g in zip(runs["2bw"], runs["gpipe"], strict=True)
    ]
    print(f"2bw / gpipe steps/s, per round: {', '.join(f'{r:.2f}×' for r in ratios)}")


if __name__ == "__main__":
    main()
