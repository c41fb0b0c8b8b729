"""The bytes the tracer counts for ops that pass over a tensor more than once: batch norm in
training reads its input twice (statistics, then normalize) and its backward reads grad_out and
input twice (reductions, then the input's gradient); every number worked out by hand."""

import pytest
import torch
from torch import nn

from dlscale.hardware import Hardware
from dlscale.profiler.recorder import reread_bytes
from dlscale.profiler.roofline import phase_time
from dlscale.profiler.trace import trace_step

FP32 = 4
# Batch 2 of 4 channels × 5 × 5: the activation is 200 floats; each per-channel vector is 4.
ACTIVATION = 2 * 4 * 5 * 5 * FP32  # 800 bytes
CHANNEL = 4 * FP32  # 16 bytes


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def conv_then_batch_norm():
    # The convolution makes batch norm's input require a gradient, so its backward computes one.
    return nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4))


@pytest.fixture(scope="module")
def batch_norm_layer():
    step = trace_step(conv_then_batch_norm, torch.zeros(3, 5, 5), 2, "fp32", sgd, "sgd")
    return step.layers[1]


def test_batch_norm_forward_reads_its_input_twice(batch_norm_layer):
    # inputs: x, weight, bias, running mean, running var; outputs: y, saved mean, saved invstd;
    # and x once more for the statistics pass.
    once = ACTIVATION + 4 * CHANNEL + ACTIVATION + 2 * CHANNEL
    assert once == 1696
    assert batch_norm_layer.forward.bytes_by_op["native_batch_norm"] == once + ACTIVATION == 2496


def test_batch_norm_backward_reads_grad_out_and_input_twice(batch_norm_layer):
    # inputs: grad_out, x, weight, running mean, running var, saved mean, saved invstd; outputs:
    # dx, dweight, dbias; and grad_out and x once more for the reduction pass.
    once = 2 * ACTIVATION + 5 * CHANNEL + ACTIVATION + 2 * CHANNEL
    assert once == 2512
    backward = batch_norm_layer.backward.bytes_by_op["native_batch_norm_backward"]
    assert backward == once + 2 * ACTIVATION == 4112


def meta(*shape):
    return torch.empty(*shape, device="meta")


def test_no_second_pass_in_eval_mode_or_without_an_input_gradient():
    x, vector = meta(2, 4, 5, 5), meta(4)
    forward = torch.ops.aten.native_batch_norm.default
    assert reread_bytes(forward, (x, vector, vector, vector, vector, True, 0.1, 1e-5), {}) == 800
    assert reread_bytes(forward, (x, vector, vector, vector, vector, False, 0.1, 1e-5), {}) == 0
    backward = torch.ops.aten.native_batch_norm_backward.default
    args = (x, x, vector, vector, vector, vector, vector, True, 1e-5)
    assert reread_bytes(backward, (*args, [True, True, True]), {}) == 1600
    # Only the weight's and bias's gradients: the reduction pass alone, as the rule counts it.
    assert reread_bytes(backward, (*args, [False, True, True]), {}) == 0
    assert reread_bytes(torch.ops.aten.relu.default, (x,), {}) == 0


def test_the_second_pass_costs_memory_time(batch_norm_layer):
    hw = Hardware(
        name="toy",
        display_name="toy",
        kind="gpu",
        vendor="x",
        peak_flops={"fp32": 1e12},
        memory_bytes=2**30,
        memory_bandwidth_bytes_per_s=1e9,
        memory_efficiency=0.5,
        op_overhead_s=0.0,
    )
    # 2496 + 16 (num_batches_tracked += 1) bytes at 1e9 × 0.5 B/s; 200 FLOPs at 0.7 TFLOP/s
    # are far below it.
    time = phase_time(batch_norm_layer.forward, hw, "fp32")
    assert time.memory_s == pytest.approx((2496 + 16) / 0.5e9)
    assert time.seconds == pytest.approx(time.memory_s)
