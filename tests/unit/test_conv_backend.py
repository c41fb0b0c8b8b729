"""Small pointwise convolutions on a one-thread CPU: which ones torch computes with its own
im2col kernels instead of oneDNN (the tracer's rule against torch's own selection), the product
per sample it runs for each, and the price the roofline gives them; every number by hand."""

import pytest
import torch
from torch import nn

from dlscale.profiler.gemms import Gemm
from dlscale.profiler.recorder import PhaseCost
from dlscale.profiler.roofline import phase_time
from dlscale.profiler.trace import trace_step
from tests.toy_hardware import toy_hardware

SLOW = {"Slow2d", "Slow3d"}


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


CASES = [  # (conv class, its options, batch, sample shape)
    (nn.Conv2d, {"kernel_size": 1}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 1}, 15, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 1}, 16, (8, 6, 6)),  # a batch of 16 goes to oneDNN
    (nn.Conv2d, {"kernel_size": 1, "padding": 1}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 1, "groups": 2}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 1, "stride": 2}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 1, "dilation": 2}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1}, 2, (8, 6, 6)),
    (nn.Conv2d, {"kernel_size": (1, 3)}, 2, (8, 6, 6)),
    (nn.Conv1d, {"kernel_size": 1}, 2, (8, 6)),
    (nn.Conv3d, {"kernel_size": 1}, 2, (8, 3, 3, 3)),
    (nn.ConvTranspose2d, {"kernel_size": 1}, 2, (8, 6, 6)),
]


@pytest.mark.parametrize(("conv", "options", "batch", "sample"), CASES)
def test_the_rule_is_torchs_own_choice_at_one_thread(one_thread, conv, options, batch, sample):
    module = conv(8, 4, **options)
    x = torch.zeros(batch, *sample)
    backend = torch._C._select_conv_backend(
        x,
        module.weight,
        None,
        list(module.stride),
        list(module.padding),
        list(module.dilation),
        module.transposed,
        list(module.output_padding),
        module.groups,
        None,
    )
    step = trace_step(
        lambda: conv(8, 4, **options), torch.zeros(*sample), batch, "fp32", sgd, "sgd"
    )
    layer = step.layers[0]
    slow = backend.name in SLOW
    assert [g is not None for g in layer.forward.conv_pointwise] == [slow]
    assert [g is not None for g in layer.backward.conv_pointwise] == [slow]


def test_the_product_per_sample_is_the_weight_times_the_samples_columns():
    step = trace_step(
        lambda: nn.Conv2d(8, 6, 1, groups=2), torch.zeros(8, 5, 5), 3, "fp32", sgd, "sgd"
    )
    (forward,) = step.layers[0].forward.conv_pointwise
    (backward,) = step.layers[0].backward.conv_pointwise
    # 3 output channels × 4 input channels per group, by 25 pixels, for 3 samples × 2 groups
    assert forward == Gemm("pointwise", 3, 4, 25, 6) == backward
    flops, _, _ = step.layers[0].forward.convs[0]
    assert 2 * forward.macs == flops


def cpu(threads: int | None, grid: list) -> object:
    """A CPU measured at `threads` with a product grid and a convolution grid of flat rates."""
    measured = {
        "matmul_shape_flops_per_s": grid,
        "conv_flops_per_s": {"forward": [[1, 1, 4e10], [1e7, 1e7, 4e10]]},
    }
    if threads is not None:
        measured["threads"] = threads
    return toy_hardware(
        kind="cpu",
        peak_flops={"fp32": 1e11},
        memory_bandwidth_bytes_per_s=1e15,
        op_overhead_s=0.0,
        measured=measured,
    )


def test_a_one_thread_cpu_prices_a_small_pointwise_conv_at_its_products_rate():
    # products with 4 output pixels run at 5 GFLOP/s, with 64 at 50: N is the last coordinate
    grid = [[m, k, n, 5e9 if n == 4 else 5e10] for m in (4, 512) for k in (4, 512) for n in (4, 64)]
    per_sample = Gemm("pointwise", 512, 512, 4, 8)
    flops = 2 * per_sample.macs
    cost = PhaseCost(
        matmul_flops=flops,
        matmul_ops=1,
        convs=[(flops, 512 * 512, 32)],
        conv_winograd=[False],
        conv_pointwise=[per_sample],
    )
    assert phase_time(cost, cpu(1, grid), "fp32").compute_s == pytest.approx(flops / 5e9)
    # at two threads (or with no thread count measured) torch picks oneDNN: the conv grid
    assert phase_time(cost, cpu(2, grid), "fp32").compute_s == pytest.approx(flops / 4e10)
    assert phase_time(cost, cpu(None, grid), "fp32").compute_s == pytest.approx(flops / 4e10)
    # a convolution that is not small pointwise keeps the conv grid at one thread too
    other = PhaseCost(matmul_flops=flops, matmul_ops=1, convs=[(flops, 512 * 512, 32)])
    assert phase_time(other, cpu(1, grid), "fp32").compute_s == pytest.approx(flops / 4e10)
