"""SyncBatchNorm for ddp on the CPU side: the spec's refusals, torch's conversion in the ddp
exchange, and the profiler's count of its collectives against a hand count.

Its reference test (ddp with it == one process on the global batch) needs CUDA:
tests/gpu/test_sync_batchnorm.py."""

import queue

import pytest
import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.hardware.links import Link
from dlscale.jobspec import parse_spec
from dlscale.launch.base import WorkerContext
from dlscale.profiler.batchnorm_sync import sync_batchnorm_collectives, sync_batchnorm_s
from dlscale.profiler.request import ScalingRequest
from dlscale.profiler.scaling import predict_scaling
from dlscale.profiler.trace import trace_step
from dlscale.strategies import ddp
from dlscale.train.reporter import NullReporter
from tests.small_runs import SGD, base_spec, synthetic_images
from tests.unit.test_scaling import gpu

BASE = base_spec("sync-bn", synthetic_images(64), batch_size=8, steps=2, optimizer=SGD)
SYNC = {"name": "ddp", "workers": 2, "sync_batchnorm": True}
LINK = Link("test", "test link", "pcie", bytes_per_s=10e9, latency_s=5e-6, efficiency=1.0)


def bn_model() -> nn.Module:
    """Batch norms of 8, 4 and 10 channels (2-d, 2-d and 1-d) on a 3×8×8 sample."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),  # (B, 8, 6, 6)
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 4, 3),  # (B, 4, 4, 4)
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(64, 10),
        nn.BatchNorm1d(10),
    )


def bn_trace():
    return trace_step(bn_model, torch.zeros(3, 8, 8), 16, "fp32", torch.optim.SGD, "sgd")


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_sync_batchnorm_off_cuda_is_one_line(device: str):
    with pytest.raises(UserError, match=rf"sync_batchnorm needs CUDA GPUs \(device is {device}\)"):
        parse_spec({**BASE, "device": device, "strategy": SYNC})


def test_sync_batchnorm_is_a_ddp_setting():
    for other in ({"name": "hybrid"}, {"name": "single"}, {"name": "tensor"}):
        with pytest.raises(UserError, match=r"unknown field 'strategy\.sync_batchnorm'"):
            parse_spec({**BASE, "strategy": {**other, "sync_batchnorm": True}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="`auto` finds a GPU on this machine")
def test_auto_on_a_cpu_machine_is_refused_before_any_worker(tmp_path):
    spec = parse_spec({**BASE, "device": "auto", "strategy": SYNC})
    with pytest.raises(UserError, match=r"needs CUDA GPUs \(device is auto, cpu here\)"):
        ddp.run(spec, tmp_path, None, NullReporter())
    assert list(tmp_path.iterdir()) == []  # no worker started, nothing written


def prepared(spec_fields: dict, model: nn.Module, rank: int = 0):
    """The module the ddp exchange trains (on the CPU: prepare needs no process group), and
    what it said to the launcher."""
    said = queue.Queue()
    spec = parse_spec({**BASE, "device": "cuda", **spec_fields})
    context = WorkerContext(rank, 2, rank, "", 0, events=said)
    module = ddp.DdpExchange(spec, context, torch.device("cpu")).prepare(model, None, "cpu")
    return module, [said.get_nowait() for _ in range(said.qsize())]


@pytest.mark.parametrize("sync", [True, False])
def test_the_exchange_converts_with_torch_keeping_weights_and_buffers(sync: bool):
    model = bn_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    module, said = prepared({"strategy": {**SYNC, "sync_batchnorm": sync}}, model)
    kinds = [type(each).__name__ for each in module.modules()]
    assert kinds.count("SyncBatchNorm") == (3 if sync else 0)
    assert kinds.count("BatchNorm2d") + kinds.count("BatchNorm1d") == (0 if sync else 3)
    after = module.state_dict()  # the same keys: a checkpoint loads into the plain model
    assert list(after) == list(before)
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert said == []


def test_a_model_without_batch_norm_warns_once():
    def mlp():
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    _, said = prepared({"model": {"name": "mlp"}, "strategy": SYNC}, mlp())
    assert said == [
        (
            "warn",
            (
                "strategy.sync_batchnorm: model 'mlp' has no BatchNorm layer, so nothing is "
                "synchronised",
            ),
        )
    ]
    assert prepared({"strategy": SYNC}, mlp(), rank=1)[1] == []  # worker 0 says it


def test_collectives_counted_by_hand():
    """Per call of a batch norm of C channels: a forward all-gather of 2C + 1 fp32 values
    (mean, invstd, count) and a backward all-reduce of 2C (sum_dy, sum_dy_xmu)."""
    collectives = sync_batchnorm_collectives(bn_trace())
    assert [(c.kind, c.values) for c in collectives] == [
        ("all_gather", 17),  # 2·8 + 1
        ("all_reduce", 16),
        ("all_gather", 9),  # 2·4 + 1
        ("all_reduce", 8),
        ("all_gather", 21),  # 2·10 + 1
        ("all_reduce", 20),
    ]
    assert sum(c.payload_bytes for c in collectives) == (47 + 44) * 4
    # On 4 devices a ring all-gather forwards the 3 other shares: 3 × 47 × 4 = 564 bytes; a ring
    # all-reduce sends 2·3/4 of its 44 × 4 = 176 bytes: 264.
    assert sum(c.bytes_sent_per_device(4) for c in collectives) == pytest.approx(564 + 264)
    # Seconds on a 10 GB/s link with 5 µs hops and no launch: the bytes above at 10 GB/s, plus
    # 3 hops per all-gather and 6 per all-reduce (9 each, 27 in all).
    assert sync_batchnorm_s(collectives, 4, LINK) == pytest.approx(828 / 10e9 + 27 * 5e-6)
    assert sync_batchnorm_s(collectives, 1, LINK) == 0.0


def test_a_model_without_batch_norm_sends_nothing():
    from tests.unit.test_scaling import mlp_trace

    assert sync_batchnorm_collectives(mlp_trace()) == []


def test_ddp_step_pays_them_on_the_critical_path():
    trace, hardware = bn_trace(), gpu()
    plain = predict_scaling(trace, hardware, ScalingRequest((1, 4), strategies=("ddp",)), LINK)
    synced = predict_scaling(
        trace, hardware, ScalingRequest((1, 4), strategies=("ddp",), sync_batchnorm=True), LINK
    )
    assert synced[0].step_s == plain[0].step_s  # one device: nothing to synchronise
    assert "sync_batchnorm" not in synced[0].detail
    sync_s = 828 / 10e9 + 27 * 5e-6
    assert synced[1].step_s == pytest.approx(plain[1].step_s + sync_s)
    assert synced[1].comm_s == pytest.approx(plain[1].comm_s + sync_s)
    assert synced[1].detail["sync_batchnorm"] == {
        "layers": 3,
        "all_gathers": 3,
        "all_reduces": 3,
        "payload_bytes": 364,
        "bytes_sent_per_device": pytest.approx(828),
        "seconds": pytest.approx(sync_s),
    }


def test_with_accumulation_every_micro_batch_sends_them():
    """SyncBatchNorm's collectives sit in each micro-batch's forward and backward (DDP's
    `no_sync` spares only its gradient all-reduce): K micro-batches send them K times."""
    trace, hardware = bn_trace(), gpu()
    request = ScalingRequest((4,), strategies=("ddp",))
    synced = ScalingRequest((4,), strategies=("ddp",), sync_batchnorm=True)
    plain = predict_scaling(trace, hardware, request, LINK, accumulate=3)
    both = predict_scaling(trace, hardware, synced, LINK, accumulate=3)
    sync_s = 828 / 10e9 + 27 * 5e-6
    assert both[0].step_s == pytest.approx(plain[0].step_s + 3 * sync_s)
    assert both[0].global_batch == plain[0].global_batch == 4 * 3 * trace.batch_size


def test_sync_batchnorm_needs_devices():
    with pytest.raises(UserError, match="--sync-batchnorm need --devices"):
        ScalingRequest(sync_batchnorm=True)


def test_the_setting_is_part_of_the_run_identity_only_when_on():
    """Off (the default) leaves the hash every earlier run has, so they still resume."""
    ddp = {"name": "ddp", "workers": 2}
    base = parse_spec({**BASE, "strategy": ddp}).spec_hash()
    off = parse_spec({**BASE, "strategy": {**ddp, "sync_batchnorm": False}}).spec_hash()
    on = parse_spec({**BASE, "strategy": {**ddp, "sync_batchnorm": True}}).spec_hash()
    assert off == base != on


def test_a_specs_sync_batchnorm_reaches_the_scaling_prediction(tmp_path):
    """`dlscale profile SPEC --devices 2` on a spec that trains with sync_batchnorm prices its
    collectives, as the spec's accumulate is priced, without --sync-batchnorm repeated."""
    import yaml

    from dlscale.api.profiling import profile
    from dlscale.profiler.request import ProfileRequest

    spec = {**BASE, "device": "cuda", "model": {"name": "resnet18"}, "strategy": SYNC}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = profile(ProfileRequest(str(path), hardware=("a100-40gb",)), ScalingRequest((2,)))
    (report,) = result.scaling
    (point,) = [row.point for row in report.rows if row.point.strategy == "ddp"]
    assert point.detail["sync_batchnorm"]["layers"] == 20  # ResNet-18's batch norms
