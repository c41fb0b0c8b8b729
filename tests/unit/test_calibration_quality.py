"""A calibration you can trust: probes timed until stable, impossible values rejected, a worse
measurement never silently replacing a better one."""

import itertools
import math
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.bench import plausible
from dlscale.profiler import calibrate
from dlscale.profiler.recorder import LOSS
from dlscale.profiler.trace import trace_step


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
    x = torch.randn(4, 8, requires_grad=True)
    model = torch.nn.Linear(8, 2)
    seconds = calibrate._time_training_step(model, x, torch.device("cpu"), 0.01)
    assert seconds > 0
    assert x.grad is None
    assert model.weight.grad is not None


class _CountOps(TorchDispatchMode):
    """Counts the aten ops that run, `detach` aside (autograd's bookkeeping, no kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ != "detach":
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", calibrate.PROBES)
def test_a_probe_times_exactly_the_ops_the_tracer_counts(kind, monkeypatch):
    """An elementwise probe's share of bandwidth is the traced bytes over the timed step: an
    untraced op in the step (a loss reading the output, the input's gradient added to the last
    step's) made every share too low. The step's ops are counted as they run."""
    channels = 64 if kind == "layer_norm" else 16
    shape = (16, 8, channels)
    timed = {}
    monkeypatch.setattr(
        calibrate, "seconds_per_call", lambda fn, device, min_time_s: timed.setdefault("fn", fn)
    )
    x = torch.randn(2, *shape, requires_grad=True)
    calibrate._time_training_step(calibrate._Probe(kind, channels), x, torch.device("cpu"), 0.01)
    timed["fn"]()  # the first step: the input's gradient does not exist yet in any case
    with _CountOps() as counted:
        timed["fn"]()
    step = trace_step(
        lambda: calibrate._Probe(kind, channels),
        torch.zeros(shape),
        2,
        "fp32",
        torch.optim.SGD,
        "sgd",
        True,
    )
    layers = [layer for layer in step.layers if layer.name != LOSS]
    assert len(counted.ops) == sum(layer.forward.ops + layer.backward.ops for layer in layers)


def test_normalization_probes_run_at_the_sizes_models_have(monkeypatch):
    """A GPU's batch norm share depends on its channel count (on an H100, 16 channels reached
    0.09 of bandwidth and 256 reached 0.90): each normalization probe is built for its own
    sample shape, and the other probes keep the common one."""
    timed = {}

    def fake_step(model, x, device, min_time_s):
        timed[model.kind] = (model, tuple(x.shape))
        return 1.0

    monkeypatch.setattr(calibrate, "_time_training_step", fake_step)
    monkeypatch.setattr(calibrate, "_time_forward", lambda model, x, device, t: 0.5)
    calibrate.op_efficiencies(torch.device("cpu"), 1e9, 0.0)
    batch = calibrate.PROBE_BATCH["cpu"]
    bn, bn_shape = timed["batch_norm"]
    assert bn_shape == (batch, 256, 16, 16) and bn.batch_norm.num_features == 256
    ln, ln_shape = timed["layer_norm"]
    assert ln_shape == (batch, 64, 1024) and ln.norm.normalized_shape == (1024,)
    assert timed["relu"][1] == (batch, *calibrate.PROBE_SHAPE)
    # every probe still moves the same bytes a sample
    for kind in calibrate.PROBES:
        assert math.prod(timed[kind][1][1:]) == math.prod(calibrate.PROBE_SHAPE)


def test_the_convolution_grid_reaches_the_layer_sizes_each_device_trains():
    """Output pixels timed (batch × side²): a GPU's up to ResNet-50's first layer at batch 64
    (802,816 pixels); a CPU's down to a 512-channel layer on a 2×2 map at batch 2 (8 pixels,
    2.4M weights: ResNet-50's last layers on 64×64 images at batch 2, ResNet-18's at 4 on 16),
    which its old grid (128 pixels and up, weights to 590k) clamped to a far faster rate."""
    pixels = {kind: [b * s * s for b, s in calibrate.conv_inputs(kind)] for kind in ("cpu", "cuda")}
    assert pixels["cpu"] == [8, 16, 64, 128, 1024, 8192]
    assert pixels["cpu"] == [b * s * s for b, s in calibrate.conv_inputs("mps")]
    assert pixels["cuda"] == [128, 1024, 8192, 65_536, 1_048_576]
    weights = {
        kind: [c_in * c_out * k * k for c_in, c_out, k, _ in calibrate.conv_layers(kind)]
        for kind in ("cpu", "cuda")
    }
    assert max(weights["cpu"]) == 512 * 512 * 9 and max(weights["cuda"]) == 256 * 256 * 9
    cpu = calibrate.conv_points_that_fit(torch.device("cpu"), free_bytes=1 << 40)
    assert ((512, 512, 3, True), (2, 2)) in cpu and ((512, 512, 3, True), (4, 2)) in cpu
    # every point but the 512-channel layer at 8,192 pixels (39 GFLOP a forward)
    assert len(cpu) == 5 * 6 - 1 and ((512, 512, 3, True), (8, 32)) not in cpu


def test_a_gpu_with_little_free_memory_skips_the_largest_convolutions_only():
    """The largest CUDA point (256 → 256 channels, batch 16, side 256) holds, by the estimate,
    2 (in and out) × 2 (their gradients) × 2 (workspace) × 256 × 16 × 65,536 × 4 bytes = 8 GiB."""
    cuda = torch.device("cuda")
    gib = 1 << 30
    assert calibrate.conv_point_bytes(256, 256, 16, 256) == 8 * gib
    every = calibrate.conv_points_that_fit(cuda, free_bytes=80 * gib)
    assert len(every) == len(calibrate.CONV_LAYERS) * len(calibrate.conv_inputs("cuda")) == 20
    small = calibrate.conv_points_that_fit(cuda, free_bytes=6 * gib)
    skipped = [point for point in every if point not in small]
    # 6 GiB leaves out the 256-channel layer at side 256 (8 GiB) and nothing else: the 64-channel
    # layer there needs 4 GiB, the 256-channel at side 64 (16 × 4,096 pixels) 1 GiB
    assert skipped == [(calibrate.CONV_LAYERS[3], (16, 256))]


def _probe_layers(kind: str) -> list:
    """A probe's traced layers, the loss left out (its timed step has none)."""
    step = trace_step(
        lambda: calibrate.probe_module(kind),
        torch.zeros(calibrate.probe_shape(kind)),
        calibrate.PROBE_BATCH["cpu"],
        "fp32",
        torch.optim.SGD,
        "sgd",
        True,
    )
    return [layer for layer in step.layers if layer.name != LOSS]


def _probe_bytes(kind: str) -> dict[str, Counter]:
    """The bytes each op of a probe's traced step moves, by phase."""
    layers = _probe_layers(kind)
    return {
        phase: sum((getattr(one, phase).bytes_by_op for one in layers), Counter())
        for phase in ("forward", "backward")
    }


def _fake_probe_times(monkeypatch, step_s: dict, forward_s: dict) -> None:
    monkeypatch.setattr(
        calibrate, "_time_training_step", lambda model, x, device, t: step_s.get(model.kind, 1.0)
    )
    monkeypatch.setattr(
        calibrate, "_time_forward", lambda model, x, device, t: forward_s.get(model.kind, 0.5)
    )


def test_dropouts_share_goes_to_its_mask_alone(monkeypatch):
    """Dropout on a CPU draws its mask (`bernoulli_`), then scales and multiplies (`div_`,
    `mul`): ops of every elementwise layer. Its probe's share goes to the mask alone, the other
    ops priced at the stream bandwidth and taken off its time (the forward's: the mask is drawn
    there); every other probe's share goes to all of its ops, as before."""
    _fake_probe_times(monkeypatch, {"dropout": 0.1}, {"dropout": 0.06})
    bandwidth = 1e9
    found = calibrate.op_efficiencies(torch.device("cpu"), bandwidth, 0.0)
    moved = _probe_bytes("dropout")
    assert (
        set(moved["forward"]) == {"bernoulli_", "div_", "mul"}
        and "bernoulli_" not in (moved["backward"])
    )
    forward = moved["forward"]
    others_s = (forward["div_"] + forward["mul"]) / bandwidth
    assert others_s < 0.06
    expected = forward["bernoulli_"] / (0.06 - others_s) / bandwidth
    assert found["bernoulli_"] == pytest.approx(min(1.0, expected))
    assert "mul" not in found and "div_" not in found


def test_a_forward_op_takes_the_forwards_share_and_a_backward_op_the_backwards(monkeypatch):
    """Max pooling's forward (which also writes the indices) and its backward run at very
    different shares of the bandwidth (0.05 and 0.6–1.0 on the 2-core development machine): each
    takes its own phase's, the backward's time the step's less the forward's. An op both phases
    run (the `add` probe's `flip` and `add`) takes the whole step's share, as before."""
    bandwidth = 2e9  # with these times every share checked is inside (0.01, 1): none clamped
    _fake_probe_times(monkeypatch, {"max_pool": 0.02, "add": 0.02}, {"max_pool": 0.008})
    found = calibrate.op_efficiencies(torch.device("cpu"), bandwidth, 1e-6)
    pool = _probe_bytes("max_pool")
    assert set(pool["forward"]) == {"max_pool2d_with_indices"}
    assert set(pool["backward"]) == {"max_pool2d_with_indices_backward"}
    layers = _probe_layers("max_pool")
    forward_s = 0.008 - sum(one.forward.ops for one in layers) * 1e-6  # its ops' overhead off
    backward_s = 0.02 - 0.008 - sum(one.backward.ops for one in layers) * 1e-6
    assert found["max_pool2d_with_indices"] == pytest.approx(
        pool["forward"]["max_pool2d_with_indices"] / forward_s / bandwidth
    )
    assert found["max_pool2d_with_indices_backward"] == pytest.approx(
        pool["backward"]["max_pool2d_with_indices_backward"] / backward_s / bandwidth
    )
    add = _probe_bytes("add")
    assert {"add", "flip"} <= set(add["forward"]) & set(add["backward"])
    ops = sum(one.forward.ops + one.backward.ops for one in _probe_layers("add"))
    whole = sum(add["forward"].values()) + sum(add["backward"].values())
    assert found["add"] == found["flip"] == pytest.approx(whole / (0.02 - ops * 1e-6) / bandwidth)
    checked = ("max_pool2d_with_indices", "max_pool2d_with_indices_backward", "add")
    assert all(0.01 < found[op] < 1 for op in checked)
    assert {"relu", "threshold_backward"} <= set(found)  # every probe's own ops have a share


def test_a_phase_too_short_to_tell_from_noise_takes_the_whole_steps_share(monkeypatch):
    """The backward's time is the step's median less the forward's: where that leaves under
    MIN_PHASE_FRACTION of the step (a forward timed as slow as the whole step), it is noise,
    and both of the probe's ops take the whole step's share instead of one clamped to 1."""
    bandwidth = 2e9
    _fake_probe_times(monkeypatch, {"max_pool": 0.02}, {"max_pool": 0.0199})
    found = calibrate.op_efficiencies(torch.device("cpu"), bandwidth, 1e-6)
    pool = _probe_bytes("max_pool")
    layers = _probe_layers("max_pool")
    ops = sum(one.forward.ops + one.backward.ops for one in layers)
    whole = sum(pool["forward"].values()) + sum(pool["backward"].values())
    expected = whole / (0.02 - ops * 1e-6) / bandwidth
    assert 0.01 < expected < 1
    assert found["max_pool2d_with_indices"] == found["max_pool2d_with_indices_backward"]
    assert found["max_pool2d_with_indices"] == pytest.approx(expected)


def test_a_probe_that_stalled_is_rejected_not_kept_as_a_rate():
    """The defect: a quick calibration on a busy machine kept convolutions of 2,304 weights at
    1.15 MFLOP/s beside 0.5-50 GFLOP/s at the other sizes, and `bench batch` then predicted
    13-40x too slow. A smaller convolution (the same weights, fewer positions) cannot take
    longer than a larger one: a point whose implied time is over 4x a larger one's is a stall,
    replaced by the larger one's time at its own work, and rejected."""
    result = {
        "peak_flops": {"fp32": 3e11},
        "matmul": [{"size": 1024}],
        "conv_flops_per_s": {
            "forward": [
                [2304, 8, 1.15e6],  # 37 kFLOP in ~32 ms: a stall
                [2304, 16, 9.8e8],
                [2304, 64, 3.9e9],
                [200, 8, 5.8e7],  # slow, but no slower than its larger neighbours: kept
                [200, 16, 1.1e8],
            ]
        },
        "attention_flops_per_s": {"full": {"forward": [[64, 1.2e11], [256, 1.7e11]]}},
    }
    warnings = plausible.check(result)
    forward = result["conv_flops_per_s"]["forward"]
    assert forward[0][-1] == pytest.approx(9.8e8 * 8 / 16)  # the 16's time, at 8's work
    assert [point[-1] for point in forward[1:]] == [9.8e8, 3.9e9, 5.8e7, 1.1e8]
    assert result["rejected"] == ["conv_flops_per_s.forward at [2304, 8]"]
    assert any("a stall" in w and "[2304, 8]" in w for w in warnings)
    assert result["attention_flops_per_s"]["full"]["forward"][0][-1] == 1.2e11
