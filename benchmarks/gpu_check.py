"""`make gpu-check`: every strategy on CUDA at fp32, bf16 and fp16 for a few steps, NCCL ddp,
pinned-memory loading and the host↔device copy, in one table (and --out DIR/gpu_check.json).

On a machine without a visible GPU it says so and exits 2: the GPU figures stay unmeasured.

    .venv/bin/python benchmarks/gpu_check.py [--steps 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from dlscale import api
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec

PRECISIONS = ("fp32", "bf16", "fp16")


def cases(gpus: int) -> list[tuple[str, dict, dict]]:
    """(label, strategy, extra spec fields): what fits here (NCCL wants a GPU per process)."""
    found = [
        ("single", {"name": "single"}, {}),
        (f"ddp ×{gpus} (NCCL)", {"name": "ddp", "workers": gpus}, {}),
        ("ps async, 2 workers", {"name": "ps", "mode": "async", "workers": 2}, {}),
        (
            f"pipeline ×{min(2, gpus)}",
            {"name": "pipeline", "stages": min(2, gpus), "microbatches": 2},
            {},
        ),
        (
            f"hybrid {min(2, gpus)}×1",
            {"name": "hybrid", "stages": 1, "data_parallel": min(2, gpus), "microbatches": 2},
            {},
        ),
        (f"tensor ×{min(2, gpus)} (NCCL)", {"name": "tensor", "degree": min(2, gpus)}, {}),
    ]
    runs = [
        (f"{label}", strategy, {**extra, "precision": p})
        for p in PRECISIONS
        for label, strategy, extra in found
        if not (strategy["name"] == "tensor" and p == "fp16")
    ]  # tensor parallel refuses fp16
    pinned = {"loader": {"workers": 2, "pin_memory": True}, "precision": "fp32"}
    return [*runs, ("single, pinned, 2 loader workers", {"name": "single"}, pinned)]


def copy_bandwidth(megabytes: int = 256) -> dict[str, float]:
    """Host→device and device→host GB/s, pageable and pinned (median of 5 copies)."""
    host = torch.randn(megabytes * 2**20 // 4)
    results = {}
    for pinned in (False, True):
        source = host.pin_memory() if pinned else host
        device = torch.empty_like(source, device="cuda")
        for direction in ("h2d", "d2h"):
            times = []
            for _ in range(5):
                torch.cuda.synchronize()
                start = time.perf_counter()
                if direction == "h2d":
                    device.copy_(source, non_blocking=pinned)
                else:
                    source.copy_(device, non_blocking=pinned)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            key = f"{direction}_{'pinned' if pinned else 'pageable'}_gb_per_s"
            results[key] = source.numel() * 4 / sorted(times)[2] / 1e9
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    console = Console(highlight=False)
    if not torch.cuda.is_available():
        console.print("gpu-check: no CUDA GPU is visible here; nothing was measured")
        return 2
    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    base = {
        "name": "gpu-check",
        "model": {"name": "lenet"},
        "data": {"name": "digits", "image_size": 28},
        "batch_size": 64,
        "steps": args.steps,
        "optimizer": {"name": "sgd", "lr": 0.05},
        "device": "cuda",
    }
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as scratch:
        for index, (label, strategy, extra) in enumerate(cases(gpus)):
            spec = parse_spec({**base, **extra, "strategy": strategy})
            row = {"case": label, "precision": spec.precision}
            try:
                record = api.train(spec, out_dir=Path(scratch) / f"run-{index}")
                final = record.final
                row.update(
                    status="ok",
                    loss=record.epochs[-1].train_loss,
                    samples_per_s=final.train_samples_per_s,
                    median_step_ms=(final.median_step_s or 0) * 1e3,
                    peak_memory_mib=final.peak_memory_bytes / 2**20,
                    backend=(record.distributed or record.tensor or {}).get("backend"),
                )
            except (UserError, RuntimeError) as exc:
                failed += 1
                row.update(status=f"FAILED: {str(exc).splitlines()[0][:80]}")
            rows.append(row)
            console.print(f"{label} {spec.precision}: {row['status']}")
    bandwidth = copy_bandwidth()
    table = Table(title=f"gpu-check on {gpus} × {name} (torch {torch.__version__})")
    for column in (
        "case",
        "precision",
        "status",
        "loss",
        "samples/s",
        "median step",
        "peak memory",
    ):
        table.add_column(column, justify="left" if column in ("case", "status") else "right")
    for row in rows:
        ok = row["status"] == "ok"
        table.add_row(
            row["case"],
            row["precision"],
            row["status"],
            f"{row['loss']:.4f}" if ok else "-",
            f"{row['samples_per_s']:,.0f}" if ok else "-",
            f"{row['median_step_ms']:.2f} ms" if ok else "-",
            f"{row['peak_memory_mib']:,.0f} MiB" if ok else "-",
        )
    console.print(table)
    console.print(
        ", ".join(f"{k.replace('_gb_per_s', '')} {v:.1f} GB/s" for k, v in bandwidth.items())
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"gpus": gpus, "name": name, "rows": rows, "copy": bandwidth}
        (args.out / "gpu_check.json").write_text(json.dumps(payload, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
