"""How benchmarks/prediction_vs_published.py predicts a published run's setup, in dlscale's own
terms, worked out by hand: weights on the host (TensorFlow's parameter_server with
local_parameter_device=cpu) as the ps strategy on one GPU over PCIe 3.0 x16, and the batch's
host-to-device copy that a run making its images on the GPU does not pay."""

import importlib.util
import sys
from pathlib import Path

import pytest

from dlscale.api.profiling import profile
from dlscale.profiler.request import ProfileRequest, ScalingRequest

PCIE3_BYTES_PER_S = 15.75e9  # links.toml pcie3-x16: one direction
PCIE3_EFFICIENCY = 0.65
PCIE3_LATENCY_S = 5e-6
PCIE3_LAUNCH_S = 8.4e-6


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))


def test_weights_on_the_host_cost_one_push_and_pull_over_pcie_each_step():
    request = ProfileRequest(
        target="lenet", batch_size=8, optimizer="sgd", hardware=("p100-sxm2-16gb",)
    )
    scaling = ScalingRequest(devices=(1,), interconnect="pcie3-x16", strategies=("ps",))
    result = profile(request, scaling)
    (report,) = result.reports
    ((row,),) = [scaled.rows for scaled in result.scaling]
    # Gradients out, then, once the server has applied them, the weights back (dlscale's ps
    # wire: the reply follows the update): the fp32 parameters' bytes twice, at 15.75 GB/s ×
    # 0.65; four blocking messages a step (5 µs each) and two collectives launched (8.4 µs
    # each, NCCL's base latency). Not hidden behind the step. The update runs on the server,
    # not on the worker: the same optimizer time, moved.
    gradients = result.trace.trainable_params * 4
    transfer_s = gradients / (PCIE3_BYTES_PER_S * PCIE3_EFFICIENCY)
    messages_s = 4 * PCIE3_LATENCY_S + 2 * PCIE3_LAUNCH_S
    assert row.point.strategy == "ps" and row.point.devices == 1
    assert row.point.step_s == pytest.approx(report.prediction.step_s + 2 * transfer_s + messages_s)
    assert row.point.detail["server_update_s"] == pytest.approx(report.prediction.optimizer_s)
    # The batch (images and labels) crosses the host link once per step: the part a run that
    # makes its images on the GPU does not pay.
    assert report.prediction.h2d_s == pytest.approx(result.trace.batch_bytes / PCIE3_BYTES_PER_S)


def _benchmark_module():
    path = Path(__file__).parents[2] / "benchmarks" / "prediction_vs_published.py"
    spec = importlib.util.spec_from_file_location("prediction_vs_published", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_scaling_rows_divide_by_the_single_device_tables_figure():
    # TensorFlow's benchmarks page was revised with other figures for the same DGX-1 runs
    # (VGG16 on one P100 at batch 64: 132 images/s, then 154): a scaling row's one-device
    # throughput is the single-device table's for the same model, batch and GPU, one revision.
    bench = _benchmark_module()
    single = {
        (run.model, run.batch): run.images_per_s
        for run in bench.SINGLE_DEVICE_RUNS
        if run.hardware == bench.SCALING_DEVICE and run.source == bench.TF_BENCHMARKS
    }
    dgx1 = [run for run in bench.SCALING_RUNS if run.framework == "tf-nccl1"]
    assert len(dgx1) == 8
    for run in dgx1:
        assert run.source == bench.TF_BENCHMARKS
        assert run.measured_one == single[run.model, run.batch], run.label
    # The revision read (tests of May 2017), not the earlier one (132 and 124 images/s)
    assert (single["vgg16", 64], single["vgg16", 32]) == (154, 144)
