"""AlexNet on the GTX 580s it was trained on (Krizhevsky et al., NIPS 2012: two 3 GB GPUs, one
column each, batch 128, SGD with momentum): the profiler's memory for the whole network on one
GPU against each GPU's share of the two-column split, worked out from its own figures."""

from pathlib import Path

import pytest

from dlscale.api.profiling import profile
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION
from dlscale.profiler.request import ProfileRequest, ScalingRequest

GIB = 2**30
PAPER_PARAMETERS = 60_965_224  # models/alexnet.py: the paper's layer shapes at 1000 classes


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))


def one_and_two_gpus(batch: int):
    """(one GPU's report, training memory, the two-column split's point) at `batch`."""
    request = ProfileRequest(
        target="alexnet_2gpu", batch_size=batch, optimizer="momentum", hardware=("gtx-580",)
    )
    result = profile(request, ScalingRequest(devices=(2,), strategies=("tensor",)))
    ((row,),) = [scaled.rows for scaled in result.scaling]
    return result.reports[0], result.memory, row.point


def test_the_paper_batch_on_one_gtx_580_and_on_two():
    report, memory, split = one_and_two_gpus(128)
    card = report.hardware.memory_bytes
    assert card == 3 * GIB
    # One GPU holds the whole network: fp32 weights, their gradients and one momentum buffer
    # each (4 bytes a parameter, three times), the activations autograd saves, the batch.
    assert memory.weights_bytes == memory.optimizer_state_bytes == PAPER_PARAMETERS * 4
    assert memory.total_bytes == (
        3 * PAPER_PARAMETERS * 4 + memory.activations_bytes + memory.batch_bytes
    )
    # Each GPU of the split holds its column's parameters and its share of the activations.
    per_gpu = split.detail["memory_per_device_bytes"]
    assert split.detail["degree"] == 2 and per_gpu < memory.total_bytes
    assert PAPER_PARAMETERS / 2 < split.detail["params_per_device"] < PAPER_PARAMETERS
    assert split.fits and per_gpu < card
    # What dlscale's model says at the paper's batch: the whole network fits one card's 90%
    # (docs/hardware.md says so, and what the model leaves out), with the largest batch that
    # fits below twice the paper's.
    assert report.verdict.fits == (memory.total_bytes <= card * USABLE_MEMORY_FRACTION)
    assert report.verdict.fits and memory.total_bytes < card
    assert 128 < report.verdict.max_batch < 256


def test_twice_the_paper_batch_needs_the_two_gpus():
    report, memory, split = one_and_two_gpus(256)
    card = report.hardware.memory_bytes
    assert memory.total_bytes > card and not report.verdict.fits  # one 3 GB GPU cannot hold it
    assert split.fits and split.detail["memory_per_device_bytes"] < card  # each of two can
