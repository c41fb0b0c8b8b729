"""How fast and how lean profiling is: ResNet-50 at batch 256, in a fresh process.

Goal: under 5 s and under 1 GB peak resident memory (nothing real is allocated: the step is
traced on the meta device). The profile runs in a child process so that its peak RSS is its own;
the time of `import torch` is reported apart.

    .venv/bin/python benchmarks/profile_speed.py [--model resnet50] [--batch 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, time
t0 = time.perf_counter()
from dlscale.api.profiling import ProfileRequest, profile
from dlscale.train.device import host_peak_rss_bytes
t1 = time.perf_counter()
request = ProfileRequest({model!r}, batch_size={batch}, hardware=("a100-40gb", "h100-sxm"))
result = profile(request)
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "profile_s": t2 - t1,
                  "peak_rss_bytes": host_peak_rss_bytes(),
                  "layers": len(result.trace.layers),
                  "activations_bytes": result.memory.activations_bytes}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeats):
        code = CHILD.format(model=args.model, batch=args.batch)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda run: run["profile_s"])
    worst_rss = max(run["peak_rss_bytes"] for run in runs)
    print(
        f"{args.model} batch {args.batch}: {best['layers']} layer rows, "
        f"{best['activations_bytes'] / 2**30:.1f} GiB of activations described, none allocated"
    )
    for i, run in enumerate(runs, 1):
        print(
            f"run {i}: import {run['import_s']:.2f} s, profile {run['profile_s']:.2f} s, "
            f"peak RSS {run['peak_rss_bytes'] / 2**20:,.0f} MiB"
        )
    print(
        f"best profile time {best['profile_s']:.2f} s (goal < 5 s); "
        f"peak RSS {worst_rss / 2**20:,.0f} MiB (goal < 1024 MiB)"
    )


if __name__ == "__main__":
    main()
