"""dlscale `ddp` (2 local workers) vs a plain torchrun DDP script: throughput ratio, and start-up.

Both train LeNet on the same seeded synthetic data (40,000 samples), 32 samples per worker per
step, within one epoch, Adam, gloo,
one thread per worker on this 2-core machine (torchrun's default; dlscale gives each worker
cores / workers). Throughput is samples trained by all workers / wall time of the training loop
(evaluation and checkpoints excluded on dlscale's side; the plain script has none). Runs
alternate (dlscale, torchrun, torchrun, dlscale, ...); the median of per-pair ratios is printed.

Start-up: seconds from launching `dlscale train` to the end of the first training step (worker 0's
clock), beside the import time of torch in a fresh interpreter.

    .venv/bin/python benchmarks/ddp_vs_torchrun.py [--pairs 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlscale.launch.local import free_port

GOAL_RATIO = 0.95
GOAL_STARTUP_S = 5.0
HERE = Path(__file__).resolve().parent
DLSCALE = str(Path(sys.executable).parent / "dlscale")

SPEC = """
name: ddp-bench
model: {{name: lenet}}
data: {{name: synthetic, shape: [1, 28, 28], num_samples: 40000}}
batch_size: 32
steps: {steps}
optimizer: {{name: adam, lr: 0.001}}
device: cpu
checkpoint: {{keep_last: 1}}
strategy: {{name: ddp, workers: 2}}
"""


def run_dlscale(spec: Path, out: Path) -> dict:
    launched = time.time()
    subprocess.run(
        [DLSCALE, "train", str(spec), "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )
    final = json.loads((out / "run.json").read_text())["final"]
    return {
        "samples_per_s": final["train_samples_per_s"],
        "first_step_s": final["first_step_at_unix"] - launched,
    }


def run_torchrun(steps: int) -> dict:
    port = free_port()  # torchrun's workers cannot agree on "port 0": name one
    script = [str(HERE / "torchrun_ddp.py"), "--steps", str(steps), "--samples", "40000"]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        *script,
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def torch_import_s() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    # 480 steps stay inside dlscale's first epoch (500 steps of 64): no evaluation or checkpoint
    # in the middle, which the plain script does not do.
    parser.add_argument("--steps", type=int, default=480)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        spec = Path(scratch) / "spec.yaml"
        spec.write_text(SPEC.format(steps=args.steps))
        ratios, startups = [], []
        print(f"{'pair':>4} {'dlscale samples/s':>18} {'torchrun samples/s':>19} {'ratio':>6}")
        for pair in range(1, args.pairs + 1):
            out = Path(scratch) / f"run-{pair}"
            if pair % 2:
                ours = run_dlscale(spec, out)
                theirs = run_torchrun(args.steps)
            else:
                theirs = run_torchrun(args.steps)
                ours = run_dlscale(spec, out)
            ratios.append(ours["samples_per_s"] / theirs["samples_per_s"])
            startups.append(ours["first_step_s"])
            print(
                f"{pair:>4} {ours['samples_per_s']:>18,.0f} {theirs['samples_per_s']:>19,.0f} "
                f"{ratios[-1]:>6.3f}"
            )
        imports = [torch_import_s() for _ in range(3)]
    median = statistics.median(ratios)
    print(
        f"median throughput ratio dlscale/torchrun = {median:.3f} (goal ≥ {GOAL_RATIO}: "
        f"{'met' if median >= GOAL_RATIO else 'NOT met'})"
    )
    startup, imported = statistics.median(startups), statistics.median(imports)
    print(
        f"launch to first finished step: median {startup:.2f} s (runs: "
        + ", ".join(f"{s:.2f}" for s in startups)
        + f"); `import torch` alone: {imported:.2f} s; goal < {GOAL_STARTUP_S:.0f} s + import: "
        f"{'met' if startup < GOAL_STARTUP_S + imported else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
