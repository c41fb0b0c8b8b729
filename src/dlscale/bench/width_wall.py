"""`bench width --memory-limit`: the memory wall, safely. Each width is timed in a fresh process
inside a memory-limited cgroup with bounded swap beyond it, so a working set larger than the
limit is paged to disk and the step time shows it, while the rest of the machine never notices.

The limit stands in for the machine's RAM: a small one (under a gigabyte) shows the wall with
widths that take seconds, not the hours a 24 GiB machine's own RAM would. The measuring process
itself (Python and torch, a few hundred MiB) is charged to the cgroup too, so the memory left to
the model is the limit less that baseline, which the smallest width measures.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from dlscale.bench.machine import last_level_cache_bytes
from dlscale.bench.memory import over_share
from dlscale.bench.memory_cgroup import (
    PREFIX,
    NoMemoryCgroup,
    limited,
    memory_hierarchy,
    remove_stale_cgroups,
)
from dlscale.bench.swap_file import NoSwap, bounded_swap
from dlscale.bench.width import (
    DEFAULT_DATASET_SIZE,
    DEFAULT_WIDTHS,
    check_options,
    header,
    memory_levels,
    run_width_bench,
    summary,
    time_train_step_s,
    width_row,
    with_step_time,
)
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.home import dlscale_home
from dlscale.units import binary_bytes

CHILD_TIMEOUT_S = 600  # one width in swap takes seconds a step; ten minutes means it thrashes
CHILD = (
    "import json, sys\n"
    "from dlscale.bench.width_wall import measure_here\n"
    "print(json.dumps(measure_here(json.loads(sys.argv[1]))))\n"
)


def measure_here(args: dict) -> dict:
    """In the child, inside its cgroup: what the cgroup holds before the model (the process's
    own baseline), then the median step."""
    torch.set_num_threads(args["threads"])
    baseline = int(Path(args["usage_file"]).read_text())
    step_s, spread = time_train_step_s(
        args["width"], args["batch_size"], torch.device("cpu"), args["min_run_time_s"]
    )
    return {"baseline_bytes": baseline, "step_time_s": step_s, "step_spread": spread}


def measure_in_cgroup(parent: Path, width: int, settings: dict, limit: int, swap: int) -> dict:
    """One width in a child process in a cgroup of its own: its result, or why it has none
    (`failed`), and what the cgroup saw (`memory`). The cgroup is removed however it ends."""
    name = f"{PREFIX}{os.getpid()}-{width}"
    with limited(parent, name, limit, swap) as (group, _):
        args = {
            "width": width,
            **settings,
            "usage_file": str(group.folder / "memory.usage_in_bytes"),
        }
        argv = group.command([sys.executable, "-c", CHILD, json.dumps(args)])
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            return {"failed": f"timed out after {CHILD_TIMEOUT_S} s", "memory": None}
        usage = group.usage()
    memory = usage.as_dict()
    if process.returncode == 0:
        return {**json.loads(out.strip().splitlines()[-1]), "memory": memory}
    if usage.oom_kills or process.returncode == -9:
        peak = binary_bytes(usage.peak_with_swap_bytes or usage.peak_bytes or 0)
        return {
            "failed": f"killed at the limit: memory and swap full (peak {peak})",
            "memory": memory,
        }
    last = (err.strip().splitlines() or [f"exit status {process.returncode}"])[-1]
    return {"failed": f"the measuring process failed: {last}", "memory": memory}


def run_wall_bench(
    widths: Iterable[int] | None,
    batch_size: int,
    limit_bytes: int,
    swap_bytes: int | None = None,
    swap_dir: Path | None = None,
    min_run_time_s: float = 0.3,
    dataset_size: int = DEFAULT_DATASET_SIZE,
    threads: int | None = None,
) -> dict:
    """The width bench with each width in a cgroup limited to `limit_bytes` of memory and
    `swap_bytes` (default twice the limit) of swap; where no such cgroup can be made, one line
    says why and the widths are measured in this process, within half the free memory."""
    widths = sorted(set(widths or DEFAULT_WIDTHS))
    check_options(widths, batch_size, dataset_size, threads)
    threads = threads or torch.get_num_threads()
    swap_bytes = 2 * limit_bytes if swap_bytes is None else swap_bytes
    if limit_bytes < 1 or swap_bytes < 0:
        raise UserError("--memory-limit must be positive and --swap not negative")
    cpu = torch.device("cpu")
    free_bytes = available_memory_bytes(cpu)
    reason = over_share(limit_bytes, free_bytes)
    if reason:
        raise UserError(f"--memory-limit {binary_bytes(limit_bytes)} {reason}: give less")
    try:
        parent = memory_hierarchy()
    except NoMemoryCgroup as why:
        result = run_width_bench(widths, batch_size, "cpu", min_run_time_s, dataset_size, threads)
        note = f"no memory-limited cgroup here ({why}): measured in this process, only widths "
        result["warnings"] = [note + "within half the free memory"]
        return result
    remove_stale_cgroups(parent)
    warnings: list[str] = []
    with contextlib.ExitStack() as stack:
        try:
            swap_file = stack.enter_context(bounded_swap(swap_bytes, swap_dir or dlscale_home()))
        except NoSwap as why:
            swap_file, swap_bytes = None, 0
            warnings.append(f"no swap ({why}): a width past the limit is killed, not slowed")
        settings = {"batch_size": batch_size, "min_run_time_s": min_run_time_s, "threads": threads}
        rows = measure_rows(parent, widths, settings, limit_bytes, swap_bytes)
    for row in rows:
        if row["step_time_s"] is not None:
            with_step_time(row, row["step_time_s"], row["step_spread"], dataset_size, batch_size)
    baseline = next((row["baseline_bytes"] for row in rows if row.get("baseline_bytes")), 0)
    ram_bytes = limit_bytes - baseline
    beyond = "swap" if swap_bytes else "over the limit"
    return {
        **header(cpu, batch_size, dataset_size, last_level_cache_bytes(cpu), rows, threads),
        "free_memory_bytes": free_bytes,
        "memory_limit_bytes": limit_bytes,
        "swap_bytes": swap_bytes,
        "swap_file": str(swap_file) if swap_file else None,
        "process_baseline_bytes": baseline,
        **summary(rows, memory_levels(cpu, ram_bytes), beyond),
        "warnings": warnings,
        "rows": rows,
    }


def measure_rows(
    parent: Path, widths: list[int], settings: dict, limit: int, swap: int
) -> list[dict]:
    """Each width in its own cgroup, smallest first; a width that would not fit the limit and
    the swap together, with the baseline measured so far, is skipped without starting it."""
    rows, baseline = [], 0
    for width in widths:
        row = width_row(width, settings["batch_size"])
        need = row["memory_estimate_bytes"] + baseline
        if need > limit + swap:
            row["skipped"] = (
                f"needs ~{binary_bytes(need)} with the process, over the "
                f"{binary_bytes(limit)} limit + {binary_bytes(swap)} swap"
            )
        else:
            measured = measure_in_cgroup(parent, width, settings, limit, swap)
            row["memory"] = measured.pop("memory", None)
            row["skipped"] = measured.pop("failed", None)
            row.update(measured)
            baseline = max(baseline, row.get("baseline_bytes") or 0)
        rows.append(row)
    return rows
