"""A calibration you can trust: probes timed until stable, impossible values rejected, a worse
measurement never silently replacing a better one."""

import itertools

import pytest

from dlscale.bench import plausible
from dlscale.profiler import calibrate


def test_a_stable_probe_stops_after_three_rounds_and_a_noisy_one_keeps_going():
    calibrate.start_spread_log()
    values = iter([1.0, 1.02, 0.99, 5.0])
    assert calibrate.stable_median(lambda: next(values)) == 1.0
    assert next(values) == 5.0  # three rounds agreed within 10%: no fourth
    noisy = itertools.cycle([1.0, 2.0, 4.0])
    calls = []

    def measure():
        calls.append(1)
        return next(noisy)

    calibrate.stable_median(measure)
    assert len(calls) == calibrate.MAX_ROUNDS  # never settled: stopped at the limit
    spreads = calibrate.spread_log()
    assert spreads[0] == pytest.approx(1.02 / 0.99 - 1) and spreads[1] == pytest.approx(3.0)


def busy_result() -> dict:
    """What a busy machine saved once: a convolution backward at 9.4e15 FLOP/s, an op at 5×
    the stream bandwidth, efficiencies pinned at their clamps, 100 µs per op."""
    return {
        "peak_flops": {"fp32": 1.8e11, "bf16": 8e11},
        "matmul": [{"size": 1024}],
        "conv_flops_per_s": {"backward": [[200, 128, 9.4e15], [590_000, 8192, 3e11]]},
        "attention_flops_per_s": {"full": {"forward": [[64, 5e10]]}},
        "op_efficiency": {"relu": 5.0, "max_pool2d": 0.01, "add": 0.8},
        "optimizer_efficiency": [[1e6, 20.0], [2.6e8, 0.6]],
        "op_overhead_s": {"add_s": 1e-6},
        "training_op_overhead_s": 100e-6,
    }


def test_impossible_values_are_rejected_with_a_warning_and_doubtful_ones_flagged():
    result = busy_result()
    warnings = plausible.check(result)
    assert result["conv_flops_per_s"]["backward"][0][-1] == 8e11  # replaced by the peak
    assert result["conv_flops_per_s"]["backward"][1][-1] == 3e11  # plausible: kept
    assert result["op_efficiency"]["relu"] == 1.0
    assert result["rejected"] == ["conv_flops_per_s.backward at [200, 128]", "op_efficiency.relu"]
    assert "op_efficiency.max_pool2d" in result["suspect"]
    assert "training_op_overhead_s" in result["suspect"]
    assert any("9.4e+15 FLOP/s is above 1.5× the measured matmul peak" in w for w in warnings)
    assert any("was the machine busy?" in w for w in warnings)
    assert all("\n" not in w for w in warnings)


def test_a_worse_measurement_never_replaces_a_better_one_silently():
    good = {"spread": {"median": 0.03}, "rejected": [], "suspect": []}
    noisy = {"spread": {"median": 0.4}, "rejected": [], "suspect": []}
    broken = {"spread": {"median": 0.03}, "rejected": ["x"], "suspect": ["y"]}
    assert plausible.worse(good, good) is None
    assert plausible.worse(noisy, good) == "its probes spread 40% (median) against 3%"
    assert plausible.worse(broken, good) == "2 values rejected or doubtful against 0"
    assert plausible.worse(good, noisy) is None  # better replaces worse
    assert plausible.worse(noisy, {"threads": 2}) is None  # an entry from before spreads


def test_a_timed_training_step_never_sends_gradients_back_to_the_callers_tensor():
    """The probes build their input on the host and time it on the device: a gradient that
    flowed back through the copy would time a device→host copy in every step (on an H200 every
    elementwise op's share of bandwidth sat at the floor, 0.01, because of it)."""
    import torch

    x = torch.randn(4, 8, requires_grad=True)
    model = torch.nn.Linear(8, 2)
    seconds = calibrate._time_training_step(model, x, torch.device("cpu"), 0.01)
    assert seconds > 0
    assert x.grad is None
    assert model.weight.grad is not None
