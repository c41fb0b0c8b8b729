"""The starving-accelerator warning names the cause it measured: decoding, reading, or too few
loader workers; data in memory keeps the plain warning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.train.metrics import StepTiming, TimingTotals, starving_advice


def starved(read_s: float, decode_s: float, samples: int = 640) -> TimingTotals:
    """Ten steps of 64 samples, 80% of each spent waiting for data; `read_s` and `decode_s` are
    the per-sample seconds the batches measured."""
    totals = TimingTotals()
    for _ in range(samples // 64):
        totals.add(StepTiming(data_wait_s=0.08, h2d_s=0.0, compute_s=0.02), 64)
        totals.add_io([read_s * 64, decode_s * 64, 0, 64 * 1000, 64])
    return totals


def test_decoding_slower_than_compute_names_decoding_and_the_workers_that_keep_up():
    # 0.02 s of compute for 64 samples: 0.31 ms a sample; reading and decoding 1.3 ms: 5 workers.
    advice = starving_advice(starved(read_s=0.0001, decode_s=0.0012), 1, False, "cpu")
    assert "decoding bounds it" in advice and "about 5 loader workers" in advice
    assert "raise loader.workers (now 1)" in advice


def test_reading_slower_than_decoding_names_reading_and_staging():
    advice = starving_advice(starved(read_s=0.002, decode_s=0.0001), 2, False, "cpu")
    assert "reading bounds it" in advice and "data.stage" in advice


def test_enough_workers_that_still_wait_are_called_too_few():
    advice = starving_advice(starved(read_s=0.00001, decode_s=0.0001), 2, False, "cpu")
    assert "too few workers?" in advice


def test_data_in_memory_keeps_the_plain_warning():
    totals = TimingTotals()
    for _ in range(10):
        totals.add(StepTiming(data_wait_s=0.08, h2d_s=0.0, compute_s=0.02), 64)
    advice = starving_advice(totals, 0, False, "cpu")
    assert advice.startswith("data loading takes 80% of each step")
    assert "bounds" not in advice and "raise loader.workers (now 0)" in advice


def test_a_run_that_decodes_large_images_for_a_tiny_model_is_told_decoding_bounds_it(
    tmp_path: Path,
):
    """Noise PNGs of 192×192 take far longer to decode than a linear model takes to learn from
    them, whatever the machine's load: the run's warning names decoding."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (tmp_path / "img" / label).mkdir(parents=True)
        for i in range(48):
            pixels = rng.integers(0, 256, (192, 192, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "img" / label / f"{i}.png")
    spec = parse_spec(
        {
            "name": "starving",
            "model": {"name": "mlp", "kwargs": {"hidden": []}},
            "data": {"name": "images", "path": str(tmp_path / "img"), "val_fraction": 0.25},
            "batch_size": 8,
            "epochs": 1,
            "device": "cpu",
        }
    )
    api.train(spec, out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    warnings = [w for w in record["warnings"] if w.startswith("data loading takes")]
    assert warnings and "decoding bounds it" in warnings[0], record["warnings"]
    assert record["timing"]["decode_s_per_sample"] > record["timing"]["read_s_per_sample"]


def test_data_already_staged_is_not_told_to_stage():
    """The defect: a run reading its staged copy was told to stage the files (data.stage)."""
    totals = starved(read_s=0.0012, decode_s=0.0001)
    advice = starving_advice(totals, 1, False, "cpu", staged=True)
    assert "reading bounds it" in advice and "data.stage" not in advice
