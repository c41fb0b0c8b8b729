"""Matrix-product timing: torch's Timer, FLOP/s of square and skinny products, GPU vs CPU."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterable, Iterator

import torch
from torch.utils.benchmark import Timer

from dlscale.bench.memory import over_share
from dlscale.errors import UserError, one_line
from dlscale.free_memory import available_memory_bytes

SCHEMA = "dlscale.bench.matmul/1"
DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,  # fp32 storage, products on TF32 tensor cores (GPU only)
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
DEFAULT_SIZES = (64, 128, 256, 512, 1024, 2048)
GPU_EXTRA_SIZES = (4096,)
# A sweep stops growing once one product takes this long: a slow precision (bf16 on a CPU without
# bf16 instructions is ~10× slower than fp32) must not eat the whole time budget.
MAX_PRODUCT_S = 0.5
MAX_CPU_PRODUCT_S = 2.0  # the CPU-vs-GPU bench: past this the GPU has won by a wide margin
# Each of M, K and N of the products timed by shape: a training step's products are skinny
# (batch × 9216 × 4096 in an image model's classifier, its weight's gradient 4096 × batch ×
# 9216; tokens × d × 4d in a transformer), so every combination of the sides is timed, the
# squares among them, but for those above SHAPE_MOST_MACS (the 2048³ square: 17 GFLOP, a
# second or more on a CPU core), which clamp to their neighbours. 8,192 is a language model's
# vocabulary: its LM head's N and its weight gradient's M. Clamped to 2,048, GPT-2's head at batch
# 1 (64 × 256 × 8,192) was priced at 87 GFLOP/s on the 2-core development machine and ran at 58
# (its 8 MiB weight leaves the L2); the cap keeps every product with a side of 8,192 skinny.
SHAPE_SIDES = (4, 32, 256, 2048, 8192)
SHAPE_MOST_MACS = 256 * 2048 * 2048
SHAPE_PASSES = 3  # the grid is timed this many times over, interleaved; the median counts


def matmul_memory_bytes(n: int, precision: str) -> int:
    """Bytes one (n, n) @ (n, n) holds at once: both operands and the result in the precision's
    storage type, plus the fp32 draw an operand is converted from (none for fp32 storage)."""
    dtype = DTYPES[precision]
    draw_bytes = 0 if dtype == torch.float32 else 4
    return n * n * (3 * dtype.itemsize + draw_bytes)


def memory_skips(sizes: list[int], precision: str, gpu: torch.device | None) -> dict[int, str]:
    """Sizes whose product would not fit in the share of free memory, with the reason: on the
    host (the CPU product, and the operands a GPU product with copies starts from), and on
    the GPU. Refused in one line when none fits."""
    free = {"the host": available_memory_bytes(torch.device("cpu"))}
    if gpu is not None:
        free[torch.cuda.get_device_name(gpu)] = available_memory_bytes(gpu)
    skips = {}
    for n in sizes:
        need = matmul_memory_bytes(n, precision)
        reasons = [r for where, b in free.items() if (r := over_share(need, b, where))]
        if reasons:
            skips[n] = reasons[0]
    if len(skips) == len(sizes):
        n = sizes[0]
        raise UserError(f"--sizes: no size fits in memory: n = {n} {skips[n]}")
    return skips


def median_time_s(stmt: str, env: dict, min_run_time_s: float) -> float:
    """Median seconds per run of `stmt`, by torch.utils.benchmark.Timer.

    Timer warms up, then runs blocks of repeats until `min_run_time_s` is spent, synchronising an
    accelerator around each block, so queued kernels are timed and not just their launch. It is
    given all of torch's threads (its own default is one).
    """
    timer = Timer(stmt, globals={"torch": torch, **env}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time_s).median


def matmul_flops(n: int) -> int:
    """FLOPs of (n, n) @ (n, n): n² outputs, each n multiplies and n - 1 adds, counted as 2·n³."""
    return 2 * n**3


def check_precision(precision: str) -> None:
    if precision not in DTYPES:
        raise UserError(f"unknown precision '{precision}' (choose from: {', '.join(DTYPES)})")


@contextlib.contextmanager
def float32_products(precision: str, device: torch.device) -> Iterator[None]:
    """fp32 products in IEEE fp32, or on TF32 tensor cores for 'tf32' on a GPU; then restored.

    CPUs have no TF32, so there 'tf32' is plain fp32 (the setting could otherwise let oneDNN use
    reduced-precision products).
    """
    previous = torch.get_float32_matmul_precision()
    tf32 = precision == "tf32" and device.type == "cuda"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def operands(n: int, precision: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random (n, n) matrices in the precision's storage type on `device`."""
    dtype = DTYPES[precision]
    return torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)


def time_matmul_s(
    n: int, precision: str, device: torch.device, min_run_time_s: float, with_transfer: bool = False
) -> float:
    """Median seconds of one (n, n) @ (n, n) product on `device`.

    `with_transfer`: the operands start in ordinary (pageable) host memory and the result comes
    back to it, as when a CPU program offloads one product to a GPU.
    """
    check_precision(precision)
    where = torch.device("cpu") if with_transfer else device
    a, b = operands(n, precision, where)
    if with_transfer:
        stmt, env = "torch.mm(a.to(dev), b.to(dev)).cpu()", {"a": a, "b": b, "dev": device}
    else:
        stmt, env = "torch.mm(a, b)", {"a": a, "b": b}
    try:
        with float32_products(precision, device):
            return median_time_s(stmt, env, min_run_time_s)
    except RuntimeError as exc:  # e.g. a dtype this device's kernels do not implement
        raise UserError(f"{precision} matmul failed on {device.type}: {one_line(exc)}") from None


def matmul_sweep(
    sizes: Iterable[int], precision: str, device: torch.device, min_run_time_s: float
) -> tuple[list[dict], list[int]]:
    """FLOP/s per size for one precision, smallest first; and the sizes skipped as too slow."""
    rows: list[dict] = []
    ordered = sorted(set(sizes))
    for index, n in enumerate(ordered):
        time_s = time_matmul_s(n, precision, device, min_run_time_s)
        flops = matmul_flops(n)
        rows.append(
            {"precision": precision, "size": n, "time_s": time_s, "flops_per_s": flops / time_s}
        )
        if time_s > MAX_PRODUCT_S:
            return rows, ordered[index + 1 :]
    return rows, []


def shape_grid(
    device: torch.device,
    min_run_time_s: float,
    sides: Iterable[int] = SHAPE_SIDES,
    most_macs: int = SHAPE_MOST_MACS,
) -> list[list[float]]:
    """fp32 FLOP/s of (M × K) · (K × N) products, every combination of `sides` for M, K and N up
    to `most_macs` multiply-accumulates: [M, K, N, FLOP/s] points, what Hardware.gemm_rate
    interpolates a product's shape on.

    Each product is timed once in each of SHAPE_PASSES passes over the whole grid, for a share
    of `min_run_time_s`, and the median pass counts: a burst of load on a shared machine then
    slows one pass of every shape instead of every pass of a few neighbouring shapes."""
    times: dict[tuple[int, int, int], list[float]] = {
        shape: [] for shape in grid_shapes(sides, most_macs)
    }
    with float32_products("fp32", device):
        for _ in range(SHAPE_PASSES):
            for m, k, n in times:
                env = {"a": torch.randn(m, k, device=device), "b": torch.randn(k, n, device=device)}
                run_s = min_run_time_s / SHAPE_PASSES
                times[m, k, n].append(median_time_s("torch.mm(a, b)", env, run_s))
    return grid_rates(times)


def grid_shapes(sides: Iterable[int], most_macs: int) -> list[tuple[int, int, int]]:
    """Every (M, K, N) of `sides` up to `most_macs` multiply-accumulates, in the grid's order."""
    sides = sorted(set(sides))
    return [(m, k, n) for m in sides for k in sides for n in sides if m * k * n <= most_macs]


def grid_rates(times: dict[tuple[int, int, int], list[float]]) -> list[list[float]]:
    """[M, K, N, FLOP/s] points from each shape's times a pass: its median pass counts."""
    return [
        [m, k, n, 2 * m * k * n / statistics.median(found)] for (m, k, n), found in times.items()
    ]


def cold_shape_grid(
    device: torch.device,
    flush_bytes: int,
    calls: int,
    sides: Iterable[int] = SHAPE_SIDES,
    most_macs: int = SHAPE_MOST_MACS,
) -> list[list[float]]:
    """fp32 FLOP/s of the same (M × K) · (K × N) products as shape_grid, each call timed after
    writing `flush_bytes` (twice the last-level cache in each of the machine's cache domains) so
    that its operands, its output and the code that runs it come from memory: [M, K, N,
    FLOP/s] points.

    A training step whose parameters, gradients and optimizer state pass the cache reads each
    weight back from memory: GPT-2 (d 256, 4 layers) at batch 1 on the 2-core development
    machine ran its nine largest products 2–51% slower inside the step than back-to-back calls
    of the same shapes, and within 11% of these (benchmarks/step_ops.py gpt2 1 --alone).
    Each shape is timed `calls` times in each of SHAPE_PASSES passes, the median call of a
    pass and the median pass counting (CPU only: no synchronisation around the call)."""
    flush = torch.zeros(max(1, flush_bytes // 4), device=device)
    times: dict[tuple[int, int, int], list[float]] = {
        shape: [] for shape in grid_shapes(sides, most_macs)
    }
    with float32_products("fp32", device):
        for _ in range(SHAPE_PASSES):
            for m, k, n in times:
                a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
                torch.mm(a, b)  # its output's block allocated once, as a step's is
                found = []
                for _ in range(max(1, calls)):
                    flush.add_(1.0)  # read and written: every line of it passes the caches
                    start = time.perf_counter()
                    torch.mm(a, b)
                    found.append(time.perf_counter() - start)
                times[m, k, n].append(statistics.median(found))
    return grid_rates(times)


def first_gpu_win(rows: list[dict], key: str) -> int | None:
    """The smallest size at which the GPU time under `key` beats the (measured) CPU time."""
    for row in rows:
        if row[key] is not None and row["cpu_time_s"] is not None and row[key] < row["cpu_time_s"]:
            return row["size"]
    return None


def cpu_vs_gpu_row(
    n: int, precision: str, gpu: torch.device | None, measure_cpu: bool, min_run_time_s: float
) -> dict:
    """One size: CPU time, GPU time, and GPU time with the copies there and back (s, FLOP/s)."""
    flops = matmul_flops(n)
    times: dict[str, float | None] = {"cpu": None, "gpu": None, "gpu_with_transfer": None}
    if measure_cpu:
        times["cpu"] = time_matmul_s(n, precision, torch.device("cpu"), min_run_time_s)
    if gpu is not None:
        times["gpu"] = time_matmul_s(n, precision, gpu, min_run_time_s)
        times["gpu_with_transfer"] = time_matmul_s(
            n, precision, gpu, min_run_time_s, with_transfer=True
        )
    row: dict = {"size": n, "flops": flops, "skipped": None}
    for name, time_s in times.items():
        row[f"{name}_time_s"] = time_s
        row[f"{name}_flops_per_s"] = flops / time_s if time_s else None
    return row


def skipped_row(n: int, reason: str) -> dict:
    """A size not timed because it would not fit in memory."""
    row: dict = {"size": n, "flops": matmul_flops(n), "skipped": reason}
    for name in ("cpu", "gpu", "gpu_with_transfer"):
        row[f"{name}_time_s"] = row[f"{name}_flops_per_s"] = None
    return row


def run_matmul_bench(
    sizes: Iterable[int] | None = None, precision: str = "fp32", min_run_time_s: float = 0.2
) -> dict:
    """CPU vs GPU (when one is visible) time and FLOP/s of square products across sizes.

    Once one CPU product takes over MAX_CPU_PRODUCT_S, larger sizes skip the CPU (fp16 runs at
    ~1 GFLOP/s on many CPUs: n = 4096 would take minutes a product).
    """
    check_precision(precision)
    has_gpu = torch.cuda.is_available()
    if sizes is None:
        sizes = DEFAULT_SIZES + (GPU_EXTRA_SIZES if has_gpu else ())
    sizes = sorted(set(sizes))
    if not sizes or min(sizes) < 1:
        raise UserError("matrix sizes must be positive integers")
    gpu = torch.device("cuda") if has_gpu else None
    skips = memory_skips(sizes, precision, gpu)
    rows: list[dict] = []
    cpu_skipped_from = None
    for n in sizes:
        if n in skips:
            rows.append(skipped_row(n, skips[n]))
            continue
        rows.append(cpu_vs_gpu_row(n, precision, gpu, cpu_skipped_from is None, min_run_time_s))
        cpu_s = rows[-1]["cpu_time_s"]
        if cpu_skipped_from is None and cpu_s is not None and cpu_s > MAX_CPU_PRODUCT_S:
            cpu_skipped_from = next((size for size in sizes if size > n), None)
    notes = [] if has_gpu else ["no CUDA GPU visible here: CPU only"]
    if cpu_skipped_from is not None:
        notes.append(
            f"CPU not timed from n = {cpu_skipped_from}: a smaller product took over "
            f"{MAX_CPU_PRODUCT_S:g} s"
        )
    notes += [f"n = {n} skipped: {reason}" for n, reason in skips.items()]
    return {
        "schema": SCHEMA,
        "precision": precision,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu_available": has_gpu,
        "gpu": torch.cuda.get_device_name(gpu) if gpu is not None else None,
        "note": "; ".join(notes) or None,
        "rows": rows,
        "gpu_wins_from_size": first_gpu_win(rows, "gpu_time_s"),
        "gpu_wins_with_transfer_from_size": first_gpu_win(rows, "gpu_with_transfer_time_s"),
    }
