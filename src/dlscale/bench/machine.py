"""`bench machine`: this machine's matmul FLOP/s, memory bandwidth, host link and per-op cost.

The result becomes the `local` Hardware entry, so predictions for "this machine" use measured,
achievable figures rather than a datasheet's peaks.
"""

from __future__ import annotations

import glob
import os
import platform
import time
from collections.abc import Iterable
from datetime import UTC, datetime

import torch

from dlscale.bench import plausible
from dlscale.bench.loop_cost import measure_ddp_cost, measure_loop_cost
from dlscale.bench.matmul import (
    DEFAULT_SIZES,
    cold_shape_grid,
    matmul_sweep,
    median_time_s,
    shape_grid,
)
from dlscale.bench.plausible import summarize_spread
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.hardware.device import Hardware, held_cache_bytes
from dlscale.hardware.trust import unreliable
from dlscale.profiler.calibrate import (
    attention_rates,
    conv_rates,
    op_efficiencies,
    optimizer_efficiencies,
    spread_log,
    start_spread_log,
    training_op_overhead_s,
)
from dlscale.train.allocator import keep_freed_memory
from dlscale.train.env import cpu_model

SCHEMA = "dlscale.bench.machine/1"
MiB = 2**20
CPU_PRECISIONS = ("fp64", "fp32", "bf16")
GPU_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # fp32 is IEEE fp32: TF32 off
GPU_SIZES = (*DEFAULT_SIZES, 4096, 8192)  # tensor cores reach their peak only on large products
QUICK_SIZES = (64, 256, 1024)
QUICK_GPU_SIZES = (256, 1024, 4096)
# Streamed tensors must dwarf the last-level cache (STREAM's rule: ≥ 4×), or the cache is timed.
BANDWIDTH_FLOOR_BYTES = {False: 256 * MiB, True: 64 * MiB}  # by `quick`
HOST_LINK_BYTES = {False: 256 * MiB, True: 64 * MiB}
MIN_RUN_TIME_S = {False: 0.5, True: 0.1}
CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon"}


# ------------------------------------------------------------------------ machine facts


def bench_device(name: str = "auto") -> torch.device:
    """`auto` measures the CUDA GPU when one is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device string torch knows (tpu, gpu:0)
        raise UserError(f"bench machine measures cpu or cuda devices, not '{name}'") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"bench machine measures cpu or cuda devices, not '{name}'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{name}' asked for, but no CUDA GPU is visible here")
    return device


def cpu_vendor() -> str:
    """Intel, AMD, ... from /proc/cpuinfo's vendor_id; else the architecture (arm64, x86_64)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    vendor = line.split(":", 1)[1].strip()
                    return CPU_VENDORS.get(vendor, vendor)
    except OSError:
        pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "Apple"
    return platform.machine() or "unknown"


def parse_cache_size(text: str) -> int:
    """sysfs cache sizes: '48K', '1024K', '32M', or plain bytes."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": MiB, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def data_caches(folder: str = "/sys/devices/system/cpu/cpu0") -> list[tuple[str, int]]:
    """The CPU's data caches, innermost first, as sysfs states them: [("L1", bytes), ("L2",
    bytes), ...] (instruction caches left out; empty where sysfs has no cache entries)."""
    found = []
    for level, index in _data_cache_folders(folder):
        try:
            with open(f"{index}/size") as handle:
                found.append((f"L{level}", parse_cache_size(handle.read())))
        except (OSError, ValueError):
            continue
    return found


def _data_cache_folders(folder: str) -> list[tuple[int, str]]:
    """(level, sysfs folder) of each data or unified cache of one CPU's sysfs `folder`,
    innermost first; instruction caches and unreadable entries left out."""
    found = []
    for index in glob.glob(f"{folder}/cache/index*"):
        try:
            with open(f"{index}/type") as handle:
                if handle.read().strip() == "Instruction":
                    continue
            with open(f"{index}/level") as handle:
                found.append((int(handle.read()), index))
        except (OSError, ValueError):
            continue
    return sorted(found)


def last_level_cache_bytes(device: torch.device | None = None) -> int | None:
    """The largest data cache: the GPU's L2, or the CPU's highest-level cache from sysfs."""
    if device is not None and device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or None
    caches = data_caches()
    if caches:
        return caches[-1][1]
    try:  # glibc knows it on Linux systems without sysfs cache entries
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or None
    except (ValueError, OSError, AttributeError):
        return None


def total_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_vendor(device: torch.device) -> str:
    if device.type == "cuda":
        return "AMD" if torch.version.hip else "NVIDIA"  # ROCm builds expose AMD GPUs as cuda
    return cpu_vendor()


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


# ------------------------------------------------------------------------- measurements


def stream_bandwidth(device: torch.device, tensor_bytes: int, min_run_time_s: float) -> dict:
    """STREAM copy and triad (McCalpin) in bytes/s on float32 tensors of `tensor_bytes` each.

    copy `dst = src` moves 2 tensors (read + write); triad `a = b + s·c` moves 3. Like STREAM we
    count no write-allocate traffic, so a CPU's true traffic is higher and these figures are what
    a training kernel can count on.
    """
    n = tensor_bytes // 4
    a, b, c = (torch.full((n,), 1.0, device=device) for _ in range(3))  # touched: no page faults
    triad_s = median_time_s(
        "torch.add(b, c, alpha=3.0, out=a)", {"a": a, "b": b, "c": c}, min_run_time_s
    )
    return {
        "tensor_bytes": 4 * n,
        "copy_bytes_per_s": copy_bytes_per_s(a, b, min_run_time_s),
        "triad_bytes_per_s": 3 * 4 * n / triad_s,
    }


def copy_bytes_per_s(a: torch.Tensor, b: torch.Tensor, min_run_time_s: float) -> float:
    """STREAM copy `a = b` of two equal float32 tensors: both tensors' bytes (read + write) a
    second, no write-allocate traffic counted."""
    seconds = median_time_s("a.copy_(b)", {"a": a, "b": b}, min_run_time_s)
    return 2 * a.element_size() * a.numel() / seconds


# The last-level cache sysfs reports can be a whole host socket's, shared with every other
# tenant (the development machine's VM, 2026-11-29: two vCPUs of a Xeon whose 300 MiB L3 they
# report); what a step keeps there is what this process can. The copy rate by working set says
# where that ends: the largest working set, doubling from CACHE_PROBE_BYTES, then the reported
# cache itself, up to which every copy still runs 1.25 × the memory probe's rate or
# faster (on a machine of its own, a working set as large as the cache seldom does: about half of
# it held, and a step's state past that priced cold, its activations needing the rest). On
# that VM at one thread: 70–72 GB/s at 1 MiB, 22–27 GB/s from 4 to 64 MiB, 17–20 at 128 MiB
# (so 64 or 128 MiB held from run to run), 15–18 at 256 MiB, 15.2 from memory (read + write).
CACHE_PROBE_BYTES = MiB  # CACHE_SPEEDUP and the rule: hardware.device.held_cache_bytes


def cache_copy_rates(device: torch.device, cache: int, min_run_time_s: float) -> dict[int, float]:
    """Copy bytes/s (read + write) by working set (two tensors of half of it each), doubling
    from CACHE_PROBE_BYTES below `cache`, the reported last-level cache, and `cache` itself."""
    sizes = []
    while CACHE_PROBE_BYTES * 2 ** len(sizes) < cache:
        sizes.append(CACHE_PROBE_BYTES * 2 ** len(sizes))
    rates = {}
    for size in [*sizes, cache] if cache >= CACHE_PROBE_BYTES else []:
        a, b = (torch.full((size // 8,), 1.0, device=device) for _ in range(2))  # no faults
        rates[size] = copy_bytes_per_s(a, b, min_run_time_s)
    return rates


# glibc's malloc serves a request this large or larger with a fresh mmap whatever its dynamic
# threshold has grown to (DEFAULT_MMAP_THRESHOLD_MAX: 4 × 1024 × 1024 × sizeof(long) on a 64-bit
# host, glibc malloc/malloc.c) and returns it to the kernel when freed. torch's CPU allocator
# takes its memory from malloc, so such a tensor's pages fault in, zeroed, every step that makes
# it. On the 2-core development machine a new tensor's extra cost per byte was 0.003–0.017 ns
# from 1 to 24 MiB and 0.41–0.48 ns from 32 to 256 MiB.
FRESH_MAPPING_BYTES = 32 * 2**20
FIRST_TOUCH_BYTES = 64 * 2**20


def first_touch(device: torch.device, min_run_time_s: float) -> dict | None:
    """A new tensor's cost per byte beyond writing it, at FIRST_TOUCH_BYTES: `a + b` into a new
    tensor against the same sum into one already touched, with the allocator releasing freed
    memory (what a spec's `keep_freed_memory: false` trains with). CPU only (None on a GPU,
    whose caching allocator keeps its blocks)."""
    if device.type != "cpu":
        return None
    keep_freed_memory(False)
    n = FIRST_TOUCH_BYTES // 4
    a, b, out = (torch.full((n,), 1.0) for _ in range(3))
    fresh_s = median_time_s("a + b", {"a": a, "b": b}, min_run_time_s)
    reused_s = median_time_s(
        "torch.add(a, b, out=out)", {"a": a, "b": b, "out": out}, min_run_time_s
    )
    return {
        "threshold_bytes": FRESH_MAPPING_BYTES,
        "tensor_bytes": 4 * n,
        "s_per_byte": max(0.0, fresh_s - reused_s) / (4 * n),
    }


def host_link_bandwidth(device: torch.device, tensor_bytes: int, min_run_time_s: float) -> dict:
    """Host↔GPU copy bandwidth in bytes/s, from pinned (page-locked) and pageable host memory."""
    n = tensor_bytes // 4
    on_device = torch.full((n,), 1.0, device=device)
    result: dict[str, float | int] = {"tensor_bytes": 4 * n}
    for memory in ("pinned", "pageable"):
        host = torch.full((n,), 1.0, pin_memory=memory == "pinned")
        env = {"host": host, "dev": on_device, "nb": memory == "pinned"}
        h2d_s = median_time_s("dev.copy_(host, non_blocking=nb)", env, min_run_time_s)
        d2h_s = median_time_s("host.copy_(dev, non_blocking=nb)", env, min_run_time_s)
        result[f"{memory}_h2d_bytes_per_s"] = 4 * n / h2d_s
        result[f"{memory}_d2h_bytes_per_s"] = 4 * n / d2h_s
    return result


def op_overhead(device: torch.device, min_run_time_s: float) -> dict:
    """Seconds per tiny op: the fixed dispatch (and, on a GPU, launch) cost every op pays.

    On a GPU the Timer synchronises once per block of repeats, so this is the rate at which the
    host can issue kernels: what bounds a model made of many small layers.
    """
    x, y = torch.ones(1, device=device), torch.ones(1, device=device)
    m = torch.ones(8, 8, device=device)
    return {
        "add_s": median_time_s("torch.add(x, y)", {"x": x, "y": y}, min_run_time_s),
        "mm_s": median_time_s("torch.mm(m, m)", {"m": m}, min_run_time_s),
    }


def bandwidth_bytes_for(device: torch.device, quick: bool) -> int:
    """Per-tensor size: ≥ 4× the last-level cache, and the three tensors ≤ 1/4 of free memory."""
    cache = last_level_cache_bytes(device) or 0
    wanted = max(BANDWIDTH_FLOOR_BYTES[quick], 4 * cache)
    return min(wanted, available_memory_bytes(device) // 12)


def default_sizes(on_gpu: bool, quick: bool) -> tuple[int, ...]:
    if on_gpu:
        return QUICK_GPU_SIZES if quick else GPU_SIZES
    return QUICK_SIZES if quick else DEFAULT_SIZES


def matmul_table(sizes: list[int], device: torch.device, min_run_time_s: float) -> dict:
    """Every precision's sweep: rows, sizes skipped as too slow, and the best FLOP/s of each."""
    precisions = GPU_PRECISIONS if device.type == "cuda" else CPU_PRECISIONS
    rows: list[dict] = []
    skipped: dict[str, list[int]] = {}
    peak_flops: dict[str, float] = {}
    for precision in precisions:
        sweep, too_slow = matmul_sweep(sizes, precision, device, min_run_time_s)
        rows += sweep
        peak_flops[precision] = max(row["flops_per_s"] for row in sweep)
        if too_slow:
            skipped[precision] = too_slow
    return {"matmul": rows, "matmul_skipped_as_slow": skipped, "peak_flops": peak_flops}


def run_machine_bench(
    sizes: Iterable[int] | None = None,
    quick: bool = False,
    device: str = "auto",
    bandwidth_bytes: int | None = None,
    min_run_time_s: float | None = None,
) -> dict:
    """Measure one device: matmul FLOP/s per precision and size, bandwidth, host link, overhead.

    `sizes`, `bandwidth_bytes` and `min_run_time_s` override the defaults (tests shrink them).
    """
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    start_spread_log()
    dev = bench_device(device)
    on_gpu = dev.type == "cuda"
    if sizes is None:
        sizes = default_sizes(on_gpu, quick)
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 1:
        raise UserError("matrix sizes must be positive integers")
    run_time_s = MIN_RUN_TIME_S[quick] if min_run_time_s is None else min_run_time_s
    link_bytes = bandwidth_bytes or HOST_LINK_BYTES[quick]
    # Page faults first, with freed memory released; then everything else as dlscale's loop
    # trains on a CPU, keeping it (train/allocator.py).
    touch = first_touch(dev, run_time_s)
    if not on_gpu:
        keep_freed_memory()
    bandwidth = stream_bandwidth(
        dev, bandwidth_bytes or bandwidth_bytes_for(dev, quick), run_time_s
    )
    best_bandwidth = max(bandwidth["copy_bytes_per_s"], bandwidth["triad_bytes_per_s"])
    cache = last_level_cache_bytes(dev)
    cache_rates = cache_copy_rates(dev, cache, run_time_s) if cache and not on_gpu else {}
    training_overhead_s = training_op_overhead_s(dev, run_time_s)
    optimizer = optimizer_efficiencies(dev, best_bandwidth, training_overhead_s, run_time_s)
    result = {
        "schema": SCHEMA,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": str(dev),
        "kind": "gpu" if on_gpu else "cpu",
        "name": device_name(dev),
        "vendor": device_vendor(dev),
        "memory_bytes": total_memory_bytes(dev),
        "last_level_cache_bytes": cache,
        # What of it this process can hold: where the copy rate falls to memory's (CPU only).
        "cache_copy_bytes_per_s": [[size, rate] for size, rate in cache_rates.items()] or None,
        "effective_cache_bytes": (
            held_cache_bytes(cache_rates, bandwidth["copy_bytes_per_s"]) if cache_rates else None
        ),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": quick,
        **matmul_table(sizes, dev, run_time_s),
        # fp32 products by shape (M, K, N): a step's skinny products priced by their own shape.
        "matmul_shape_flops_per_s": shape_grid(dev, run_time_s),
        # The same products with their operands evicted from the caches: what a step whose state
        # passes the last-level cache pays (CPU only; None where the cache size is unknown).
        "matmul_shape_cold_flops_per_s": cold_grid(dev, quick),
        "bandwidth": bandwidth,
        # A new tensor above the allocator's threshold: fresh pages, faulted in (CPU only).
        "first_touch": touch,
        "host_link": host_link_bandwidth(dev, link_bytes, run_time_s) if on_gpu else None,
        "op_overhead_s": op_overhead(dev, run_time_s),
        "training_op_overhead_s": training_overhead_s,
        # dlscale's own loop per step, beyond the model's ops (sampler, timers, loss read-back);
        # on a CPU also what DDP adds to a step, as the ddp strategy trains there (gloo).
        "loop": measure_loop_cost(dev, run_time_s)
        | ({} if on_gpu else measure_ddp_cost(run_time_s)),
        # Efficiencies of real training ops, for the roofline: convolutions by size, and the
        # share of stream bandwidth each common memory-bound op reaches.
        "conv_flops_per_s": conv_rates(dev, training_overhead_s, run_time_s),
        "attention_flops_per_s": attention_rates(dev, training_overhead_s, run_time_s),
        "op_efficiency": {
            **op_efficiencies(dev, best_bandwidth, training_overhead_s, run_time_s),
            **optimizer["op_efficiency"],
        },
        # The optimizer's update inside a training step, by one tensor's working set.
        "optimizer_efficiency": optimizer["optimizer_efficiency"],
        # Between two processes of this machine (gloo): what `dlscale scale` all-reduces over.
        "link": _link_probe(quick),
        "elapsed_s": time.perf_counter() - t_start,
    }
    # How far to trust it: each probe's spread, what was rejected, how busy the machine was.
    result["spread"] = summarize_spread(spread_log())
    result["load"] = {
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
        "cores": os.cpu_count() or 1,
    }
    result["warnings"] = plausible.check(result)
    # Never the entry predictions use unless forced: `bench machine` reads this before saving.
    result["unreliable"] = unreliable(result)
    return result


COLD_CALLS = {False: 5, True: 3}  # by `quick`: calls a shape, in each pass


def cold_grid(device: torch.device, quick: bool) -> list[list[float]] | None:
    """The product grid timed cold (bench.matmul.cold_shape_grid), each call after a write of
    twice the last-level cache for each last-level cache this process's threads write through
    (a CPU of several core complexes or sockets has one each); on a CPU whose cache size is
    known."""
    cache = last_level_cache_bytes(device)
    if device.type != "cpu" or not cache:
        return None
    return cold_shape_grid(device, 2 * cache * last_level_caches(), COLD_CALLS[quick])


def last_level_caches(root: str = "/sys/devices/system/cpu") -> int:
    """How many distinct last-level caches serve the CPUs this process may run on: the sets of
    CPUs sharing cpu N's highest-level data cache (sysfs `shared_cpu_list`), counted once each;
    1 where sysfs does not say."""
    shared = set()
    for cpu in sorted(os.sched_getaffinity(0)):
        caches = _data_cache_folders(f"{root}/cpu{cpu}")
        if not caches:
            continue
        try:
            with open(f"{caches[-1][1]}/shared_cpu_list") as handle:
                shared.add(handle.read().strip())
        except OSError:
            continue
    return max(1, len(shared))


def _link_probe(quick: bool) -> dict:
    from dlscale.bench.link import SAVED_KEYS, measure_link

    link = measure_link(quick)
    return {key: link[key] for key in SAVED_KEYS}


def machine_hardware(result: dict) -> Hardware:
    """The `local` Hardware entry: measured peaks, so both efficiencies are 1.0 by definition."""
    bandwidth = result["bandwidth"]
    link = result["host_link"]
    return Hardware(
        name="local",
        display_name=f"this machine: {result['name']}",
        kind=result["kind"],
        vendor=result["vendor"],
        peak_flops=dict(result["peak_flops"]),
        memory_bytes=int(result["memory_bytes"]),
        memory_bandwidth_bytes_per_s=max(
            bandwidth["copy_bytes_per_s"], bandwidth["triad_bytes_per_s"]
        ),
        host_link="measured (pinned host→device copies)" if link else None,
        host_link_bytes_per_s=link["pinned_h2d_bytes_per_s"] if link else None,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        # What an op costs inside a training step (autograd and optimizer included), not the
        # bare dispatch of one `torch.add`: that is what the roofline's overhead term models.
        op_overhead_s=result["training_op_overhead_s"],
        sources=(f"measured by dlscale bench machine on {result['measured_at'][:10]}",),
        notes=f"{result['device']}, torch {result['torch_version']}, {result['threads']} threads"
        + ("; an UNRELIABLE measurement, saved with --force" if result.get("unreliable") else ""),
        measured=measured_tables(result),
    )


def measured_tables(result: dict) -> dict:
    """The raw figures kept with the `local` entry, minus None (catalogue TOML has no null)."""
    flops_by_size: dict[str, dict[str, float]] = {}
    for row in result["matmul"]:
        flops_by_size.setdefault(row["precision"], {})[str(row["size"])] = row["flops_per_s"]
    bandwidth = result["bandwidth"]
    tables = {
        "device": result["device"],
        "measured_at": result["measured_at"],
        "torch_version": result["torch_version"],
        "threads": result["threads"],
        "quick": result["quick"],
        "matmul_flops_per_s": flops_by_size,
        "matmul_shape_flops_per_s": result.get("matmul_shape_flops_per_s"),
        "matmul_shape_cold_flops_per_s": result.get("matmul_shape_cold_flops_per_s"),
        "bandwidth_tensor_bytes": bandwidth["tensor_bytes"],
        "copy_bytes_per_s": bandwidth["copy_bytes_per_s"],
        "triad_bytes_per_s": bandwidth["triad_bytes_per_s"],
        "first_touch": result.get("first_touch"),
        "host_link": result["host_link"],
        "op_overhead_s": dict(result["op_overhead_s"]),
        "training_op_overhead_s": result["training_op_overhead_s"],
        # Hardware.overhead_per_step_s reads it; a result from before it was measured has none.
        "loop_step_s": (result.get("loop") or {}).get("loop_step_s"),
        "loop": result.get("loop"),
        "conv_flops_per_s": result["conv_flops_per_s"],
        "attention_flops_per_s": result.get("attention_flops_per_s"),
        "op_efficiency": result["op_efficiency"],
        "optimizer_efficiency": result.get("optimizer_efficiency"),
        "last_level_cache_bytes": result["last_level_cache_bytes"],
        # Hardware.cache_held_bytes derives what the process holds from these and the copy rate.
        "cache_copy_bytes_per_s": result.get("cache_copy_bytes_per_s"),
        "link": result.get("link"),
        "spread": result.get("spread"),
        "rejected": result.get("rejected") or None,
        "suspect": result.get("suspect") or None,
        "load": result.get("load"),
        "unreliable": result.get("unreliable") or None,  # saved anyway, with --force
    }
    return {key: value for key, value in tables.items() if value is not None}
