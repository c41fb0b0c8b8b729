"""The single-device strategy through dlscale.api: the run record, warnings, precisions."""

import json
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.train import loop

SMALL = {
    "name": "small",
    "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
    "data": {"name": "synthetic", "shape": [20], "num_classes": 4, "num_samples": 400},
    "batch_size": 16,
    "optimizer": {"name": "adam", "lr": 0.01},
    "device": "cpu",
}


def spec(**changes):
    return parse_spec({**SMALL, **changes})


def test_run_record_schema(tmp_path: Path, reporter):
    record = api.train(spec(epochs=2), out_dir=tmp_path, reporter=reporter)
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert on_disk == json.loads(json.dumps(record.to_json()))
    assert on_disk["schema"] == "dlscale.run/2" and on_disk["status"] == "completed"
    assert len(on_disk["spec_hash"]) == 16 and on_disk["spec"]["batch_size"] == 16
    env = on_disk["environment"]
    assert env["packages"]["torch"].startswith("2.13.0") and env["cpu_count"] >= 1
    assert env["cpu_model"] and env["device"] == "cpu" and env["gpu"] is None
    assert on_disk["plan"] == {
        "steps_per_epoch": 20,
        "total_steps": 40,
        "epochs": 2,
        "batch_size": 16,
        "global_batch_size": 16,
        "accumulate": 1,
    }
    assert [e["epoch"] for e in on_disk["epochs"]] == [1, 2]
    assert [s["step"] for s in on_disk["steps"]] == list(range(1, 41))
    step = on_disk["steps"][5]
    assert step["step_s"] == pytest.approx(step["data_wait_s"] + step["h2d_s"] + step["compute_s"])
    final = on_disk["final"]
    for key in ("val_accuracy", "val_loss", "train_samples_per_s", "wall_s", "peak_memory_bytes"):
        assert final[key] is not None and final[key] > 0, key
    assert final["val_accuracy"] > 0.9  # the synthetic classes are separable
    timing = on_disk["timing"]
    shares = timing["data_wait_share"] + timing["h2d_share"] + timing["compute_share"]
    assert shares == pytest.approx(1.0) and timing["samples"] == 40 * 16
    assert reporter.events[0][0] == "start"
    assert reporter.of("finish") and len(reporter.of("epoch")) == 2


def test_steps_that_end_mid_epoch_still_validate_and_checkpoint(tmp_path: Path):
    record = api.train(spec(steps=25), out_dir=tmp_path)
    assert record.final.step == 25 and record.epochs[-1].step == 25
    assert record.checkpoints[-1].endswith("step-00000025.pt")


class SlowDataset(TensorDataset):
    """A data set whose reads take real time, like decoding images from a slow disk."""

    def __getitem__(self, index):
        time.sleep(0.02)
        return super().__getitem__(index)


def test_a_starving_loop_warns_once_with_the_fix(tmp_path: Path, reporter, monkeypatch):
    real_build = loop.build_data

    def slow_build(data_spec, seed, stage=False, run=None):
        bundle = real_build(data_spec, seed, stage=stage, run=run)
        bundle.train = SlowDataset(*bundle.train.tensors)
        return bundle

    monkeypatch.setattr(loop, "build_data", slow_build)
    record = api.train(spec(steps=30), out_dir=tmp_path, reporter=reporter)
    warnings = reporter.of("warn")
    assert len(warnings) == 1 and "waits for data" in warnings[0]
    assert "loader.workers (now 0)" in warnings[0]
    assert record.warnings == warnings
    # Each of the 30 batches slept 20 ms while loading (the loader reads a batch in one call):
    # data wait counts at least that, however loaded the machine is (a share would not).
    assert record.timing.data_wait_s >= 30 * 0.02


def test_a_fed_loop_does_not_warn(tmp_path: Path, reporter):
    api.train(spec(epochs=2), out_dir=tmp_path, reporter=reporter)
    assert reporter.of("warn") == []


def test_settings_ignored_at_run_time_are_warned_about(tmp_path: Path, reporter):
    job = spec(steps=2, loader={"pin_memory": True}, optimizer={"name": "sgd", "momentum": 0.5})
    record = api.train(job, out_dir=tmp_path, reporter=reporter)
    assert reporter.of("warn") == [
        "optimizer.momentum is ignored by optimizer 'sgd'",
        "loader.pin_memory is ignored on cpu",
    ]
    assert record.warnings == reporter.of("warn")


def test_bf16_training_learns(tmp_path: Path):
    record = api.train(spec(epochs=3, precision="bf16"), out_dir=tmp_path)
    assert record.final.val_accuracy > 0.8


def test_loader_workers_give_the_same_weights_as_none(tmp_path: Path):
    """Worker processes change where batches are made, never which batches are made."""
    api.train(spec(steps=12), out_dir=tmp_path / "inline")
    api.train(spec(steps=12, loader={"workers": 2}), out_dir=tmp_path / "workers")
    inline = torch.load(tmp_path / "inline/checkpoints/step-00000012.pt", weights_only=True)
    workers = torch.load(tmp_path / "workers/checkpoints/step-00000012.pt", weights_only=True)
    for name, tensor in inline["model"].items():
        assert torch.equal(workers["model"][name], tensor)


def test_a_user_model_factory_trains(tmp_path: Path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def tiny(input_size, num_classes, width=8):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(input_size, width), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(width, num_classes))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = spec(epochs=1, model={"name": "mymodels:tiny", "kwargs": {"width": 6}})
    record = api.train(job, out_dir=tmp_path / "run")
    assert record.model.parameters == (20 * 6 + 6) + (6 * 4 + 4)
