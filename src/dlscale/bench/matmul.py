"""Matrix-product timing: torch's Timer, FLOP/s of square products, where a GPU starts to win."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch.utils.benchmark import Timer

from dlscale.errors import UserError, one_line

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


def first_gpu_win(rows: list[dict], key: str) -> int | None:
    """The smallest size at which the GPU time under `key` beats the CPU's, if any."""
    for row in rows:
        if row[key] is not None and row[key] < row["cpu_time_s"]:
            return row["size"]
    return None


def run_matmul_bench(
    sizes: Iterable[int] | None = None, precision: str = "fp32", min_run_time_s: float = 0.2
) -> dict:
    """CPU vs GPU (when one is visible) time and FLOP/s of square products across sizes."""
    check_precision(precision)
    has_gpu = torch.cuda.is_available()
    if sizes is None:
        sizes = DEFAULT_SIZES + (GPU_EXTRA_SIZES if has_gpu else ())
    sizes = sorted(set(sizes))
    if not sizes or min(sizes) < 1:
        raise UserError("matrix sizes must be positive integers")
    gpu = torch.device("cuda") if has_gpu else None
    rows = []
    for n in sizes:
        cpu_s = time_matmul_s(n, precision, torch.device("cpu"), min_run_time_s)
        row = {
            "size": n,
            "flops": matmul_flops(n),
            "cpu_time_s": cpu_s,
            "cpu_flops_per_s": matmul_flops(n) / cpu_s,
            "gpu_time_s": None,
            "gpu_flops_per_s": None,
            "gpu_with_transfer_s": None,
            "gpu_with_transfer_flops_per_s": None,
        }
        if gpu is not None:
            gpu_s = time_matmul_s(n, precision, gpu, min_run_time_s)
            moved_s = time_matmul_s(n, precision, gpu, min_run_time_s, with_transfer=True)
            row.update(
                gpu_time_s=gpu_s,
                gpu_flops_per_s=matmul_flops(n) / gpu_s,
                gpu_with_transfer_s=moved_s,
                gpu_with_transfer_flops_per_s=matmul_flops(n) / moved_s,
            )
        rows.append(row)
    return {
        "schema": SCHEMA,
        "precision": precision,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu_available": has_gpu,
        "gpu": torch.cuda.get_device_name(gpu) if gpu is not None else None,
        "note": None if has_gpu else "no CUDA GPU visible here: CPU only",
        "rows": rows,
        "gpu_wins_from_size": first_gpu_win(rows, "gpu_time_s") if has_gpu else None,
        "gpu_wins_with_transfer_from_size": first_gpu_win(rows, "gpu_with_transfer_s")
        if has_gpu
        else None,
    }
