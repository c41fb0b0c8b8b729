"""New tensors above the allocator's threshold: which ones the tracer lists, and the page
faults the roofline adds for them on a CPU that measured its cost; every number by hand."""

import json

import pytest
import torch
from torch import nn

from dlscale import profiler
from dlscale.bench.machine import FRESH_MAPPING_BYTES, first_touch, measured_tables
from dlscale.profiler.recorder import NEW_OUTPUT_MIN_BYTES, PhaseCost
from dlscale.profiler.roofline import phase_time
from dlscale.profiler.target import resolve
from dlscale.profiler.trace import trace_step
from tests.toy_hardware import toy_hardware

MIB = 2**20
FIGURE = {"threshold_bytes": 32 * MIB, "tensor_bytes": 64 * MIB, "s_per_byte": 0.5e-9}


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def test_the_tracer_lists_new_tensors_not_in_place_writes_nor_views():
    # a 2048 × 4096 weight: its gradient is a new 32 MiB tensor each backward
    step = trace_step(
        lambda: nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(inplace=True), nn.Flatten()),
        torch.zeros(2048),
        512,  # the output, 512 × 4096 floats: 8 MiB, new; ReLU writes it in place
        "fp32",
        sgd,
        "sgd",
    )
    linear, relu, flatten = step.layers[:3]
    assert linear.forward.new_outputs == [8 * MIB]
    assert relu.forward.new_outputs == [] and flatten.forward.new_outputs == []
    assert 32 * MIB in linear.backward.new_outputs  # the weight's gradient
    assert all(size >= NEW_OUTPUT_MIN_BYTES for size in linear.backward.new_outputs)


def test_only_tensors_at_the_threshold_pay_and_only_where_measured():
    measured = toy_hardware(measured={"first_touch": FIGURE})
    assert measured.first_touch_seconds([64 * MIB, 32 * MIB, 31 * MIB, MIB]) == pytest.approx(
        96 * MIB * 0.5e-9
    )
    assert toy_hardware().first_touch_seconds([64 * MIB]) == 0.0  # a catalogue entry, a GPU


def test_the_roofline_adds_page_faults_beside_the_ops_but_not_to_an_update():
    hw = toy_hardware(op_overhead_s=0.0, measured={"first_touch": FIGURE})
    cost = PhaseCost(bytes=int(1e9), ops=1, new_outputs=[64 * MIB])
    plain = phase_time(cost, toy_hardware(op_overhead_s=0.0), "fp32", fresh_pages=True)
    faulted = phase_time(cost, hw, "fp32", fresh_pages=True)
    assert faulted.first_touch_s == pytest.approx(64 * MIB * 0.5e-9)
    assert faulted.seconds == pytest.approx(plain.seconds + 64 * MIB * 0.5e-9)
    # dlscale's loop keeps freed memory by default: no page faults to price
    kept = phase_time(cost, hw, "fp32")
    assert kept.first_touch_s == 0.0 and kept.seconds == pytest.approx(plain.seconds)
    # the optimizer's measured share already holds its temporaries' page faults
    update = phase_time(cost, hw, "fp32", working_set_bytes=256 * MIB, fresh_pages=True)
    assert update.first_touch_s == 0.0


def test_a_spec_that_releases_freed_memory_is_priced_with_its_page_faults(tmp_path):
    spec = {
        "name": "released",
        "model": {"name": "mlp", "kwargs": {"hidden": [8192]}},  # a 1024 × 8192 weight: 32 MiB
        "data": {"name": "synthetic", "shape": [1024], "num_samples": 4096},
        "batch_size": 1024,  # its output, 1024 × 8192: 32 MiB, new every forward, as its gradient
        "device": "cpu",
    }
    hw = toy_hardware(measured={"first_touch": FIGURE})
    found = {}
    for keep in (True, False):
        path = tmp_path / f"{keep}.yaml"
        path.write_text(json.dumps({**spec, "keep_freed_memory": keep}))
        workload = resolve(str(path))
        assert workload.fresh_pages is not keep
        found[keep] = profiler.profile(workload, [hw]).reports[0].prediction
    faults = sum(
        layer.forward.first_touch_s + layer.backward.first_touch_s for layer in found[False].layers
    )
    assert faults > 0 and found[False].step_s == pytest.approx(found[True].step_s + faults)


def test_bench_machine_measures_it_on_a_cpu_and_keeps_it_with_local():
    figure = first_touch(torch.device("cpu"), 0.02)
    assert figure["threshold_bytes"] == FRESH_MAPPING_BYTES
    assert figure["tensor_bytes"] > FRESH_MAPPING_BYTES  # the probe is above the threshold
    assert figure["s_per_byte"] >= 0.0
    assert first_touch(torch.device("meta"), 0.02) is None
    unset = ("device", "measured_at", "torch_version", "threads", "quick", "host_link")
    unset += ("training_op_overhead_s", "conv_flops_per_s", "last_level_cache_bytes")
    result = {
        **dict.fromkeys(unset),
        "matmul": [],
        "bandwidth": {"tensor_bytes": 1, "copy_bytes_per_s": 1.0, "triad_bytes_per_s": 1.0},
        "op_overhead_s": {},
        "op_efficiency": {},
        "first_touch": FIGURE,
    }
    assert measured_tables(result)["first_touch"] == FIGURE
