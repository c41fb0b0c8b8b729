"""`dlscale bench precision` and `dlscale bench sparsity` on LeNet and digits, a few steps:
every format and level measured, what each claims checked against the model, bad input in one
line."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale.bench.sparsity import TwoOfFour, sparse_bytes
from dlscale.cli.main import app

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
    assert len(data["notes"]) == 3 and (out / "precision.png").stat().st_size > 10_000


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
    rows = json.loads((out / "sparsity.json").read_text())["rows"]
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
        (["precision", "--steps", "0"], "--steps: must be a positive integer"),
    ],
)
def test_bad_input_is_one_line(spec: Path, args, message):
    result = CliRunner().invoke(app, ["bench", args[0], str(spec), *args[1:]])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.slow
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
    assert data["machine"]["cores"] >= 1 and data["machine"]["numa_nodes"] >= 1
    assert (out / "levels.png").stat().st_size > 10_000
