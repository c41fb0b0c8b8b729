"""`dlscale bench precision` and `dlscale bench sparsity` on LeNet and digits, a few steps:
every format and level measured, what each claims checked against the model, bad input in one
line."""

import io
import json
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale.bench import precision
from dlscale.bench.sparsity import TwoOfFour, sparse_bytes
from dlscale.cli.main import app
from dlscale.profiler import calibrate

SPEC = """name: formats
model: {name: lenet}
data: {name: digits, image_size: 28}
batch_size: 32
epochs: 1
optimizer: {name: adam, lr: 0.002}
seed: 0
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


@pytest.mark.slow
def test_precision_trains_each_format_and_quantizes_after(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["bench", "precision", str(spec), "--steps", "30", "--out", str(out)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "precision.json").read_text())
    rows = {row["format"]: row for row in data["rows"]}
    assert set(rows) == {"fp32", "bf16", "int8 dynamic", "int8 static"}  # CPU: no fp16
    assert data["steps"] == 30
    for row in rows.values():
        assert "error" not in row and 0 < row["val_accuracy"] <= 1 and row["latency_s"] > 0
    # int8 weights take a quarter of fp32's bytes (plus scales and zero points): well under half.
    assert rows["int8 static"]["model_bytes"] < rows["fp32"]["model_bytes"] / 2
    assert rows["int8 dynamic"]["model_bytes"] < rows["fp32"]["model_bytes"]
    # bf16 saves the activations backward needs in half the bytes, fp32 weights kept (autocast).
    assert rows["bf16"]["activation_bytes"] < rows["fp32"]["activation_bytes"]
    assert rows["bf16"]["model_bytes"] == rows["fp32"]["model_bytes"]
    # One note per format against fp32, after one on noise when a time's rounds or steps spread
    # wide (this test runs on a shared machine: either may happen, and the JSON says which did).
    noisy = [r for r in rows.values() if r["latency_noisy"] or r["train_step_noisy"]]
    assert data["noisy"] == bool(noisy) and data["latency_batch"] == 32
    compared = [note.split(":")[0] for note in data["notes"][bool(noisy) :]]
    assert compared == ["bf16", "int8 dynamic", "int8 static"]
    assert (out / "precision.png").stat().st_size > 10_000


def _time_with(monkeypatch, fake) -> None:
    """`fake(forward)` gives the seconds of every latency round instead of the clock."""
    monkeypatch.setattr(precision, "round_s", fake)


def _precision(spec: Path, out: Path, *extra: str):
    args = ["bench", "precision", str(spec), "--steps", "2", "--out", str(out), *extra]
    return CliRunner().invoke(app, args, env={"COLUMNS": "250"})


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "batch"), [((), 32), (("--latency-batch", "20"), 20)])
def test_precision_times_the_batch_it_states(spec: Path, tmp_path: Path, monkeypatch, extra, batch):
    # Every module of every timed model records the samples it is given; the validation
    # loader's batches hold 256 (digits has 360 validation samples), the latency's 32 or 20.
    seen: list[int] = []

    def counting(forward):
        hook = torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, output: seen.append(len(args[0]))
        )
        try:
            forward()
        finally:
            hook.remove()
        return 1e-3

    _time_with(monkeypatch, counting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _precision(spec, tmp_path / "out", *extra)
    assert result.exit_code == 0, result.output
    assert set(seen) == {batch}
    # torch's x86 int8 qconfig warned of its own reduce_range on every run (a library's line)
    assert not [w for w in caught if "quant_min and quant_max" in str(w.message)]
    data = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert data["latency_batch"] == batch
    assert f"inference, batch {batch}" in result.output
    assert all(row["latency_s"] == 1e-3 and not row["latency_noisy"] for row in data["rows"])


@pytest.mark.slow
def test_a_noisy_latency_is_marked_and_draws_no_comparison(spec: Path, tmp_path: Path, monkeypatch):
    # fp32's rounds jump as a shared CPU's did (6.65 ms, then 105 and 126 ms); every other
    # format's rounds agree. The rounds run until each format's last three agree within 10% or
    # 7 ran. The formats are timed in turn, fp32 first.
    fp32 = iter([6.65e-3, 105e-3, 126e-3, 110e-3, 6.6e-3, 120e-3, 130e-3])
    order: list[int] = []

    def injected(forward):
        if id(forward) not in order:
            order.append(id(forward))
        return next(fp32) if order.index(id(forward)) == 0 else 2e-3

    _time_with(monkeypatch, injected)
    result = _precision(spec, tmp_path / "out")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "precision.json").read_text())
    rows = {row["format"]: row for row in data["rows"]}
    # All 7 rounds ran; the last three are 6.6, 120 and 130 ms: median 120, spread 130/6.6 − 1.
    assert rows["fp32"]["latency_s"] == 120e-3
    assert rows["fp32"]["latency_spread"] == pytest.approx(130 / 6.6 - 1)
    assert rows["fp32"]["latency_noisy"] and data["noisy"] is True
    assert rows["bf16"]["latency_spread"] == 0 and not rows["bf16"]["latency_noisy"]
    assert data["noisy_spread"] == 0.10
    # No latency ratio against the noisy fp32 (2 / 120 would read "0.02×"), in JSON or text.
    assert not any("inference latency" in note for note in data["notes"])
    assert data["notes"][0].startswith("noisy: the latency rounds of fp32 spread over 10%")
    text = " ".join(result.output.split())
    assert "120.00 ms ±1870% noisy" in text and "× fp32's inference latency" not in text


def test_a_load_change_between_formats_shows_in_their_rounds(monkeypatch):
    # The machine's load doubles every time from the fourth round on. Timed one format after
    # another, fp32's rounds all ran before it (1 ms each, steady) and bf16's all after (2 ms,
    # steady): "bf16 2× fp32's latency", from the load. Taken in turn, both formats see it.
    cpu = torch.device("cpu")
    forwards = [
        precision.Forward(torch.nn.Identity(), torch.zeros(1), cpu, each)
        for each in ("fp32", "bf16")
    ]
    timed: list[str] = []

    def loaded(forward):
        timed.append(forward.precision)
        return 1e-3 if len(timed) <= 3 else 2e-3

    monkeypatch.setattr(precision, "round_s", loaded)
    fp32, bf16 = precision.interleaved_latencies(forwards)
    assert timed == ["fp32", "bf16"] * 5  # until each format's last three agreed
    assert fp32["latency_s"] == bf16["latency_s"] == 2e-3
    assert not fp32["latency_noisy"] and not bf16["latency_noisy"]

    # A load that changes every round leaves both noisy after the most rounds.
    timed.clear()

    def changing(forward):
        timed.append(forward.precision)
        return 1e-3 if len(timed) % 4 in (1, 2) else 2e-3  # rounds 1, 3, 5...: 1 ms

    monkeypatch.setattr(precision, "round_s", changing)
    fp32, bf16 = precision.interleaved_latencies(forwards)
    assert len(timed) == 2 * calibrate.MAX_ROUNDS
    assert fp32["latency_noisy"] and bf16["latency_noisy"]
    assert fp32["latency_spread"] == bf16["latency_spread"] == 1.0


def test_noisy_training_steps_draw_no_step_ratio():
    # Ten steps: 10th percentile (index int(0.1 × 9) = 0) 2 ms, 90th (index 8) 3 ms: spread 0.5,
    # over bench io's 25%. Eight steady steps of 4 ms and two of 4.4 ms: spread 0.1, quiet.
    noisy = precision.step_spread([2e-3] * 8 + [3e-3, 9e-3])
    quiet = precision.step_spread([4e-3] * 8 + [4.4e-3] * 2)
    assert noisy == {"train_step_spread": pytest.approx(0.5), "train_step_noisy": True}
    assert quiet == {"train_step_spread": pytest.approx(0.1), "train_step_noisy": False}
    rows = [
        {"format": "fp32", "train_step_s": 2e-3, **noisy, "latency_s": 1e-3},
        {"format": "bf16", "train_step_s": 4e-3, **quiet, "latency_s": 1e-3},
    ]
    for row in rows:
        row.update(model_bytes=100, latency_spread=0.0, latency_noisy=False)
    notes = precision._notes(rows, torch.device("cpu"))
    assert notes[0].startswith("noisy: the training steps of fp32 over 25%")
    # Latencies agree (1.00×); no 2× training step and no "slower" verdict from noisy steps.
    assert notes[1] == "bf16: 1.00× fp32's inference latency, 1.00× its bytes"
    # The activations a step keeps for backward (bytes: never noisy), as benches.md shows them
    rows[0]["activation_bytes"], rows[1]["activation_bytes"] = 1_128_452, 708_356
    notes = precision._notes(rows, torch.device("cpu"))
    assert notes[1].endswith(", 37% fewer bytes of activations kept for backward")


@pytest.mark.slow
def test_sparsity_prunes_to_each_level_and_counts_the_bytes(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    args = [
        "bench",
        "sparsity",
        str(spec),
        "--levels",
        "0,0.5,0.9",
        "--finetune-steps",
        "5",
        "--steps",
        "20",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    data = json.loads((out / "sparsity.json").read_text())
    rows = data["rows"]
    # Each level's latency: of the batch it states, with its rounds' spread.
    assert data["latency_batch"] == 32 and "inference, batch 32" in result.output
    assert all(r["latency_s"] > 0 and r["latency_spread"] >= 0 for r in rows)
    assert data["noisy"] == any(r["latency_noisy"] for r in rows)
    assert [round(r["measured_sparsity"], 2) for r in rows] == [0.0, 0.5, 0.9]
    dense = rows[0]["dense_weight_bytes"]
    assert rows[0]["sparse_weight_bytes"] == dense
    assert rows[1]["sparse_weight_bytes"] > dense / 2  # CSR's indices: half zeros saves ~nothing
    assert rows[2]["sparse_weight_bytes"] < dense / 4
    assert (out / "sparsity.png").stat().st_size > 10_000


def test_two_of_four_keeps_the_two_largest_of_every_four():
    layer = torch.nn.Linear(8, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(
            torch.tensor([[1.0, -4, 3, 2, 0.5, 0.1, -9, 8], [4.0, 3, 2, 1, 1, 2, 3, 4]])
        )
    TwoOfFour.apply(layer, "weight")
    kept = (layer.weight != 0).int().tolist()
    assert kept == [[0, 1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 1, 1]]
    # Half of the 16 values stored, 4 bytes and 2 bits of position each: 8 × 4 + 8 × 2 / 8.
    assert sparse_bytes(layer.weight.detach(), "2:4") == 32 + 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sparsity", "--levels", "0,1.5"], "--levels are fractions in [0, 1)"),
        (["sparsity", "--levels", "a,b"], "is not a list of fractions"),
        (["sparsity", "--pattern", "3:4"], "--pattern must be unstructured or 2:4"),
        (["sparsity", "--pattern", "2:4", "--levels", "0,0.9"], "prunes exactly half"),
        (["sparsity", "--latency-batch", "400"], "the validation set has only 360 samples"),
        (["precision", "--steps", "0"], "--steps: must be a positive integer"),
        (["precision", "--latency-batch", "0"], "--latency-batch: must be a positive integer"),
        (["precision", "--latency-batch", "400"], "the validation set has only 360 samples"),
    ],
)
def test_bad_input_is_one_line(spec: Path, args, message):
    result = CliRunner().invoke(app, ["bench", args[0], str(spec), *args[1:]])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.slow
@pytest.mark.heavy
def test_levels_measures_simd_then_threads_then_processes(spec: Path, tmp_path: Path):
    out = tmp_path / "out"
    args = ["bench", "levels", str(spec), "--steps", "5", "--max-threads", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    data = json.loads((out / "levels.json").read_text())
    levels = [row["level"] for row in data["simd"]]
    assert levels[0] == "default" and set(levels) <= {"default", "avx2", "avx512"}
    assert [row["threads"] for row in data["threads"]] == [1, 2]
    assert [row["processes"] for row in data["processes"]] == [1, 2]
    for key in ("simd", "threads", "processes"):
        assert data[key][0]["speedup"] == 1.0 and all(r["samples_per_s"] > 0 for r in data[key])
        # each setting's steps' spread and whether it is noisy (speed-ups flipped run to run)
        assert all(r["step_spread"] >= 0 and isinstance(r["noisy"], bool) for r in data[key])
    assert data["load_1m"] is None or data["load_1m"] >= 0
    assert data["machine"]["cores"] >= 1 and data["machine"]["numa_nodes"] >= 1
    assert (out / "levels.png").stat().st_size > 10_000


def test_the_sparsity_caption_fits_the_pattern_measured():
    """The caption said a sparse format saves bytes only past half zeros beside a 2:4 row that
    stored 90 KiB of 160: that is CSR's rule, not 2:4's."""
    from rich.console import Console

    from dlscale.cli.bench_formats import sparsity_table

    row = {
        "measured_sparsity": 0.47,
        "val_accuracy": 0.9,
        "latency_s": 1e-3,
        "latency_spread": 0.01,
        "latency_noisy": False,
        "dense_weight_bytes": 160 * 1024,
        "sparse_weight_bytes": 90 * 1024,
    }

    def caption(pattern: str) -> str:
        result = {"pattern": pattern, "rows": [row], "noisy": False, "model": "m", "device": "cpu"}
        result.update(latency_batch=32, finetune_steps=0)
        console = Console(width=300, record=True, file=io.StringIO())
        console.print(sparsity_table(result))
        return " ".join(console.export_text().split())

    assert "about half the dense bytes" in caption("2:4") and "CSR" not in caption("2:4")
    assert "only past about half zeros" in caption("unstructured")


def test_the_levels_table_marks_a_noisy_setting_and_gives_the_load():
    """The defect: `bench levels` gave avx2 1.00× and threads 0.01× in one run, 2.54× and 1.93×
    in the next, with no spread, noise mark or load: each setting now shows its steps' spread,
    a noisy one is marked, and the caption gives the load average."""
    from rich.console import Console

    from dlscale.cli.bench_formats import levels_table

    def row(key, value, rate, spread):
        measured = {"samples_per_s": rate, "speedup": 1.0, "step_spread": spread}
        return {key: value, **measured, "noisy": spread > 0.25}

    result = {
        "model": "lenet",
        "batch_size": 8,
        "machine": {"cores": 2, "numa_nodes": 1, "caches": {}},
        "load_1m": 1.7,
        "simd": [row("level", "default", 100.0, 0.05)],
        "threads": [row("threads", 1, 100.0, 0.05), row("threads", 2, 1.0, 40.0)],
        "processes": [row("processes", 1, 100.0, 0.02)],
    }
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(levels_table(result))
    text = console.export_text()
    (two,) = [line for line in text.splitlines() if "threads" in line and " 2 " in line]
    assert "±4000% noisy" in two
    assert "load average 1.70" in " ".join(text.split())
