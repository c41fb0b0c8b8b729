"""Whether one bf16 Tensor Core share on the catalogue H100 explains the measured bf16 steps.

Takes the device steps `benchmarks/gpu_predict.py` measured at bf16 on an H100 80GB HBM3
(2026-11-27, docs/performance.md: the step on one batch kept on the GPU) and profiles each of its
workloads on `h100-sxm` with the entry's bf16 share of peak replaced by each value of `--shares`,
printing predicted (less its host→device copy) / measured. A share that fits one row and leaves
the others off says the miss is not the Tensor Cores' rate. CPU only: a meta-device trace.

    python benchmarks/gpu_bf16_share.py [--shares 0.68,0.5,0.4,0.3,0.2,0.15,0.1]
"""

from __future__ import annotations

import argparse
import dataclasses

from dlscale import profiler
from dlscale.hardware import get_hardware
from dlscale.profiler.target import resolve
from gpu_predict import WORKLOADS

# Device step at bf16, seconds: notes of the H100 run (gpu_predict.py --steps 15, 'device').
MEASURED_DEVICE_BF16_S = {
    "resnet50": 32.49e-3,
    "gpt": 39.28e-3,
    "alexnet_2gpu": 18.49e-3,
    "mlp": 2.46e-3,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="0.68,0.5,0.4,0.3,0.2,0.15,0.1")
    args = parser.parse_args()
    h100 = get_hardware("h100-sxm")
    workloads = {
        model: resolve(model, batch, shape, "bf16", "adam", tokens, kwargs)
        for model, kwargs, shape, tokens, batch in WORKLOADS
    }
    print("bf16 share  " + "  ".join(f"{model:>12}" for model in workloads))
    for share in (float(s) for s in args.shares.split(",")):
        shares = {**h100.compute_efficiency_by_precision, "bf16": share}
        entry = dataclasses.replace(h100, compute_efficiency_by_precision=shares)
        ratios = []
        for model, workload in workloads.items():
            p = profiler.profile(workload, [entry]).reports[0].prediction
            ratios.append((p.step_s - p.h2d_s) / MEASURED_DEVICE_BF16_S[model])
        print(f"{share:>10.2f}  " + "  ".join(f"{r:>12.2f}" for r in ratios), flush=True)


if __name__ == "__main__":
    main()
