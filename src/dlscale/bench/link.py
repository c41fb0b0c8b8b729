"""Links, measured: gloo all-reduces timed between two local processes (`bench machine`), or
between two hosts of a Ray cluster with point-to-point messages beside them (`bench link`),
fitted to latency + bytes / bandwidth, as the scaling model prices a link."""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlscale.launch.base import Resources, WorkerContext
from dlscale.launch.local import free_port

SIZES_BYTES = (4 * 2**10, 256 * 2**10, 4 * 2**20, 32 * 2**20)
QUICK_SIZES_BYTES = (4 * 2**10, 4 * 2**20)


def _worker(rank: int, port: int, sizes: tuple[int, ...], repeats: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for size in sizes:
            tensor = torch.ones(size // 4)
            dist.all_reduce(tensor)  # warm-up: connections, buffers
            # Back to back, as training issues them; rounds of a few, the median round's mean.
            calls = max(1, min(20, 2**22 // size))
            times = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(tensor)
                times.append((time.perf_counter() - start) / calls)
            if rank == 0:
                results[size] = statistics.median(times)
    finally:
        dist.destroy_process_group()


def time_allreduce(sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds of a 2-process gloo all-reduce of each size (bytes)."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(free_port(), sizes, repeats, results), nprocs=2, join=True)
        return dict(results)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(intercept ≥ 0, slope > 0, worst relative error) of y = intercept + slope·x, by least
    squares."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    slope = max(slope, 1e-15)
    intercept = max(0.0, mean_y - slope * mean_x)
    errors = [abs(intercept + slope * x - y) / y for x, y in zip(xs, ys, strict=True)]
    return intercept, slope, max(errors)


def fit_link(times: dict[int, float], ranks: int = 2) -> dict:
    """Latency and bandwidth of a ring all-reduce, t = 2(N−1)·latency + 2(N−1)/N · bytes / bw,
    by least squares over the timed sizes; the relative error of the fit at each size."""
    steps = 2 * (ranks - 1)
    xs = [steps / ranks * size for size in times]  # bytes each rank sends
    intercept, slope, worst = fit_line(xs, list(times.values()))
    return {
        "bytes_per_s": 1 / slope,
        "latency_s": intercept / steps,
        "fit_max_error": worst,
        "timed": {str(size): seconds for size, seconds in times.items()},
    }


def measure_link(quick: bool = False) -> dict:
    """`dlscale bench machine`'s link probe: what the `local-gloo` link is made of."""
    sizes = QUICK_SIZES_BYTES if quick else SIZES_BYTES
    return fit_link(time_allreduce(sizes, repeats=5 if quick else 20))


# ------------------------------------------------------------------- between two hosts


def probe_worker(context: WorkerContext, payload: dict) -> dict | None:
    """One end of a link between two hosts (a launcher's worker): gloo all-reduces and
    point-to-point round trips of each size, timed on rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{context.master_addr}:{context.master_port}",
        rank=context.rank,
        world_size=2,
        timeout=timedelta(seconds=payload["timeout_s"]),
    )
    found: dict[str, dict[int, float]] = {"allreduce": {}, "p2p": {}}
    try:
        for size in payload["sizes"]:
            tensor = torch.ones(size // 4)
            dist.all_reduce(tensor)  # warm-up: connections, buffers
            calls = max(1, min(20, 2**22 // size))
            rounds, trips = [], []
            for _ in range(payload["repeats"]):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(tensor)
                rounds.append((time.perf_counter() - start) / calls)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):  # there and back: one way is half of it
                    if context.rank == 0:
                        dist.send(tensor, 1)
                        dist.recv(tensor, 1)
                    else:
                        dist.recv(tensor, 0)
                        dist.send(tensor, 0)
                trips.append((time.perf_counter() - start) / calls / 2)
            found["allreduce"][size] = statistics.median(rounds)
            found["p2p"][size] = statistics.median(trips)
    finally:
        dist.destroy_process_group()
    return found if context.rank == 0 else None


def fit_p2p(times: dict[int, float]) -> dict:
    """Latency and bandwidth of one message, t = latency + bytes / bw, by least squares."""
    intercept, slope, worst = fit_line([float(size) for size in times], list(times.values()))
    return {
        "bytes_per_s": 1 / slope,
        "latency_s": intercept,
        "fit_max_error": worst,
        "timed": {str(size): seconds for size, seconds in times.items()},
    }


def measure_between(launcher, first: str, second: str, quick: bool = False) -> dict:
    """The link between the hosts at addresses `first` and `second`, one process on each."""
    payload = {
        "sizes": QUICK_SIZES_BYTES if quick else SIZES_BYTES,
        "repeats": 3 if quick else 7,
        "timeout_s": 120.0,
    }
    ends = [Resources(cpus=1.0, node=first), Resources(cpus=1.0, node=second)]
    found = launcher.run(probe_worker, payload, 2, ends)[0]
    return {
        "hosts": [first, second],
        "allreduce": fit_link(found["allreduce"]),
        "p2p": fit_p2p(found["p2p"]),
        "quick": quick,
    }
