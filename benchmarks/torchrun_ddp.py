"""The plain DDP script dlscale is compared with: what a person writes for torchrun.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/torchrun_ddp.py --steps 300

Same model (LeNet), data (seeded synthetic 1×28×28), per-worker batch, optimizer and threads as
benchmarks/ddp_vs_torchrun.py gives dlscale. Prints rank 0's loop throughput as JSON: samples
trained by all workers divided by the wall time of the training loop after the first
WARMUP_STEPS steps, which dlscale's `train_samples_per_s` leaves out too.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dlscale.data import build_data
from dlscale.jobspec import SyntheticData
from dlscale.models import build_model
from dlscale.train.metrics import WARMUP_STEPS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    spec = SyntheticData(name="synthetic", shape=[1, 28, 28], num_samples=args.samples)
    x, y = build_data(spec, 0).train.tensors
    model = DistributedDataParallel(build_model("lenet", {"num_classes": 10, "in_channels": 1}))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    global_batch = args.batch * world
    start = time.perf_counter()
    for step in range(args.steps):
        if step == WARMUP_STEPS:
            start = time.perf_counter()
        if step % (x.shape[0] // global_batch) == 0:
            order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(step))
        b = step % (x.shape[0] // global_batch)
        idx = order[
            b * global_batch + rank * args.batch : b * global_batch + (rank + 1) * args.batch
        ]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        loss.item()
    elapsed = time.perf_counter() - start
    if rank == 0:
        timed = args.steps - WARMUP_STEPS
        print(json.dumps({"samples_per_s": timed * global_batch / elapsed}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
