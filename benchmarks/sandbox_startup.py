"""What the job sandbox costs at start, measured side by side in one run.

    .venv/bin/python benchmarks/sandbox_startup.py [--rounds 7]

For each command, the same process is started plainly and in the sandbox the service starts
jobs in (bubblewrap, a cgroup of its own with its slot's limits, an unprivileged uid), rounds
interleaved; the median and range of each, and the difference: the sandbox's start-up cost per
job. Then a spec's check (the validation job) started cold, and handed to a validator that has
already started and done its imports (what a submit waits for). Needs what `dlscale serve` needs:
root (or a delegated cgroup) and bubblewrap.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlscale.service import cgroups, sandbox
from dlscale.service.config import ServiceConfig
from dlscale.service.executor import Executor
from dlscale.service.layout import write_job

SPEC = """\
name: tiny
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: 1
device: cpu
seed: 3
"""


def plain(argv: list[str], folder: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=folder, check=True, capture_output=True)
    return time.perf_counter() - started


def sandboxed(argv: list[str], folder: Path, hierarchy, uid: int | None) -> float:
    group = cgroups.JobCgroup(hierarchy, "dlscale-bench-startup")
    group.create(cgroups.Limits(1, 4 << 30, 512))
    read_end, write_end = os.pipe()
    box = sandbox.Box(folder, writable=True, uid=uid)
    command = cgroups.enter_command(group.procs_files(), sandbox.command(box, argv, write_end))
    started = time.perf_counter()
    process = subprocess.Popen(command, pass_fds=(write_end,), stdout=subprocess.DEVNULL)
    os.close(write_end)
    os.read(read_end, 4096)  # bubblewrap's report of its pid: it must be read
    process.wait()
    elapsed = time.perf_counter() - started
    os.close(read_end)
    group.remove()
    assert process.returncode == 0, process.returncode
    return elapsed


def spread(values: list[float]) -> str:
    """Median (range) in milliseconds."""
    low, high = min(values) * 1e3, max(values) * 1e3
    return f"{statistics.median(values) * 1e3:8.1f} ms ({low:.1f}–{high:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    hierarchy = cgroups.detect()
    root = Path(tempfile.mkdtemp(prefix="dlscale-sandbox-bench-"))
    folder = root / "job"
    folder.mkdir()
    uid = ServiceConfig(data_dir=root).job_uid("0123456789abcdef")
    if uid is not None:
        os.chown(folder, uid, uid)
    print(f"uptime: {os.getloadavg()}; {os.cpu_count()} cores; {args.rounds} rounds, interleaved")
    commands = {
        "/bin/true": ["/bin/true"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    for name, argv in commands.items():
        times: dict[str, list[float]] = {"plain": [], "sandboxed": []}
        for _ in range(args.rounds):
            times["plain"].append(plain(argv, folder))
            times["sandboxed"].append(sandboxed(argv, folder, hierarchy, uid))
        cost = statistics.median(times["sandboxed"]) - statistics.median(times["plain"])
        print(
            f"{name:<28} plain {spread(times['plain'])}   sandboxed {spread(times['sandboxed'])}   "
            f"cost {cost * 1e3:+.1f} ms"
        )
    config = ServiceConfig(data_dir=root / "service", cpu_slots=2)
    job = write_job(
        root / "service" / "jobs" / "0123456789abcdef",
        {"id": "0123456789abcdef", "kind": "train", "spec_file": "spec.yaml"},
        SPEC,
    )
    limits = config.limits(1, 0, job.name, None)
    cold = Executor(config.sandboxes_dir, hierarchy, uid_of=config.job_uid)
    warm = Executor(config.sandboxes_dir, hierarchy, uid_of=config.job_uid, warm=limits)
    cold.prepare(job, limits.uid)
    checks: dict[str, list[float]] = {"cold": [], "warm": []}
    for _ in range(max(1, args.rounds // 2)):
        for kind, executor in (("cold", cold), ("warm", warm)):
            if kind == "warm":
                time.sleep(15)  # its replacement validator does its imports meanwhile
            started = time.perf_counter()
            verdict = executor.validate(job, limits, 120)
            checks[kind].append(time.perf_counter() - started)
            assert verdict.ok, verdict
    warm.close()
    print(f"{'a spec checked, cold':<28} {spread(checks['cold'])}")
    print(
        f"{'a spec checked, warm':<28} {spread(checks['warm'])}   "
        f"{statistics.median(checks['cold']) / statistics.median(checks['warm']):.1f}× faster"
    )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
