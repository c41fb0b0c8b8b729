"""The normalization probes' share of memory bandwidth by the size of the normalized axis.

`dlscale bench machine` times batch norm and layer norm at one sample shape each
(`calibrate.PROBE_SHAPES`); this runs the same probe (`calibrate.op_efficiencies`) at other
shapes of the same bytes, to show how the share depends on the channel count or the feature
width. Each op's share is printed: the forward's and the backward's apart since 2026-11-28 (the
H100 figures quoted in calibrate.py and docs/hardware.md were the whole step's, one for both).
It reads the bandwidth and per-op overhead from the saved `local` entry, so run `dlscale bench
machine [--device cuda]` first.

    python benchmarks/norm_probe_sizes.py [--device cuda|cpu]
"""

from __future__ import annotations

import argparse

import torch

from dlscale.hardware import get_hardware
from dlscale.profiler import calibrate

# One sample is 256 KiB in every shape, as in the probes bench machine runs.
CASES = {
    "batch_norm": [(16, 64, 64), (64, 32, 32), (256, 16, 16), (1024, 8, 8)],
    "layer_norm": [(16, 64, 64), (256, 256), (64, 1024), (32, 2048)],
    "softmax": [(16, 64, 64), (64, 1024)],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    local = get_hardware("local")
    bandwidth, overhead = local.memory_bandwidth_bytes_per_s, local.op_overhead_s or 0.0
    device = torch.device(args.device)
    for kind, shapes in CASES.items():
        for shape in shapes:
            calibrate.PROBES = (kind,)
            calibrate.PROBE_SHAPES = {kind: shape}
            calibrate.PROBE_SHAPE = shape
            shares = calibrate.op_efficiencies(device, bandwidth, overhead)
            listed = ", ".join(f"{op} {share:.3f}" for op, share in shares.items())
            print(f"{kind:<11} sample {shape!s:<15} share of bandwidth: {listed}", flush=True)


if __name__ == "__main__":
    main()
