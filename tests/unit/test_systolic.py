"""The systolic-array model against SCALE-Sim (its cycle-accurate compute modules, run here):
exact cycles for small GEMMs under every dataflow, the convolution-to-GEMM mapping; the GEMMs a
traced step feeds it against hand counts and FlopCounterMode; and bad input in one line."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from dlscale.errors import UserError
from dlscale.hardware.catalogue import parse_entry
from dlscale.models import build_model
from dlscale.profiler.systolic import (
    Unmapped,
    compute_cycles,
    spatio_temporal,
    step_gemms,
    unmapped,
)
from dlscale.profiler.systolic_report import parse_dataflows, unmapped_line
from dlscale.profiler.trace import trace_step


def traced(build, sample: torch.Tensor, batch: int):
    """One traced training step (SGD) of `build()` at `batch` samples like `sample`."""
    return trace_step(build, sample, batch, "fp32", lambda p: torch.optim.SGD(p, lr=0.1), "sgd")


def gemms_of(step) -> dict[str, list[tuple[int, int, int, int]]]:
    """{"module phase: role": [(M, K, N, repeats), ...]} of a traced step."""
    found: dict[str, list] = {}
    for gemm in step_gemms(step):
        found.setdefault(gemm.name, []).append((gemm.m, gemm.k, gemm.n, gemm.repeats))
    return found


def scalesim_cycles(dataflow: str, m: int, k: int, n: int, rows: int, cols: int) -> int:
    """SCALE-Sim's compute cycles: the length of its demand matrices for the GEMM."""
    from scalesim.compute.systolic_compute_is import systolic_compute_is
    from scalesim.compute.systolic_compute_os import systolic_compute_os
    from scalesim.compute.systolic_compute_ws import systolic_compute_ws
    from scalesim.scale_config import scale_config

    config = scale_config()
    config.force_valid()
    config.set_arr_dims(rows, cols)
    compute = {"os": systolic_compute_os, "ws": systolic_compute_ws, "is": systolic_compute_is}[
        dataflow
    ]()
    compute.set_params(
        config_obj=config,
        ifmap_op_mat=np.arange(m * k).reshape(m, k),
        filter_op_mat=np.arange(k * n).reshape(k, n) + m * k,
        ofmap_op_mat=np.arange(m * n).reshape(m, n) + m * k + k * n,
    )
    compute.create_demand_matrices()
    ifmap, filters, ofmap = compute.get_demand_matrices()
    assert ifmap.shape[0] == filters.shape[0] == ofmap.shape[0]
    return ifmap.shape[0]


GEMMS = [(8, 8, 8), (10, 6, 7), (16, 27, 6), (5, 3, 9), (64, 25, 6), (33, 65, 17)]


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
@pytest.mark.parametrize(("rows", "cols"), [(4, 4), (8, 8), (4, 8), (16, 4)])
def test_cycles_equal_scalesims(dataflow, rows, cols):
    for m, k, n in GEMMS:
        ours = compute_cycles(dataflow, m, k, n, rows, cols)[1]
        assert ours == scalesim_cycles(dataflow, m, k, n, rows, cols), (m, k, n)


def test_a_convolution_maps_as_scalesim_maps_it():
    """LeNet's convolutions: SCALE-Sim's operand matrices (output pixels × window, window ×
    filters) have our GEMM's M, K and N."""
    from scalesim.topology_utils import topologies

    step = traced(lambda: build_model("lenet", {}), torch.zeros(1, 28, 28), 1)
    gemms = {g.name: g for g in step_gemms(step)}
    for name, (size, channels, filters) in {"conv1": (28, 1, 6), "conv2": (12, 6, 16)}.items():
        topology = topologies()
        # name, ifmap h, w, filter h, w, channels, filters, stride h, w
        row = [name, size, size, 5, 5, channels, filters, 1, 1]  # a topology file's row
        topology.load_layer_params_from_list(name, row)
        topology.topo_calc_hyperparams()
        pixels = topology.get_layer_ofmap_dims(0)
        gemm = gemms[f"{name} forward: conv"]
        assert gemm.m == pixels[0] * pixels[1]
        assert gemm.k == topology.get_layer_window_size(0) and gemm.n == filters


def test_a_strided_convolutions_input_gradient_carries_the_forwards_multiply_adds():
    """Stride 2, 3×3, 4 → 8 channels on 16×16, batch 2: 8×8 output pixels. Its input's gradient
    is pixels × filters × window (col2im), the forward's multiply-adds, not the 4× a
    convolution over the stride-dilated gradient multiplies; torch counts it so too."""
    build = lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 8, 3, 2, 1))  # noqa: E731
    gemms = gemms_of(traced(build, torch.zeros(3, 16, 16), 2))
    pixels, window, filters = 2 * 8 * 8, 4 * 3 * 3, 8
    assert gemms["1 forward: conv"] == [(pixels, window, filters, 1)]
    assert gemms["1 backward: input grad"] == [(pixels, filters, window, 1)]  # 36,864 MACs
    assert gemms["1 backward: weight grad"] == [(window, pixels, filters, 1)]
    assert "0 backward: input grad" not in gemms  # the data needs no gradient
    torch.manual_seed(0)
    model = build()
    hidden = torch.randn(2, 4, 16, 16, requires_grad=True)  # conv 1's input, as in the step
    with FlopCounterMode(display=False) as counter:
        model[1](hidden).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    backward = counts[torch.ops.aten.convolution_backward]
    assert backward == 2 * (2 * pixels * window * filters)  # input and weight grads, as 2 × MACs


class Mixed(nn.Module):
    """Every kind of matrix product: grouped, strided and transposed convolutions, a bare
    matmul, a batched one, and scaled-dot-product attention (the CPU's fused kernel)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.weight = nn.Parameter(torch.zeros(4 * 16, 32))  # (in, out): transformers' Conv1D
        self.project = nn.Linear(32, 3 * 32)

    def forward(self, x):  # (B, 3, 16, 16)
        x = self.up(self.grouped(self.stem(x)))  # (B, 4, 16, 16)
        tokens = x.flatten(2).transpose(1, 2).reshape(x.shape[0], 16, 64)  # (B, 16, 64)
        h = tokens @ self.weight  # (B, 16, 32)
        q, k, v = self.project(h).view(x.shape[0], 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, 2, 16, 16)
        return torch.bmm(a.flatten(0, 1), a.flatten(0, 1).transpose(1, 2)).flatten(1)


@pytest.mark.parametrize(
    ("name", "build", "sample"),
    [
        ("mixed", Mixed, torch.zeros(3, 16, 16)),
        ("resnet18", lambda: build_model("resnet18", {"num_classes": 10}), torch.zeros(3, 32, 32)),
        ("gpt", lambda: build_model("gpt", {"n_layer": 1, "d_model": 32, "n_head": 2}), None),
    ],
)
def test_every_matrix_product_is_mapped_with_flop_counter_modes_multiply_adds(name, build, sample):
    """Per module and phase, the GEMMs' MACs are the trace's matrix-product FLOPs / 2 (torch's
    FlopCounterMode formulas); nothing is left but the step's vector work.

    torch's formula for a grouped convolution's weight gradient counts groups × its work (see
    tests/unit/test_profiler.py); the GEMMs carry the real multiply-adds."""
    if sample is None:
        sample = torch.zeros(16, dtype=torch.long)
    step = traced(build, sample, 2)
    for layer in step.layers:
        for phase in (layer.forward, layer.backward):
            torch_count = sum(
                g.macs * (g.repeats if g.name == "weight grad" else 1) for g in phase.gemms
            )
            assert 2 * torch_count == phase.matmul_flops, layer.name
    left = unmapped(step)
    assert left.products == {}
    other = sum(r.forward.other_flops + r.backward.other_flops for r in step.layers)
    assert left.flops == left.other_flops == other + step.optimizer_flops
    matmul = sum(r.forward.matmul_flops + r.backward.matmul_flops for r in step.layers)
    assert left.mapped_flops == matmul and left.step_flops == matmul + left.flops


def test_attention_is_batch_times_heads_gemms_by_hand():
    """Mixed's attention: batch 2 × 2 heads of 16, 16 tokens; the CPU's fused kernel (Q·Kᵀ and
    P·V; backward recomputes Q·Kᵀ, then dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q); its own x @ W and bmm."""
    gemms = gemms_of(traced(Mixed, torch.zeros(3, 16, 16), 2))
    heads, tokens, size = 2 * 2, 16, 16
    assert gemms["(model) forward: Q·Kᵀ"] == [(tokens, size, tokens, heads)]
    assert gemms["(model) forward: P·V"] == [(tokens, tokens, size, heads)]
    for role in ("Q·Kᵀ", "dO·Vᵀ", "Pᵀ·dO", "dS·K", "dSᵀ·Q"):
        assert len(gemms[f"(model) backward: {role}"]) == 1, role
    assert (2 * tokens, 64, 32, 1) in gemms["(model) forward: mm"]  # Conv1D-style x @ W
    assert gemms["(model) forward: bmm"] == [(tokens, size, tokens, heads)]
    # the transposed convolution: 2 × 8×8 input pixels × 8 channels in × (4 out × 2×2 kernel)
    assert gemms["up forward: conv"] == [(2 * 8 * 8, 8, 4 * 4, 1)]
    # the grouped one: 4 groups of 2 × 8×8 pixels × (2 channels × 3×3) × 2 filters
    assert gemms["grouped forward: conv"] == [(2 * 8 * 8, 2 * 9, 2, 4)]


def test_what_the_arrays_leave_out_is_one_line():
    """A step of 1,000 FLOPs: 100 of vector work, 150 in a kernel no GEMM is known for."""
    left = Unmapped(step_flops=1000, other_flops=100, products={"_flash_attention_forward": 150})
    assert (left.flops, left.mapped_flops, left.share) == (250, 750, 0.25)
    assert unmapped_line(left) == (
        "25.0% of the step's 1 kFLOP are not mapped onto the arrays (100 FLOP of elementwise "
        "ops, norms, softmax, loss and optimizer; 150 FLOP of matrix products by "
        "aten._flash_attention_forward): the times above leave them out"
    )


def test_each_dataflow_keeps_its_operand_in_place():
    assert spatio_temporal("os", 10, 20, 30) == (10, 30, 20)  # outputs: M × N, over K
    assert spatio_temporal("ws", 10, 20, 30) == (20, 30, 10)  # weights: K × N, over M
    assert spatio_temporal("is", 10, 20, 30) == (20, 10, 30)  # inputs: K × M, over N


def test_bad_dataflows_and_arrays_are_one_line(tmp_path):
    with pytest.raises(UserError, match="'xs' is not a dataflow"):
        parse_dataflows("ws,xs")
    with pytest.raises(UserError, match="--dataflow: ws is given twice"):
        parse_dataflows("ws,os,ws")  # it was mapped once without a word
    assert parse_dataflows("os, ws") == ("os", "ws")
    with pytest.raises(UserError, match="at least 1 row and 1 column"):
        compute_cycles("ws", 8, 8, 8, 0, 4)
    entry = {
        "name": "npu",
        "display_name": "NPU",
        "kind": "tpu",
        "vendor": "me",
        "peak_tflops": {"fp32": 1},
        "memory_gib": 1,
        "memory_bandwidth_gbs": 10,
        "systolic": {"rows": 0, "cols": 4, "clock_mhz": 500, "sram_kib": 64},
    }
    with pytest.raises(UserError, match=r"systolic.rows must be a whole number ≥ 1, not 0"):
        parse_entry(entry, "my.toml")
