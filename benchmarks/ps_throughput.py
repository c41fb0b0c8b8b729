"""dlscale `ps` (mode async, 2 workers): update throughput against the bound raw bandwidth implies.

The model is the zoo's `mlp` with hidden widths 672-672 on 784-value synthetic samples: 986,506
parameters, P = 4 bytes × that = 3.95 MB per gradient or parameter copy. Each worker trains 8
samples per step (compute is small next to communication), SGD, one thread per process, within
the first epoch (no evaluation in the middle; worker 0 evaluates ~200 validation samples once at
the end).

Raw bandwidth B: in the same run, two spawned processes (gloo, 127.0.0.1) ping-pong a fp32 tensor
of the model's size with dist.send / dist.recv; B = bytes moved one way per second, each
direction's transfer counted once (2 × P per round trip / round-trip time). Measured once per
round, just before that round's training runs.

The bound: per async update a worker pushes P bytes (gradients) and pulls P bytes (parameters).
With one server, every byte of both workers crosses that server's links. Assumption: on loopback
TCP on one machine the two directions share the bandwidth (the same cores copy both ways), so the
server moves at most B bytes/s in all and the bound is B / (2P) worker updates per second, summed
over workers. With S servers each worker still moves 2P per update in total (split over the
servers: tensors are never split, so here about 53% / 47% for S = 2), and on one machine the
servers share the same cores and loopback: the bound stays B / (2P) unless servers truly run in
parallel. Both S = 1 and S = 2 are measured against that one bound.

Measured throughput: total worker steps (each an update pushed to the servers; counted once per
worker step, not once per server) / training wall time (the slowest worker's `train_wall_s`).
Each round runs S = 1 and S = 2 back to back, alternating their order (1, 2, 2, 1, ...); the
median of per-round ratios (each against that round's bandwidth) is printed.

    .venv/bin/python benchmarks/ps_throughput.py [--rounds 2] [--steps 200] [--pingpong 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlscale.api import train
from dlscale.launch.local import free_port
from dlscale.spec import parse_spec

GOAL_RATIO = 0.6
WORKERS = 2
BATCH = 8
HIDDEN = [672, 672]
SHAPE = [1, 28, 28]
WARMUP = 10


def make_spec(servers: int, steps: int) -> dict:
    # Enough samples that `steps` stay inside the first epoch: no evaluation in the middle.
    val_fraction = 0.05
    num_samples = int(steps * BATCH * WORKERS / (1 - val_fraction)) + 512
    return {
        "name": f"ps-bench-s{servers}",
        "model": {"name": "mlp", "kwargs": {"hidden": HIDDEN}},
        "data": {"name": "synthetic", "shape": SHAPE, "num_samples": num_samples,
                 "val_fraction": val_fraction},
        "batch_size": BATCH,
        "steps": steps,
        "optimizer": {"name": "sgd", "lr": 0.01},
        "device": "cpu",
        "checkpoint": {"keep_last": 1},
        "strategy": {"name": "ps", "mode": "async", "workers": WORKERS, "servers": servers},
    }  # fmt: skip


def run_ps(servers: int, steps: int, out: Path) -> dict:
    record = train(parse_spec(make_spec(servers, steps)), out_dir=out)
    alive = [w for w in record["workers"] if w.get("status") != "died"]
    worker_steps = sum(w["steps"] for w in alive)
    wall = max(w["train_wall_s"] for w in alive)
    return {
        "parameters": record["model"]["parameters"],
        "updates_per_s": worker_steps / wall,
        "wait_share": statistics.mean(w["wait_s"] / w["train_wall_s"] for w in alive),
    }


def _pingpong(rank: int, port: int, elements: int, iters: int, result: str, pin: bool) -> None:
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if pin and len(cores) >= 2:  # one core each, as dlscale's launcher pins when it can
        os.sched_setaffinity(0, [cores[rank]])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=120))  # fmt: skip
    tensor = torch.randn(elements)  # real data: pages of zeros would be read from one page
    peer = 1 - rank

    def trip() -> None:
        if rank == 0:
            dist.send(tensor, dst=peer)
            dist.recv(tensor, src=peer)
        else:
            dist.recv(tensor, src=peer)
            dist.send(tensor, dst=peer)

    for _ in range(WARMUP):
        trip()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        trip()
    elapsed = time.perf_counter() - start
    if rank == 0:
        moved = 2 * iters * elements * tensor.element_size()  # each direction counted once
        Path(result).write_text(json.dumps({"bytes_per_s": moved / elapsed}))
    dist.destroy_process_group()


def raw_bandwidth(elements: int, iters: int, scratch: Path) -> float:
    """Bytes per second one way between two gloo processes on 127.0.0.1 (ping-pong): the better
    of the two placements, unpinned and pinned to a core each, so the bound is not understated."""
    found = []
    for pin in (False, True):
        result = scratch / f"pingpong-{pin}.json"
        mp.spawn(_pingpong, args=(free_port(), elements, iters, str(result), pin), nprocs=2)
        found.append(json.loads(result.read_text())["bytes_per_s"])
    return max(found)


def parameter_count() -> int:
    from dlscale.models.mlp import mlp

    inputs = int(torch.Size(SHAPE).numel())
    return sum(p.numel() for p in mlp(inputs, HIDDEN).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="steps per worker per run")
    parser.add_argument("--pingpong", type=int, default=200, help="round trips to time")
    args = parser.parse_args()
    elements = parameter_count()
    nbytes = 4 * elements
    print(f"model: mlp {HIDDEN}, {elements:,} parameters, P = {nbytes / 1e6:.2f} MB; "
          f"{WORKERS} workers × batch {BATCH}, {args.steps} steps each")  # fmt: skip
    rows = []
    header = (f"{'round':>5} {'B GB/s':>7} {'bound upd/s':>11} {'S=1 upd/s':>9} {'ratio':>6} "
              f"{'S=2 upd/s':>9} {'ratio':>6}")  # fmt: skip
    print(header)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for round_ in range(1, args.rounds + 1):
            bandwidth = raw_bandwidth(elements, args.pingpong, scratch)
            bound = bandwidth / (2 * nbytes)
            order = (1, 2) if round_ % 2 else (2, 1)
            measured = {}
            for servers in order:
                out = scratch / f"run-{round_}-s{servers}"
                measured[servers] = run_ps(servers, args.steps, out)
                assert measured[servers]["parameters"] == elements
            ratios = {s: measured[s]["updates_per_s"] / bound for s in (1, 2)}
            rows.append({"bandwidth": bandwidth, "bound": bound, "measured": measured,
                         "ratios": ratios})  # fmt: skip
            print(f"{round_:>5} {bandwidth / 1e9:>7.2f} {bound:>11.1f} "
                  f"{measured[1]['updates_per_s']:>9.1f} {ratios[1]:>6.3f} "
                  f"{measured[2]['updates_per_s']:>9.1f} {ratios[2]:>6.3f}")  # fmt: skip
    bandwidth = statistics.median(r["bandwidth"] for r in rows)
    bound = statistics.median(r["bound"] for r in rows)
    print(
        f"raw gloo send/recv bandwidth: median {bandwidth / 1e9:.2f} GB/s one way; "
        f"bound B / (2P) = {bound:.1f} updates/s (worker pushes, summed over workers)"
    )
    for servers in (1, 2):
        rate = statistics.median(r["measured"][servers]["updates_per_s"] for r in rows)
        wait = statistics.median(r["measured"][servers]["wait_share"] for r in rows)
        ratio = statistics.median(r["ratios"][servers] for r in rows)
        print(
            f"S = {servers}: {rate:.1f} updates/s (workers wait on communication "
            f"{wait:.0%} of their time); median ratio to bound = {ratio:.3f} "
            f"(goal ≥ {GOAL_RATIO}: {'met' if ratio >= GOAL_RATIO else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
