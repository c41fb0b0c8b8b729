"""The systolic-array model against SCALE-Sim (its cycle-accurate compute modules, run here):
exact cycles for small GEMMs under every dataflow, the convolution-to-GEMM mapping, and bad
input in one line."""

import numpy as np
import pytest
import torch

from dlscale.errors import UserError
from dlscale.hardware.catalogue import parse_entry
from dlscale.models import build_model
from dlscale.profiler.systolic import compute_cycles, layer_gemms, spatio_temporal
from dlscale.profiler.systolic_report import parse_dataflows
from dlscale.profiler.tensor_flow import record_flow


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

    gemms = {
        g.name: g
        for g in layer_gemms(record_flow(build_model("lenet", {}), torch.zeros(1, 1, 28, 28)), 1)
    }
    for name, (size, channels, filters) in {"conv1": (28, 1, 6), "conv2": (12, 6, 16)}.items():
        topology = topologies()
        # name, ifmap h, w, filter h, w, channels, filters, stride h, w
        row = [name, size, size, 5, 5, channels, filters, 1, 1]  # a topology file's row
        topology.load_layer_params_from_list(name, row)
        topology.topo_calc_hyperparams()
        pixels = topology.get_layer_ofmap_dims(0)
        gemm = gemms[f"{name} forward"]
        assert gemm.m == pixels[0] * pixels[1]
        assert gemm.k == topology.get_layer_window_size(0) and gemm.n == filters


def test_each_dataflow_keeps_its_operand_in_place():
    assert spatio_temporal("os", 10, 20, 30) == (10, 30, 20)  # outputs: M × N, over K
    assert spatio_temporal("ws", 10, 20, 30) == (20, 30, 10)  # weights: K × N, over M
    assert spatio_temporal("is", 10, 20, 30) == (20, 10, 30)  # inputs: K × M, over N


def test_bad_dataflows_and_arrays_are_one_line(tmp_path):
    with pytest.raises(UserError, match="'xs' is not a dataflow"):
        parse_dataflows("ws,xs")
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
