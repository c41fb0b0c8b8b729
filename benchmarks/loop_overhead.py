"""dlscale's training loop vs the plainest hand-written PyTorch loop: throughput ratio.

Both sides train the same model (same initial weights) on the same in-memory tensors, same batch
size, optimizer and thread count. The plain loop is the fastest one we could write: it indexes the
tensors directly (no DataLoader, no timers, no progress). dlscale's side is `Trainer.run_epoch`,
i.e. everything a real run does per step (DataLoader with the resumable sampler, the step-time
breakdown, loss read-back, progress events), timed from outside; evaluation and checkpoint writes
happen between epochs and are left out on both sides. Measurements alternate in short epochs
(dlscale, plain, plain, dlscale, ...; ~0.1-0.3 s each) so that this shared machine's noise hits
both sides alike; the median of the per-pair ratios and the ratio of the totals are printed.

    .venv/bin/python benchmarks/loop_overhead.py [--model lenet] [--batch 64] [--pairs 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from dlscale.jobspec import parse_spec
from dlscale.models import build_model
from dlscale.train.loop import Trainer
from dlscale.train.step import build_optimizer

GOAL = 0.97


def make_trainer(model: str, batch: int, num_samples: int, run_dir: str) -> Trainer:
    spec = parse_spec(
        {
            "name": "loop-overhead",
            "model": {"name": model},
            "data": {"name": "synthetic", "shape": [1, 28, 28], "num_samples": num_samples},
            "batch_size": batch,
            "epochs": 1000,  # we drive the epochs ourselves
            "device": "cpu",
            "seed": 0,
        }
    )
    return Trainer(spec, run_dir)


def plain_epoch(model, optimizer, x, y, batch: int, epoch: int) -> float:
    """The loop a person writes by hand; returns seconds."""
    generator = torch.Generator().manual_seed(epoch)
    start = time.perf_counter()
    order = torch.randperm(x.shape[0], generator=generator)
    running = 0.0
    for b in range(x.shape[0] // batch):
        idx = order[b * batch : (b + 1) * batch]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        running += loss.item()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="steps per measurement")
    parser.add_argument("--pairs", type=int, default=40, help="interleaved measurement pairs")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as run_dir:
        # 80% of synthetic samples are training samples: size the data to --steps batches.
        num_samples = -(-args.steps * args.batch * 5 // 4) + 1
        trainer = make_trainer(args.model, args.batch, num_samples, run_dir)
        x, y = trainer.data.train.tensors
        torch.manual_seed(0)
        plain_model = build_model(args.model, {}, trainer.data.model_defaults())
        plain_model.load_state_dict(trainer.model.state_dict())
        plain_opt = build_optimizer(plain_model.parameters(), trainer.spec.optimizer)
        samples_per_epoch = trainer.plan.steps_per_epoch * args.batch

        def time_dlscale(epoch: int) -> float:
            trainer.step = epoch * trainer.plan.steps_per_epoch
            start = time.perf_counter()
            trainer.run_epoch(epoch)
            return time.perf_counter() - start

        time_dlscale(0)  # warm-up: allocator, thread pool, first-touch of the data
        plain_epoch(plain_model, plain_opt, x, y, args.batch, 0)
        ratios, ours_total, plain_total = [], 0.0, 0.0
        print(
            f"{args.model}, batch {args.batch}, {trainer.plan.steps_per_epoch} steps per "
            f"measurement, {args.pairs} pairs, {torch.get_num_threads()} threads"
        )
        for r in range(1, args.pairs + 1):
            if r % 2:
                ours = time_dlscale(r)
                plain = plain_epoch(plain_model, plain_opt, x, y, args.batch, r)
            else:
                plain = plain_epoch(plain_model, plain_opt, x, y, args.batch, r)
                ours = time_dlscale(r)
            ratios.append(plain / ours)  # throughput ratio = inverse time ratio
            ours_total += ours
            plain_total += plain
        print(f"dlscale: {samples_per_epoch * args.pairs / ours_total:,.0f} samples/s")
        print(f"plain:   {samples_per_epoch * args.pairs / plain_total:,.0f} samples/s")
        low, mid, high = statistics.quantiles(ratios, n=4)
        print(f"per-pair ratio quartiles: {low:.3f} / {mid:.3f} / {high:.3f}")
        median = statistics.median(ratios)
        verdict = "met" if median >= GOAL else "NOT met"
        print(f"ratio of totals dlscale/plain = {plain_total / ours_total:.3f}")
        print(f"median throughput ratio dlscale/plain = {median:.3f} (goal ≥ {GOAL}: {verdict})")


if __name__ == "__main__":
    main()
