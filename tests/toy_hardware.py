"""A made-up device for tests that work a prediction out by hand: round figures, every field a
test may need to change given as an override."""

from dlscale.hardware.device import Hardware


def toy_hardware(**overrides) -> Hardware:
    """A 1 TFLOP/s, 100 GB/s CPU at half its peak and bandwidth, 1 µs an op, unless overridden."""
    fields = {
        "name": "toy",
        "display_name": "toy",
        "kind": "cpu",
        "vendor": "x",
        "peak_flops": {"fp32": 1e12},
        "memory_bytes": 2**30,
        "memory_bandwidth_bytes_per_s": 1e11,
        "compute_efficiency": 0.5,
        "memory_efficiency": 0.5,
        "op_overhead_s": 1e-6,
    }
    return Hardware(**{**fields, **overrides})
