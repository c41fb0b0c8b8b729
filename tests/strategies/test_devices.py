"""Every strategy runs the one loop, so every device and precision reaches every strategy."""

import math
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from tests.small_runs import SGD, base_spec, synthetic_images

BASE = base_spec("devices", synthetic_images(600), batch_size=8, steps=8, optimizer=SGD)
STRATEGIES = {
    "single": {"name": "single"},
    "ddp": {"name": "ddp", "workers": 2},
    "ps": {"name": "ps", "mode": "async", "workers": 2},
    "pipeline": {"name": "pipeline", "stages": 2, "microbatches": 2},
    "hybrid": {"name": "hybrid", "stages": 2, "data_parallel": 2, "microbatches": 2},
}


@pytest.mark.parametrize("kind", list(STRATEGIES))
def test_cuda_on_a_machine_without_a_gpu_is_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch, kind: str
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = parse_spec({**BASE, "device": "cuda", "strategy": STRATEGIES[kind]})
    with pytest.raises(UserError, match="no CUDA GPU is visible here"):
        api.train(spec, out_dir=tmp_path)
    fp16 = parse_spec({**BASE, "device": "cpu", "precision": "fp16", "strategy": STRATEGIES[kind]})
    with pytest.raises(UserError, match="precision fp16 needs a CUDA GPU"):
        api.train(fp16, out_dir=tmp_path)
    assert not tmp_path.joinpath("run.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ps", "pipeline", "hybrid"])
def test_bf16_trains_every_strategy_on_the_cpu(tmp_path: Path, kind: str):
    """Refused before the one loop (`require_cpu_fp32`); now autocast reaches them all."""
    spec = parse_spec({**BASE, "device": "cpu", "precision": "bf16", "strategy": STRATEGIES[kind]})
    record = api.train(spec, out_dir=tmp_path)
    assert record.status == "completed" and record.spec["precision"] == "bf16"
    assert math.isfinite(record.epochs[-1].train_loss)
    assert record.final.val_accuracy is not None
