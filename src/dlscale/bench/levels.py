"""`dlscale bench levels SPEC`: the levels of parallelism on one CPU, each measured on the
spec's own model: vectorisation (SIMD), threads, processes.

1. SIMD: training steps with one thread, with the CPU kernels limited to each instruction set
   the CPU has. PyTorch's own kernels follow ATEN_CPU_CAPABILITY (default = x86-64's SSE
   baseline, then avx2, avx512); the matrix libraries under it have their own switches, set to
   match (oneDNN: ONEDNN_MAX_CPU_ISA; MKL: MKL_ENABLE_INSTRUCTIONS). Each level is a fresh
   process, since a library picks its kernels when it loads. True scalar code cannot be asked
   for: the baseline already has 128-bit SSE.
2. Threads: the best SIMD level with 1, 2, ... N intra-op threads (OpenMP), one process.
3. Processes: ddp with 1, 2, ... N workers of one thread each, gloo between them (message
   passing), the spec's batch per worker.

Printed per level: samples per second and the speed-up over the level below; and the machine
that bounds them: cores, NUMA nodes and caches read from /sys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dlscale.bench.io_verdict import NOISY_SPREAD, relative_spread
from dlscale.bench.memory import load_averages
from dlscale.errors import UserError
from dlscale.train.metrics import WARMUP_STEPS

SCHEMA = "dlscale.bench.levels/1"
# ATen's capability -> oneDNN's and MKL's closest ceilings.
SIMD = {
    "default": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
}


def machine_facts() -> dict:
    """Cores, NUMA nodes and cache sizes, as /sys states them."""
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    caches = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            caches[f"L{level} {kind.lower()}"] = (index / "size").read_text().strip()
        except OSError:
            continue
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "numa_nodes": len(nodes) or 1, "caches": caches}


def available_simd() -> list[str]:
    import torch

    best = torch.backends.cpu.get_cpu_capability().lower()
    order = list(SIMD)
    return order[: order.index(best) + 1] if best in order else ["default"]


def _steps_in_a_process(spec_path: str, steps: int, threads: int, env: dict) -> dict:
    """`measure_here`'s figures for `steps` single-process steps in a fresh interpreter."""
    code = (
        "import json, sys, tempfile, torch\n"
        "from pathlib import Path\n"
        "from dlscale.bench.levels import measure_here\n"
        f"print(json.dumps(measure_here({spec_path!r}, {steps}, {threads})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise UserError(f"bench levels: a measuring process failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_here(spec_path: str, steps: int, threads: int) -> dict:
    """In this process: samples/s of the spec on one process with `threads` threads (at its
    median step, after warm-up), and how far its steps spread (`measured`)."""
    import torch

    from dlscale.jobspec import SingleStrategy, load_spec
    from dlscale.profiler.estimate import measure_steps
    from dlscale.train.loop import Trainer

    torch.set_num_threads(threads)
    spec = load_spec(spec_path).model_copy(
        update={"strategy": SingleStrategy(), "threads": threads}
    )
    with tempfile.TemporaryDirectory() as scratch:
        times = sorted(measure_steps(Trainer(spec, Path(scratch)), warmup=3, steps=steps))
    return measured(spec.batch_size / times[len(times) // 2], times)


def measured(samples_per_s: float, step_times: list[float]) -> dict:
    """A setting's rate beside its steps' spread (90th over 10th percentile, less 1) and
    whether that is noisy: the speed-ups between settings are not to be read then."""
    spread = relative_spread(step_times)
    return {"samples_per_s": samples_per_s, "step_spread": spread, "noisy": spread > NOISY_SPREAD}


def run_levels_bench(spec_path: str | Path, steps: int, max_threads: int | None, train) -> dict:
    """`train(spec, out_dir=...)` runs the ddp level and returns its `RunRecord` (the api's
    verb: a bench does not start strategies itself)."""
    from dlscale.jobspec import DdpStrategy, load_spec

    if steps < 3:
        raise UserError(f"--steps: at least 3 timed steps (got {steps})")
    facts = machine_facts()
    top = facts["cores"] if max_threads is None else max_threads  # 0 is no count: refused
    if top < 1:
        raise UserError(f"--max-threads must be at least 1 (got {top})")
    # Each count is a measurement (and the ddp level starts that many processes): past the
    # cores they only take turns, and 1000 of them ran for about 50 minutes.
    if top > facts["cores"]:
        raise UserError(
            f"--max-threads {top} is more than the {facts['cores']} cores here: threads and "
            f"processes past the cores only take turns; give at most {facts['cores']}"
        )
    spec_path = str(spec_path)
    spec = load_spec(spec_path)
    load = load_averages()  # before this bench's own processes add to it
    simd = []
    for level in available_simd():
        env = {"ATEN_CPU_CAPABILITY": level, **SIMD[level], "OMP_NUM_THREADS": "1"}
        simd.append({"level": level, **_steps_in_a_process(spec_path, steps, 1, env)})
    best = max(simd, key=lambda row: row["samples_per_s"])["level"]
    threads = []
    for count in range(1, top + 1):
        env = {"ATEN_CPU_CAPABILITY": best, **SIMD[best], "OMP_NUM_THREADS": str(count)}
        threads.append({"threads": count, **_steps_in_a_process(spec_path, steps, count, env)})
    processes = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in range(1, top + 1):
            scaled = spec.model_copy(
                update={
                    "strategy": DdpStrategy(name="ddp", workers=count),
                    "threads": 1,
                    "steps": steps + 3,
                    "epochs": None,
                }
            )
            record = train(scaled, out_dir=Path(scratch) / f"ddp-{count}")
            times = [step.step_s for step in record.steps if step.step > WARMUP_STEPS]
            rate = record.final.train_samples_per_s
            processes.append({"processes": count, **measured(rate, times)})
    return {
        "schema": SCHEMA,
        "spec": spec_path,
        "model": spec.model.name,
        "batch_size": spec.batch_size,
        "machine": facts,
        "load_1m": load[0] if load else None,
        "simd": _speedups(simd),
        "threads": _speedups(threads),
        "processes": _speedups(processes),
    }


def _speedups(rows: list[dict]) -> list[dict]:
    base = rows[0]["samples_per_s"] if rows else 0
    for row in rows:
        row["speedup"] = row["samples_per_s"] / base if base else 0.0
    return rows
