"""The step's parts that are not a layer's: dlscale's own loop per step, and where each layer
phase's rate came from (a measured curve or the roofline's peak). Numbers worked by hand."""

from collections import Counter

import pytest
import torch
from torch import nn

from dlscale.bench.loop_cost import loop_step_cost
from dlscale.bench.scale import worker_step_s
from dlscale.hardware.device import DEFAULT_STEP_OVERHEAD_S
from dlscale.profiler.recorder import PhaseCost
from dlscale.profiler.roofline import phase_time, predict
from dlscale.profiler.scaling import ddp_reducer_s
from dlscale.profiler.trace import trace_step
from tests.toy_hardware import toy_hardware


def test_every_step_pays_the_loop_cost_measured_or_the_default():
    step = trace_step(lambda: nn.Linear(10, 10), torch.zeros(10), 4, "fp32", torch.optim.SGD, "sgd")
    measured = predict(step, toy_hardware(measured={"loop_step_s": 2.5e-4}))
    assert measured.loop_s == 2.5e-4
    parts = measured.forward_s + measured.backward_s + measured.optimizer_s + measured.h2d_s
    assert measured.step_s == pytest.approx(parts + 2.5e-4)
    assert measured.samples_per_s == pytest.approx(4 / measured.step_s)
    catalogue = predict(step, toy_hardware())
    assert catalogue.loop_s == DEFAULT_STEP_OVERHEAD_S["cpu"]
    assert catalogue.step_s - measured.step_s == pytest.approx(
        DEFAULT_STEP_OVERHEAD_S["cpu"] - 2.5e-4
    )


def test_a_tiny_step_is_its_ops_and_the_loop_by_hand():
    """Rates so high that FLOPs and bytes cost nothing: the step is ops × 1 µs + the loop."""
    step = trace_step(lambda: nn.Linear(10, 10), torch.zeros(10), 4, "fp32", torch.optim.SGD, "sgd")
    fast = toy_hardware(
        peak_flops={"fp32": 1e30}, memory_bandwidth_bytes_per_s=1e30, measured={"loop_step_s": 3e-4}
    )
    ops = sum(layer.forward.ops + layer.backward.ops for layer in step.layers)
    ops += sum(tensor.cost.ops for tensor in step.optimizer_tensors)
    assert predict(step, fast).step_s == pytest.approx(ops * 1e-6 + 3e-4)


def test_the_loop_cost_is_the_median_of_paired_differences_never_negative():
    # Three rounds, each (bare step, loop step): differences 0.2, 0.1 and 0.4 ms.
    assert loop_step_cost([(1.0e-3, 1.2e-3), (2.0e-3, 2.1e-3), (1.1e-3, 1.5e-3)]) == (
        pytest.approx(2e-4)
    )
    assert loop_step_cost([(1e-3, 0.9e-3), (1e-3, 0.8e-3), (1e-3, 1.05e-3)]) == 0.0


def test_each_phase_says_whether_a_measured_rate_or_the_roofline_set_it():
    curve = {"fp32": {"64": 1e10, "1024": 5e11}}
    measured = toy_hardware(measured={"matmul_flops_per_s": curve, "op_efficiency": {"relu": 0.8}})
    catalogue = toy_hardware()
    products = PhaseCost(matmul_flops=int(1e9), matmul_ops=1, bytes=int(1e3), ops=1)
    assert phase_time(products, measured, "fp32").source == "measured"
    assert phase_time(products, catalogue, "fp32").source == "roofline"
    relu = PhaseCost(other_flops=10, bytes=int(1e9), ops=1, bytes_by_op=Counter(relu=int(1e9)))
    assert phase_time(relu, measured, "fp32").bound == "memory"
    assert phase_time(relu, measured, "fp32").source == "measured"
    # An op without a measured share (a layer norm here) streams at the default efficiency.
    norm = PhaseCost(bytes=int(1e9), ops=1, bytes_by_op=Counter(native_layer_norm=int(1e9)))
    assert phase_time(norm, measured, "fp32").source == "roofline"
    # Half the bytes at a measured share (2e9 B at 0.8: 25 ms), half at the default (1e9 B at
    # 0.5: 20 ms): the measured part is the larger, so the phase counts as measured.
    mixed = PhaseCost(
        bytes=int(3e9), ops=1, bytes_by_op=Counter(relu=int(2e9), native_layer_norm=int(1e9))
    )
    assert phase_time(mixed, measured, "fp32").memory_s == pytest.approx(0.025 + 0.02)
    assert phase_time(mixed, measured, "fp32").source == "measured"
    # A view runs no op: no rate to name. Too little work: the per-op cost sets it, measured
    # only where `bench machine` measured it.
    assert phase_time(PhaseCost(), measured, "fp32").source == "none"
    tiny = PhaseCost(matmul_flops=10, matmul_ops=1, bytes=10, ops=3)
    assert phase_time(tiny, measured, "fp32").source == "roofline"
    timed = toy_hardware(measured={"training_op_overhead_s": 1e-6})
    assert phase_time(tiny, timed, "fp32").source == "measured"


def test_a_prediction_counts_its_phases_by_source():
    step = trace_step(
        lambda: nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Flatten()),
        torch.zeros(256),
        512,
        "fp32",
        torch.optim.SGD,
        "sgd",
    )
    curve = {"fp32": {"64": 1e10, "1024": 5e11}}
    hw = toy_hardware(op_overhead_s=0.0, measured={"matmul_flops_per_s": curve})
    result = predict(step, hw)
    sources = {layer.name: (layer.forward.source, layer.backward.source) for layer in result.layers}
    assert sources["0"] == ("measured", "measured")  # the products, on the measured curve
    assert sources["1"] == ("roofline", "roofline")  # ReLU at the default share of bandwidth
    assert sources["2"] == ("none", "none")  # Flatten: a view
    counts = result.phase_sources()
    assert counts["measured"] >= 2 and counts["roofline"] >= 2
    assert counts["measured"] + counts["roofline"] == sum(
        source != "none" for pair in sources.values() for source in pair
    )
    assert "1" in result.roofline_layers() and "0" not in result.roofline_layers()


def test_a_worker_with_fewer_threads_slows_its_ops_but_not_the_loop():
    # `local` measured with 2 threads; a worker of `dlscale scale` has 1: its ops run 2× slower,
    # the loop's own per-step cost (Python on one core) does not.
    step = trace_step(lambda: nn.Linear(10, 10), torch.zeros(10), 4, "fp32", torch.optim.SGD, "sgd")
    prediction = predict(step, toy_hardware(measured={"loop_step_s": 2.5e-4}))
    ops = prediction.step_s - 2.5e-4
    assert worker_step_s(prediction, 2, 1) == pytest.approx(ops * 2 + 2.5e-4)
    assert worker_step_s(prediction, 2, 2) == pytest.approx(prediction.step_s)


def test_ddps_own_work_a_step_measured_on_a_cpu_by_hand():
    """What DDP adds to a step where `bench machine` measured it: the tiny probe's DDP step
    less its bare one (0.5 ms) less the probe's reducer ops (10 tensors: 10 + 1 ops at the bare
    dispatch, 2 µs: a copy into the bucket a tensor, the hook's division) is the fixed part; a
    model's reducer adds its own ops and two passes over its gradients (the copy and the
    division; they are the buckets' views: none back) at the copy rate timed for their working
    set."""
    measured = {
        "loop": {"ddp_step_s": 5e-4, "ddp_probe_tensors": 10, "ddp_bucket_view": True},
        "op_overhead_s": {"add_s": 2e-6},
        # copies by working set: 20 GB/s to 1 MiB, 10 GB/s from 16 MiB
        "cache_copy_bytes_per_s": [[2**20, 20e9], [16 * 2**20, 10e9]],
    }
    cpu = toy_hardware(measured=measured)
    assert cpu.dispatch_s == 2e-6
    assert cpu.ddp_fixed_step_s == pytest.approx(5e-4 - 11 * 2e-6)
    # An entry measured before the gradients were bucket views: the probe copied each way.
    older = toy_hardware(
        measured={**measured, "loop": {"ddp_step_s": 5e-4, "ddp_probe_tensors": 10}}
    )
    assert older.ddp_fixed_step_s == pytest.approx(5e-4 - 21 * 2e-6)
    # A linear layer of 4 Mi weights (16 MiB of gradients: 32 MiB with the buckets) and a bias.
    step = trace_step(
        lambda: nn.Linear(2048, 2048), torch.zeros(2048), 4, "fp32", torch.optim.SGD, "sgd"
    )
    grads = (2048 * 2048 + 2048) * 4
    # (a working set of 32 MiB, past the largest timed, with no memory copy rate measured: the
    # largest timed point's rate)
    by_hand = (5e-4 - 11 * 2e-6) + (2 + 1) * 2e-6 + 2 * 2 * grads / 10e9
    assert ddp_reducer_s(step, cpu, buckets=1) == pytest.approx(by_hand)
    # Past the largest working set the copies were timed at, the memory copy rate (8 GB/s).
    with_memory = toy_hardware(measured={**measured, "copy_bytes_per_s": 8e9})
    assert ddp_reducer_s(step, with_memory, buckets=1) == pytest.approx(
        (5e-4 - 11 * 2e-6) + 3 * 2e-6 + 2 * 2 * grads / 8e9
    )
    # Nothing measured (a catalogue CPU): no fixed part, the per-op default, memory's rate.
    plain = toy_hardware()
    bandwidth = plain.memory_bandwidth_bytes_per_s * plain.efficiency_memory
    assert plain.ddp_fixed_step_s == 0.0 and plain.dispatch_s == plain.overhead_per_op_s
    assert ddp_reducer_s(step, plain, buckets=1) == pytest.approx(
        3 * plain.overhead_per_op_s + 2 * 2 * grads / bandwidth
    )
    # A probe that timed DDP faster than its own ops would cost: no negative fixed part.
    fast = toy_hardware(
        measured={**measured, "loop": {"ddp_step_s": 1e-5, "ddp_probe_tensors": 10}}
    )
    assert fast.ddp_fixed_step_s == 0.0
