"""A CPU training step with freed memory kept (dlscale's default, `keep_freed_memory: true`)
against the same step giving large freed blocks back to the kernel (glibc's own behaviour):
time a step and page faults a step, side by side.

Each case runs in a fresh process (the allocator's setting is the process's), alternating kept
and released, `--rounds` times; a round times `--steps` steps of forward, backward and Adam's
update (as dlscale's trainer builds it: torch's fused kernel on a CPU) at one thread after two
warm-up steps, on seeded random inputs, and reports the median step and the minor page faults
a step. Printed: each case's median over rounds, its spread
(max / min), and released / kept.

    .venv/bin/python benchmarks/keep_freed_memory.py [--rounds 3] [--steps 5]
        [--models vgg16,alexnet,resnet50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CASES = {  # model: (batch, input shape), as benchmarks/predict_accuracy.py runs them
    "vgg16": (2, (3, 32, 32)),
    "alexnet": (4, (3, 64, 64)),
    "resnet50": (4, (3, 64, 64)),
}

ROUND = textwrap.dedent(
    """
    import json, resource, statistics, sys, time, torch
    from dlscale.jobspec import OptimizerSpec
    from dlscale.models.registry import build_model
    from dlscale.train.step import build_optimizer
    from dlscale.train.allocator import keep_freed_memory
    name, keep, steps = sys.argv[1], sys.argv[2] == "keep", int(sys.argv[3])
    batch, shape = json.loads(sys.argv[4])
    applied = keep_freed_memory(keep)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(name, {"num_classes": 10})
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="adam"))  # as trained
    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    times, faults = [], []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"applied": applied, "step_s": statistics.median(times),
                      "faults": statistics.median(faults)}))
    """
)


def one_round(name: str, keep: bool, steps: int) -> dict:
    batch, shape = CASES[name]
    mode = "keep" if keep else "release"
    found = subprocess.run(
        [sys.executable, "-c", ROUND, name, mode, str(steps), json.dumps([batch, list(shape)])],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(found.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", default=",".join(CASES))
    args = parser.parse_args()
    names = [name for name in args.models.split(",") if name]
    unknown = set(names) - set(CASES)
    if unknown or args.rounds < 1 or args.steps < 1:
        parser.error(f"models from {sorted(CASES)}; --rounds and --steps at least 1")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(
        "| model (batch) | kept: step (spread) | released: step (spread) | released / kept "
        "| page faults a step, kept / released |\n|---|---|---|---|---|"
    )
    for name in names:
        runs = {True: [], False: []}
        for _ in range(args.rounds):
            for keep in (True, False):
                runs[keep].append(one_round(name, keep, args.steps))
        if not all(run["applied"] for rounds in runs.values() for run in rounds):
            print(f"{name}: the allocator could not be set here (not glibc)")
            continue
        step = {keep: [r["step_s"] for r in rounds] for keep, rounds in runs.items()}
        fault = {
            keep: statistics.median(r["faults"] for r in rounds) for keep, rounds in runs.items()
        }
        kept, released = statistics.median(step[True]), statistics.median(step[False])
        spread = {keep: max(s) / min(s) for keep, s in step.items()}
        print(
            f"| {name} ({CASES[name][0]}) | {kept * 1e3:.0f} ms ({spread[True]:.2f}) | "
            f"{released * 1e3:.0f} ms ({spread[False]:.2f}) | {released / kept:.2f} | "
            f"{fault[True]:,.0f} / {fault[False]:,.0f} |"
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} after")


if __name__ == "__main__":
    main()
