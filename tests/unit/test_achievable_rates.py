"""Catalogue devices' achievable rates: the efficiency per precision, Winograd's saving on 3×3
stride-1 convolutions, and prices with their sources; every number worked out by hand."""

from pathlib import Path

import pytest
import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.hardware import Hardware, load_catalogue
from dlscale.hardware.catalogue import entry_to_toml, parse_catalogue
from dlscale.profiler.recorder import PhaseCost
from dlscale.profiler.roofline import phase_time
from dlscale.profiler.trace import trace_step
from tests.toy_hardware import toy_hardware

T = 1e12


def gpu(**overrides) -> Hardware:
    """A GPU with no efficiency of its own (the kind's defaults apply) and no per-op cost."""
    fields = {
        "kind": "gpu",
        "peak_flops": {"fp32": 10 * T, "bf16": 100 * T},
        "memory_bandwidth_bytes_per_s": 1e12,
        "compute_efficiency": None,
        "memory_efficiency": None,
        "op_overhead_s": 0.0,
    }
    return toy_hardware(**{**fields, **overrides})


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))


def test_each_precision_takes_its_own_efficiency():
    hw = gpu(compute_efficiency=0.8, compute_efficiency_by_precision={"bf16": 0.5})
    assert hw.matmul_rate("bf16", 1e12) == pytest.approx(100 * T * 0.5)  # its own figure
    assert hw.matmul_rate("fp32", 1e12) == pytest.approx(10 * T * 0.8)  # the entry's one figure
    # fp16 has no units here: it runs at the fp32 peak, so at fp32's efficiency
    assert hw.matmul_rate("fp16", 1e12) == pytest.approx(10 * T * 0.8)
    assert gpu().matmul_rate("bf16", 1e12) == pytest.approx(100 * T * 0.7)  # the GPU default


def test_shipped_efficiencies_are_cited_and_used():
    catalogue = load_catalogue()
    v100, h100, p100 = (
        catalogue["v100-sxm2-16gb"],
        catalogue["h100-sxm"],
        catalogue["p100-sxm2-16gb"],
    )
    # Markidis et al. 2018: 83 of 125 TFLOP/s on Tensor Cores, a seventh of that in fp32
    assert v100.matmul_rate("fp16", 1e12) == pytest.approx(125 * T * 0.66)
    assert pytest.approx(0.76, abs=0.005) == 83 / 7 / 15.7
    assert h100.matmul_rate("bf16", 1e12) == pytest.approx(989.4 * T * 0.68)  # 675 measured
    assert p100.matmul_rate("fp32", 1e12) == pytest.approx(10.6 * T * 0.7)  # none published
    for device in catalogue.values():
        if device.compute_efficiency_by_precision:
            assert device.efficiency_source, device.name
            assert set(device.compute_efficiency_by_precision) <= set(device.peak_flops)


def test_winograd_counts_a_marked_gpus_3x3_convs_at_fp32_only():
    marked = gpu(compute_efficiency=0.5, winograd_convs=True)
    direct = 10 * T * 0.5
    assert marked.conv_rate("fp32", 1e9, 9, 100, winograd=True) == pytest.approx(direct * 36 / 16)
    assert marked.conv_rate("fp32", 1e9, 9, 100) == pytest.approx(direct)  # not a 3×3 s1 conv
    assert marked.conv_rate("bf16", 1e9, 9, 100, winograd=True) == pytest.approx(50 * T)  # TC
    unmarked = gpu(compute_efficiency=0.5)  # a Kepler card, a CPU, a TPU
    assert unmarked.conv_rate("fp32", 1e9, 9, 100, winograd=True) == pytest.approx(direct)
    # a measured entry keeps its grid: the library's choice is in what it timed
    grid = [[1, 1, 3e9], [1e6, 1e6, 3e9]]
    local = gpu(name="local", winograd_convs=True, measured={"conv_flops_per_s": {"forward": grid}})
    assert local.conv_rate("fp32", 1e9, 9, 100, winograd=True) == pytest.approx(3e9)


def test_roofline_gives_each_convolution_its_own_algorithm():
    hw = gpu(compute_efficiency=0.5, memory_efficiency=1.0, winograd_convs=True)
    cost = PhaseCost(
        matmul_flops=int(3e12),
        matmul_ops=2,
        convs=[(int(1e12), 9, 100), (int(2e12), 25, 100)],
        conv_winograd=[True, False],
    )
    seconds = phase_time(cost, hw, "fp32").compute_s
    assert seconds == pytest.approx(1e12 / (5 * T * 2.25) + 2e12 / (5 * T))
    unflagged = PhaseCost(matmul_flops=int(1e12), matmul_ops=1, convs=[(int(1e12), 9, 100)])
    assert phase_time(unflagged, hw, "fp32").compute_s == pytest.approx(1e12 / (5 * T))


@pytest.mark.parametrize(
    ("conv", "options", "eligible"),
    [
        (nn.Conv2d, {"kernel_size": 3, "padding": 1}, True),
        (nn.Conv2d, {"kernel_size": 3, "stride": 2, "padding": 1}, False),
        (nn.Conv2d, {"kernel_size": 5, "padding": 2}, False),
        (nn.Conv2d, {"kernel_size": 1}, False),
        (nn.Conv2d, {"kernel_size": 3, "padding": 2, "dilation": 2}, False),
        (nn.Conv2d, {"kernel_size": 3, "padding": 1, "groups": 4}, False),  # depthwise
        (nn.ConvTranspose2d, {"kernel_size": 3, "padding": 1}, False),
    ],
)
def test_the_tracer_flags_3x3_stride_1_convolutions(conv, options: dict, eligible: bool):
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    step = trace_step(lambda: conv(4, 4, **options), torch.zeros(4, 8, 8), 2, "fp32", sgd, "sgd")
    layer = step.layers[0]
    assert layer.forward.conv_winograd == [eligible]
    assert layer.backward.conv_winograd == [eligible] * len(layer.backward.convs)


ENTRY = """\
[[device]]
name = "priced"
display_name = "Priced GPU"
kind = "gpu"
vendor = "Acme"
peak_tflops = { fp32 = 10, bf16 = 100 }
memory_gib = 16
memory_bandwidth_gbs = 500
"""


def test_efficiency_table_and_winograd_flag_parse_and_round_trip():
    text = ENTRY + (
        'compute_efficiency_by_precision = { fp32 = 0.75, bf16 = 0.5 }\nefficiency_source = "a"\n'
        "winograd_convs = true\n"
    )
    (hw,) = parse_catalogue(text, "x.toml")
    assert hw.compute_efficiency_by_precision == {"fp32": 0.75, "bf16": 0.5}
    assert hw.winograd_convs and hw.efficiency_source == "a"
    assert parse_catalogue(entry_to_toml(hw), "y.toml") == [hw]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("compute_efficiency_by_precision = { fp16 = 0.5 }\n", "peak_tflops does not list"),
        ("compute_efficiency_by_precision = { bf16 = 1.5 }\n", "must be ≤ 1"),
        ("compute_efficiency_by_precision = 0.5\n", "must be a table"),
        ("winograd_convs = 1\n", "true or false"),
        ("price_per_hour = 2.49\n", "needs its price_source and price_date"),
    ],
)
def test_bad_rate_and_price_fields_are_one_line(extra: str, problem: str):
    with pytest.raises(UserError, match=problem):
        parse_catalogue(ENTRY + extra, "x.toml")


def test_prices_parse_with_their_source_and_date():
    text = ENTRY + (
        'price_per_hour = 2.49\nprice_source = "https://example.com/p"\nprice_date = "2026-11"\n'
    )
    (hw,) = parse_catalogue(text, "x.toml")
    assert (hw.price_per_hour, hw.price_source, hw.price_date) == (
        2.49,
        "https://example.com/p",
        "2026-11",
    )
    for device in load_catalogue().values():
        if device.price_per_hour is not None:
            assert device.price_source.startswith("https://") and device.price_date[:2] == "20"
    assert load_catalogue()["h100-sxm"].price_per_hour == 2.49  # a GPU cloud's rate, 2026-11


@pytest.mark.parametrize(
    ("conv", "sample"),
    [(nn.Conv1d, torch.zeros(4, 8)), (nn.Conv3d, torch.zeros(4, 8, 8, 8))],
)
def test_only_2d_3x3_convolutions_are_winograd_eligible(conv, sample):
    # A 1-D kernel of 3 runs as a 1×3 filter (cuDNN's Winograd needs 3×3), and a 3×3×3 one
    # would not save F(2×2, 3×3)'s 36/16: neither gets its 2.25×.
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    step = trace_step(lambda: conv(4, 4, kernel_size=3, padding=1), sample, 2, "fp32", sgd, "sgd")
    layer = step.layers[0]
    assert layer.forward.conv_winograd == [False]
    assert layer.backward.conv_winograd == [False] * len(layer.backward.convs)
