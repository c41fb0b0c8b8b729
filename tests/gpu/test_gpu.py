"""Every strategy on CUDA, at fp32, bf16 and fp16: the one loop's device paths, on a real GPU.

Skipped, saying why, where no GPU is visible; `make gpu-check` runs these and prints a table.
"""

import math
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.train.loop import Trainer
from tests.small_runs import SGD, base_spec, final_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU and none is visible here; on a GPU machine run make gpu-check",
    ),
]

BASE = base_spec(
    "gpu",
    {"name": "digits", "image_size": 28},
    batch_size=16,
    steps=8,
    optimizer=SGD,
    device="cuda",
)


def strategies() -> dict[str, dict]:
    """What fits the GPUs here: NCCL wants a GPU per process; ps workers share theirs."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return {
        "single": {"name": "single"},
        "ddp": {"name": "ddp", "workers": gpus},
        "ps": {"name": "ps", "mode": "async", "workers": 2},
        "pipeline": {"name": "pipeline", "stages": min(2, gpus), "microbatches": 2},
        "hybrid": {"name": "hybrid", "stages": 1, "data_parallel": min(2, gpus), "microbatches": 2},
        "tensor": {"name": "tensor", "degree": min(2, gpus)},
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind", list(strategies()))
def test_every_strategy_trains_on_cuda(tmp_path: Path, kind: str, precision: str):
    if kind == "tensor" and precision == "fp16":  # refused, in one line, before anything starts
        with pytest.raises(UserError, match="strategy tensor trains in fp32 or bf16"):
            parse_spec({**BASE, "precision": precision, "strategy": strategies()[kind]})
        return
    spec = parse_spec({**BASE, "precision": precision, "strategy": strategies()[kind]})
    record = api.train(spec, out_dir=tmp_path)
    assert record.status == "completed" and record.final.step == 8
    assert record.environment["device"].startswith("cuda")
    assert record.final.peak_memory_kind == "cuda_max_allocated"
    assert math.isfinite(record.epochs[-1].train_loss)
    assert all(w.status == "completed" for w in record.workers)
    if kind == "ddp":
        assert record.distributed["backend"] == "nccl"
    if kind == "tensor":
        section = record.tensor
        assert section["backend"] == "nccl"
        assert section["collectives_per_step"] == section["predicted_collectives_per_step"]


def test_pinned_memory_and_loader_workers_feed_the_gpu(tmp_path: Path):
    spec = parse_spec({**BASE, "loader": {"workers": 2, "pin_memory": True}})
    record = api.train(spec, out_dir=tmp_path)
    assert record.status == "completed" and not record.warnings


@pytest.mark.parametrize("loader", [{}, {"workers": 1}, {"pin_memory": False}])
def test_the_loops_batches_arrive_pinned_on_cuda_unless_the_spec_says_not(tmp_path, loader):
    """Pinned by default (gathered straight into page-locked memory with no workers; by
    DataLoader's pinning thread with them) and copied without blocking; pageable if told."""
    trainer = Trainer(parse_spec({**BASE, "loader": loader}), tmp_path)
    x, y, *_ = next(iter(trainer.train_loader))
    pinned = loader.get("pin_memory", True)
    assert x.is_pinned() == pinned and y.is_pinned() == pinned
    assert trainer.train_loader.pin_memory == pinned  # the loop's non_blocking
    assert trainer.run_epoch(0) is not None and trainer.step > 0


def test_ddp_on_one_gpu_equals_one_process_on_it(tmp_path: Path):
    """The reference on the GPU too: one NCCL worker's weights equal one process's."""
    api.train(parse_spec(BASE), out_dir=tmp_path / "single")
    api.train(
        parse_spec({**BASE, "strategy": {"name": "ddp", "workers": 1}}), out_dir=tmp_path / "ddp"
    )
    one, other = (final_weights(tmp_path / name) for name in ("single", "ddp"))
    for name, value in one.items():
        assert torch.allclose(other[name], value, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_accumulating_on_cuda_tracks_one_batch_of_k_b(tmp_path: Path, precision: str):
    """4 micro-batches of 4 against one batch of 16 on the GPU (ddp over NCCL where there are
    GPUs for 2 workers), fp16's GradScaler included: fp32 within 1e-4, fp16 within its
    rounding; ddp all-reduces once per optimizer step."""
    gpus = torch.cuda.device_count()
    strategy = {"name": "ddp", "workers": 2} if gpus >= 2 else {"name": "single"}
    workers = strategy.get("workers", 1)
    big = {**BASE, "precision": precision, "batch_size": 16}
    api.train(parse_spec(big), out_dir=tmp_path / "big")
    micro = {**big, "batch_size": 16 // (4 * workers), "accumulate": 4, "strategy": strategy}
    record = api.train(parse_spec(micro), out_dir=tmp_path / "micro")
    if workers > 1:
        assert record.distributed["allreduces_per_step"] == 1.0
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    one, other = (final_weights(tmp_path / name) for name in ("big", "micro"))
    for name, value in one.items():
        difference = (other[name] - value).norm() / value.norm().clamp_min(1e-12)
        assert difference <= tolerance, (name, float(difference))
