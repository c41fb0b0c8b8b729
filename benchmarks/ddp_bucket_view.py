"""A CPU step under torch's DDP as dlscale's ddp wraps a model (train/ddp_hook.wrap: the
gradients are views of DDP's buckets) against torch's default (buckets apart from the gradients,
each gradient copied in and back), and the bare step without DDP, side by side.

One process in a one-process gloo group, one thread, an MLP of three linear layers (512 → W → W
→ 10, batch 64, SGD with momentum), each way wrapped with dlscale's comm hook; in each round the
three run one after another on fresh copies of the same seeded model, so that a machine whose
speed drifts moves all three alike. A figure is the median step of a round after warm-up;
printed per width: each way's median over the rounds with its spread (max / min), DDP's own
time a step (DDP's step less the bare one) each way, and how many gradient storages each holds
(the views' one bucket against the default's tensors).

    .venv/bin/python benchmarks/ddp_bucket_view.py [--rounds 5] [--steps 40]
        [--widths 256,2800]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dlscale.train.ddp_hook import AllreduceTimer, wrap

WARMUP = 5


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(512, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def _default(module: nn.Module) -> nn.Module:
    """torch's DDP as it comes (buckets apart from the gradients), with dlscale's hook."""
    model = DistributedDataParallel(module)
    model.register_comm_hook(state=None, hook=AllreduceTimer(1).hook)
    return model


def _median_step(model: nn.Module, steps: int) -> tuple[float, int]:
    """(median step seconds after WARMUP, distinct gradient storages after the last step)."""
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    return statistics.median(times[WARMUP:]), len(storages)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f} ms (×{max(values) / min(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--widths", default="256,2800")
    args = parser.parse_args()
    torch.set_num_threads(1)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {uptime}; torch {torch.__version__}, 1 thread, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as scratch:
        store = dist.FileStore(str(Path(scratch) / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            for width in (int(w) for w in args.widths.split(",")):
                found = {"bare": [], "default": [], "views": []}
                storages = {}
                for _ in range(args.rounds):
                    ways = {
                        "bare": _model(width),
                        "default": _default(_model(width)),
                        "views": wrap(_model(width), AllreduceTimer(1)),
                    }
                    for name, model in ways.items():
                        seconds, storages[name] = _median_step(model, args.steps)
                        found[name].append(seconds)
                        if isinstance(model, DistributedDataParallel):
                            model.reducer = None  # before the group goes down
                params = sum(p.numel() for p in _model(width).parameters())
                print(f"\nwidth {width}: {params * 4 / 1e6:.1f} MB of fp32 gradients")
                for name, values in found.items():
                    print(f"  {name:8s} {_spread(values)}  gradient storages {storages[name]}")
                bare = statistics.median(found["bare"])
                default = statistics.median(found["default"]) - bare
                views = statistics.median(found["views"]) - bare
                print(
                    f"  DDP's own time a step: default {default * 1e3:.2f} ms, views "
                    f"{views * 1e3:.2f} ms (views / default {views / default:.2f})"
                )
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
