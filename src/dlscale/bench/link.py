"""Links, measured: gloo all-reduces timed between two local processes (`bench machine`), or
between two hosts of a Ray cluster with point-to-point messages beside them (`bench link`),
fitted to latency + bytes / bandwidth, as the scaling model prices a link; and how much slower
the same all-reduce runs while each process computes, as in a training step (contention)."""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlscale.launch.base import Resources, WorkerContext
from dlscale.launch.local import LocalLauncher, free_port

SIZES_BYTES = (4 * 2**10, 256 * 2**10, 4 * 2**20, 32 * 2**20)
QUICK_SIZES_BYTES = (4 * 2**10, 4 * 2**20)
# Contention is timed from a small bucket (latency-bound, as a small model's one bucket) to one
# that is bandwidth-bound, each alone and inside compute, in rounds that alternate the two.
CONTENTION_SIZES_BYTES = (64 * 2**10, 1 * 2**20, 8 * 2**20)
# What the `local` entry keeps of the local probe (hardware.links.measured_link reads it).
SAVED_KEYS = (
    "bytes_per_s",
    "latency_s",
    "fit_max_error",
    "contention",
    "contention_quartiles",
    "contention_by_size",
)


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


def _compute_slice(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, x: torch.Tensor) -> None:
    """A slice of a backward pass: a small matmul, then elementwise work over a buffer. It took
    105–240 µs a slice on the 2-core development machine under load: the all-reduce's end is
    seen at most that late, against 0.5–1.8 ms for the smallest all-reduce alone."""
    torch.mm(a, b, out=out)
    x.mul_(0.999).add_(out[0, 0])


def time_contention(sizes: tuple[int, ...], rounds: int) -> dict[int, list[float]]:
    """This process's side of the contention probe (both ranks run it): for each size and round,
    the all-reduce's time inside compute / its time alone.

    It is issued as DDP's bucket hook issues it (`all_reduce(async_op=True)`): gloo runs it on
    its own threads while this thread goes on with backward, on the same cores (one thread a
    worker, pinned, under the local launcher). Alone, this thread just waits for it. Inside
    compute, this thread computes in slices for as long as the all-reduce took alone (the
    median so far), as backward goes on after a bucket is issued, then waits for it as DDP
    does at the end of backward; the peer does the same. The all-reduce's time is from its
    launch to the first moment it is seen done, as DDP's timer in a training step counts it.
    """
    a, b, out = torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)
    x = torch.randn(2**16)
    ratios: dict[int, list[float]] = {}
    for size in sizes:
        tensor = torch.ones(size // 4)
        dist.all_reduce(tensor)  # warm-up: connections, buffers
        alone_s: list[float] = []
        found = []
        for _ in range(rounds):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor, async_op=True).wait()
            alone_s.append(time.perf_counter() - start)
            burst = statistics.median(alone_s)
            dist.barrier()
            start = time.perf_counter()
            work = dist.all_reduce(tensor, async_op=True)
            done = None
            while time.perf_counter() - start < burst:
                _compute_slice(a, b, out, x)
                if done is None and work.is_completed():
                    done = time.perf_counter()
            work.wait()
            done = done or time.perf_counter()
            found.append((done - start) / alone_s[-1])
        ratios[size] = found
    return ratios


def contention_worker(context: WorkerContext, payload: dict) -> dict[int, list[float]] | None:
    """One of the two local processes of the contention probe (a launcher's worker, so its
    threads and cores are set as a training worker's are)."""
    dist.init_process_group("gloo", rank=context.rank, world_size=context.world_size)
    try:
        ratios = time_contention(payload["sizes"], payload["rounds"])
    finally:
        dist.destroy_process_group()
    return ratios if context.rank == 0 else None


def summarize_contention(ratios: dict[int, list[float]]) -> dict:
    """The scaling model's one contention factor: the median ratio over every size and round,
    at least 1 (a ratio under 1 is noise: compute cannot speed a collective up); its spread as
    the quartiles of the ratios, and each size's median."""
    every = sorted(r for found in ratios.values() for r in found)
    quartiles = statistics.quantiles(every, n=4) if len(every) > 1 else [every[0]] * 3
    return {
        "contention": max(1.0, statistics.median(every)),
        "contention_quartiles": [quartiles[0], quartiles[2]],
        "contention_by_size": {
            str(size): statistics.median(found) for size, found in ratios.items()
        },
    }


def measure_contention(quick: bool = False) -> dict:
    """Contention between two local processes, started by the local launcher as ddp's are."""
    payload = {"sizes": CONTENTION_SIZES_BYTES, "rounds": 5 if quick else 15}
    ratios = LocalLauncher().run(contention_worker, payload, 2, Resources(cpus=1.0))[0]
    return summarize_contention(ratios)


def measure_link(quick: bool = False) -> dict:
    """`dlscale bench machine`'s link probe: what the `local-gloo` link is made of, and how much
    slower its all-reduce runs inside training."""
    sizes = QUICK_SIZES_BYTES if quick else SIZES_BYTES
    return fit_link(time_allreduce(sizes, repeats=5 if quick else 20)) | measure_contention(quick)


# ------------------------------------------------------------------- between two hosts


def probe_worker(context: WorkerContext, payload: dict) -> dict | None:
    """One end of a link between two hosts (a launcher's worker): gloo all-reduces and
    point-to-point round trips of each size, timed on rank 0, then the all-reduce's
    contention with compute."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{context.master_addr}:{context.master_port}",
        rank=context.rank,
        world_size=2,
        timeout=timedelta(seconds=payload["timeout_s"]),
    )
    found: dict[str, dict] = {"allreduce": {}, "p2p": {}}
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
        found["contention"] = time_contention(CONTENTION_SIZES_BYTES, payload["repeats"])
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
        "allreduce": fit_link(found["allreduce"]) | summarize_contention(found["contention"]),
        "p2p": fit_p2p(found["p2p"]),
        "quick": quick,
    }
