"""`dlscale predict` (issue 37, point 1): a trained run's model on its own validation files, in
every input kind, gives exactly the validation accuracy the run recorded; bad input is one line
and exit 2."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from typer.testing import CliRunner

from dlscale import api
from dlscale.api import inference
from dlscale.api.data import convert_data
from dlscale.cli.main import app
from dlscale.train import checkpoint as ckpt

runner = CliRunner()
PIXEL_SCALE = 16  # sklearn's digits are 0..16; ×16 (clipped) makes them uint8 pixels


def digits_npz(folder: Path) -> tuple[Path, Path]:
    """The 8×8 digits as uint8 (N, 1, 8, 8) pixels: a PNG holds them bit for bit, so every
    input kind below gives the model the very tensors the run validated on."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.clip(digits.images * PIXEL_SCALE, 0, 255).astype(np.uint8)[:, None]
    y = digits.target.astype(np.int64)
    train, val = folder / "train.npz", folder / "val.npz"
    np.savez(train, x=x[:1400], y=y[:1400])
    np.savez(val, x=x[1400:], y=y[1400:])
    return train, val


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """An MLP trained for 40 steps on digits from .npz files with a validation file."""
    folder = tmp_path_factory.mktemp("predict")
    train, val = digits_npz(folder)
    spec = {
        "name": "predict-mlp",
        "model": {"name": "mlp", "kwargs": {"hidden": [32]}},
        "data": {"name": "npz", "path": str(train), "val_path": str(val)},
        "batch_size": 32,
        "steps": 40,
        "device": "cpu",
        "seed": 0,
    }
    spec_path = folder / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    record = api.train(spec_path, out_dir=folder / "run")
    return {"folder": folder, "spec": spec_path, "val": val, "record": record}


def predict_json(*args: str) -> dict:
    result = runner.invoke(app, ["predict", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def write_class_folders(val: Path, root: Path) -> Path:
    """The validation archive as PNG files, one folder per class (0 ... 9)."""
    with np.load(val) as loaded:
        x, y = loaded["x"], loaded["y"]
    for index, (pixels, label) in enumerate(zip(x, y, strict=True)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[0]).save(folder / f"{index:04d}.png")
    return root


def test_predict_on_the_validation_file_gives_the_runs_validation_accuracy(run):
    recorded = run["record"].final.val_accuracy
    result = predict_json(str(run["folder"] / "run"), str(run["val"]), "--batch-size", "50")
    assert result["samples"] == 397 == result["counted"]
    assert result["accuracy"] == recorded == result["run_val_accuracy"]
    assert result["correct"] == round(recorded * 397)
    rows = result["rows"]
    assert rows[0]["input"] == f"{run['val']}[0]"
    assert sum(row["predicted"] == row["label"] for row in rows) == result["correct"]


def test_every_input_kind_holding_the_validation_samples_gives_the_same_accuracy(run, tmp_path):
    recorded = run["record"].final.val_accuracy
    images = write_class_folders(run["val"], tmp_path / "images")
    convert_data(run["spec"], tmp_path / "shards", "webdataset")
    convert_data(run["spec"], tmp_path / "hf", "hf")
    checkpoint = sorted((run["folder"] / "run" / "checkpoints").glob("*.pt"))[-1]
    for given, kind in (
        (images, "images"),
        (tmp_path / "shards" / "val-*.tar", "webdataset"),
        (tmp_path / "hf", "hf"),  # its validation split, by default
    ):
        result = predict_json(str(checkpoint), str(given), "--batch-size", "64")
        assert result["inputs"] == [{"path": str(given), "kind": kind, "samples": 397}]
        assert (result["accuracy"], result["counted"]) == (recorded, 397), kind


def test_loose_images_and_unlabelled_npz_are_predicted_without_an_accuracy(run, tmp_path):
    with np.load(run["val"]) as loaded:
        x = loaded["x"][:3]
    for index, pixels in enumerate(x):
        Image.fromarray(pixels[0]).save(tmp_path / f"{index}.png")
    np.savez(tmp_path / "new.npz", x=x)
    folder = predict_json(str(run["folder"] / "run"), str(tmp_path))
    archive = predict_json(str(run["folder"] / "run"), str(tmp_path / "new.npz"))
    one = predict_json(str(run["folder"] / "run"), str(tmp_path / "2.png"))
    assert folder["accuracy"] is None and [r["label"] for r in folder["rows"]] == [None] * 3
    assert [r["predicted"] for r in folder["rows"]] == [r["predicted"] for r in archive["rows"]]
    assert one["rows"][0]["predicted"] == archive["rows"][2]["predicted"]


def test_the_predictor_is_the_runs_model_and_int8_quantizes_its_linear_layers(run):
    folder = run["folder"] / "run"
    fp32 = inference.load_predictor(folder, device="cpu")
    with np.load(run["val"]) as loaded:
        x = torch.from_numpy(loaded["x"][:5].astype(np.float32) / 255)
    weights = torch.load(sorted((folder / "checkpoints").glob("*.pt"))[-1], weights_only=True)
    for key, value in fp32.model.state_dict().items():
        assert torch.equal(value, weights["model"][key]), key
    prediction = fp32.predict(x)
    assert prediction.classes == fp32.model(x).argmax(-1).tolist()
    int8 = inference.load_predictor(folder, device="auto", precision="int8")
    kinds = {type(m).__module__ for m in int8.model.modules()}
    assert any("quantized" in kind for kind in kinds) and str(int8.device) == "cpu"
    bf16 = inference.load_predictor(folder, device="cpu", precision="bf16")
    assert len(bf16.predict(x).classes) == len(int8.predict(x).classes) == 5


def test_out_writes_csv_and_json(run, tmp_path):
    folder = str(run["folder"] / "run")
    result = runner.invoke(
        app, ["predict", folder, str(run["val"]), "--out", str(tmp_path / "p.csv")]
    )
    assert result.exit_code == 0, result.output
    assert "the run's validation accuracy" in result.output
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "input,predicted,confidence,label" and len(lines) == 1 + 397
    runner.invoke(app, ["predict", folder, str(run["val"]), "--out", str(tmp_path / "p.json")])
    assert len(json.loads((tmp_path / "p.json").read_text())["rows"]) == 397


def test_a_language_model_predicts_each_windows_next_token_from_a_text_file(tmp_path):
    """A GPT trained on byte tokens: a .txt is cut into windows of its context plus the next
    byte; the accuracy is per token, counted by hand here from the model's own logits."""
    tokens = np.frombuffer(b"abcdefgh" * 64, dtype=np.uint8).astype(np.int64)
    windows = tokens[: 32 * 9].reshape(32, 9)
    archive = tmp_path / "t.npz"
    np.savez(archive, x=windows[:, :-1], y=windows[:, 1:])
    spec = {
        "name": "predict-gpt",
        "model": {"name": "gpt", "kwargs": {"n_layer": 1, "d_model": 32, "n_head": 2}},
        "data": {
            "name": "npz",
            "path": str(tmp_path / "t.npz"),
            "val_path": str(tmp_path / "t.npz"),
        },
        "batch_size": 8,
        "steps": 20,
        "device": "cpu",
    }
    (tmp_path / "gpt.yaml").write_text(yaml.safe_dump(spec))
    record = api.train(tmp_path / "gpt.yaml", out_dir=tmp_path / "run")
    text = tmp_path / "text.txt"
    text.write_bytes(b"abcdefghabcdefgh" * 2 + b"abc")  # 35 bytes: 3 windows of 8 + 1, 2 left
    result = predict_json(str(tmp_path / "run"), str(text))
    assert [row["input"] for row in result["rows"]] == [f"{text}@0", f"{text}@9", f"{text}@18"]
    model = inference.load_predictor(tmp_path / "run", device="cpu")
    spans = torch.from_numpy(np.frombuffer(text.read_bytes()[:27], np.uint8).astype(np.int64))
    spans = spans.reshape(3, 9)
    logits = model.logits(spans[:, :-1])
    assert result["correct"] == int((logits.argmax(-1) == spans[:, 1:]).sum())
    assert result["counted"] == 24
    assert [row["label"] for row in result["rows"]] == spans[:, -1].tolist()
    on_npz = predict_json(str(tmp_path / "run"), str(tmp_path / "t.npz"))
    assert on_npz["accuracy"] == record.final.val_accuracy
    # Token ids past the vocabulary and labels of another shape or range: one line each (were
    # an IndexError and a RuntimeError traceback, and labels past it were counted as wrong).
    vocab = record.data.vocab_size
    cases = {
        "big.npz": ({"x": np.full((4, 8), vocab + 5)}, f"token id {vocab + 5} is not in"),
        "short_y.npz": (
            {"x": windows[:4, :-1], "y": np.arange(4)},
            "labels of shape (4,); this model's are (N, 8)",
        ),
        "far_y.npz": (
            {"x": windows[:4, :-1], "y": np.full((4, 8), vocab + 1)},
            f"label {vocab + 1} is not in",
        ),
    }
    for name, (arrays, expected) in cases.items():
        np.savez(tmp_path / name, **arrays)
        assert expected in bad(str(tmp_path / "run"), str(tmp_path / name))


def bad(*args: str) -> str:
    result = runner.invoke(app, ["predict", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(run, tmp_path):
    folder = str(run["folder"] / "run")
    np.savez(tmp_path / "wide.npz", x=np.zeros((100, 1, 9, 9), np.uint8))
    assert "wide.npz: samples of shape (1, 9, 9); this model takes (1, 8, 8)" in bad(
        folder,
        str(tmp_path / "wide.npz"),  # the file's samples, not predict's batch of 64
    )
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "notes.pt").write_text("hello\n")
    assert "empty.pt: not a readable dlscale checkpoint (an empty file)" in bad(
        str(tmp_path / "empty.pt"), str(tmp_path / "wide.npz")
    )
    assert "notes.pt: not a readable dlscale checkpoint (not a torch.save archive)" in bad(
        str(tmp_path / "notes.pt"), str(tmp_path / "wide.npz")
    )
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    assert "broken.png: Pillow cannot decode it" in bad(folder, str(tmp_path / "broken.png"))
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(tmp_path / "big.png")
    assert "image is 9×9 (H×W); this model takes 8×8" in bad(folder, str(tmp_path / "big.png"))
    (tmp_path / "notes.xyz").write_text("?")
    assert "unknown input format '.xyz'" in bad(folder, str(tmp_path / "notes.xyz"))
    assert "no such run folder or checkpoint" in bad(str(tmp_path / "nowhere"), str(run["val"]))
    assert "not a run folder" in bad(str(tmp_path), str(run["val"]))
    assert "no such input file" in bad(folder, str(tmp_path / "missing.npz"))
    assert "choose a .json or .csv" in bad(folder, str(run["val"]), "--out", "p.txt")
    # An --out that exists is never replaced: a run's own record, a user's file.
    record = Path(folder) / "run.json"
    kept = tmp_path / "keep.csv"
    kept.write_text("precious\n")
    for existing in (record, kept):
        before = existing.read_bytes()
        said = bad(folder, str(run["val"]), "--out", str(existing))
        assert f"--out {existing} already exists" in said
        assert existing.read_bytes() == before
    assert "--precision fp8" in bad(folder, str(run["val"]), "--precision", "fp8")
    assert "--batch-size must be at least 1" in bad(folder, str(run["val"]), "--batch-size", "0")
    assert "runs on the CPU only" in bad(
        folder, str(run["val"]), "--precision", "int8", "--device", "cuda"
    )
    for device in ("banana", "meta", "cuda:x"):  # not a device name, or none that trains
        assert f"device '{device}': choose auto, cpu" in bad(
            folder, str(run["val"]), "--device", device
        )


def test_a_model_whose_output_is_not_a_number_gives_no_prediction(run, tmp_path):
    """The defect: weights that diverged (or inputs that overflow the model) printed 'confidence
    nan%' as a result, counted in the accuracy, and --json wrote NaN, which is not JSON."""
    copy = tmp_path / "diverged"
    shutil.copytree(run["folder"] / "run", copy)
    step, path = ckpt.list_checkpoints(copy)[-1]
    state = ckpt.load_checkpoint(path)
    state["model"] = {name: torch.full_like(t, float("nan")) for name, t in state["model"].items()}
    ckpt.save_checkpoint(copy, step, {k: v for k, v in state.items() if k != "step"}, keep_last=5)
    said = bad(str(copy), str(run["val"]), "--json")
    assert "[0]: the model's output is not finite (NaN or ±inf)" in said


def test_a_checkpoint_of_another_model_or_spec_is_one_line(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run["folder"] / "run", copy)
    record = json.loads((copy / "run.json").read_text())
    record["spec"]["model"]["kwargs"]["hidden"] = [16]  # the same spec hash, another model
    (copy / "run.json").write_text(json.dumps(record))
    line = bad(str(copy), str(run["val"]))
    assert "its weights do not fit model 'mlp'" in line and "shapes: " in line
    record["spec_hash"] = "0" * 16  # a run whose checkpoint another spec wrote
    (copy / "run.json").write_text(json.dumps(record))
    assert "was written by another spec" in bad(str(copy), str(run["val"]))


def test_progress_hears_every_batch_and_the_verb_matches_the_command(run):
    heard = []
    result = inference.predict(
        run["folder"] / "run",
        [run["val"]],
        batch_size=100,
        device="cpu",
        progress=lambda done, total: heard.append((done, total)),
    )
    assert heard == [(100, 397), (200, 397), (300, 397), (397, 397)]
    assert result.accuracy == run["record"].final.val_accuracy


def test_a_checkpoint_on_its_own_carries_its_model_and_an_old_one_is_one_line(run, tmp_path):
    checkpoint = sorted((run["folder"] / "run" / "checkpoints").glob("*.pt"))[-1]
    alone = tmp_path / "model.pt"
    shutil.copy(checkpoint, alone)
    result = predict_json(str(alone), str(run["val"]))
    assert result["run_dir"] is None and result["run_val_accuracy"] is None
    assert result["accuracy"] == run["record"].final.val_accuracy
    state = ckpt.load_checkpoint(checkpoint)
    del state["model_source"]  # as checkpoints were before they carried it
    torch.save(ckpt.sealed({k: v for k, v in state.items() if k != "format"}), alone)
    assert "written before checkpoints carried their model's spec" in bad(str(alone), "x.npz")


def test_the_summary_says_when_the_runs_accuracy_was_measured_otherwise(run, tmp_path):
    """The run's accuracy is beside predict's only as what it is: a bf16 run validated under
    bf16 autocast (predict's default fp32 may flip a close sample), and an earlier checkpoint
    is not the step the run's accuracy was measured at."""
    spec = yaml.safe_load(run["spec"].read_text())
    spec.update(precision="bf16", steps=10, checkpoint={"every_steps": 5, "keep_last": 3})
    spec_path = tmp_path / "bf16.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    api.train(spec_path, out_dir=tmp_path / "run")
    folder = str(tmp_path / "run")
    as_fp32 = predict_json(folder, str(run["val"]))
    assert (as_fp32["precision"], as_fp32["run_precision"]) == ("fp32", "bf16")
    assert as_fp32["run_val_step"] == as_fp32["step"] == 10
    text = runner.invoke(app, ["predict", folder, str(run["val"])]).output
    assert "validated in bf16 (--precision bf16 predicts closer to how it did)" in " ".join(
        text.split()
    )
    as_run = runner.invoke(app, ["predict", folder, str(run["val"]), "--precision", "bf16"])
    assert as_run.exit_code == 0 and "validated in" not in as_run.output
    older = str(tmp_path / "run" / "checkpoints" / "step-00000005.pt")
    earlier = predict_json(older, str(run["val"]), "--precision", "bf16")
    assert (earlier["step"], earlier["run_val_step"]) == (5, 10)
    text = " ".join(runner.invoke(app, ["predict", older, str(run["val"])]).output.split())
    assert "the run's validation accuracy at step 10" in text


def test_the_runs_accuracy_is_placed_at_the_step_its_epoch_ended(run, tmp_path):
    """An interrupted run's record raises `final.step` to its newest checkpoint, past the
    epoch whose end measured the accuracy: the step shown is the epoch's."""
    folder = tmp_path / "copy"
    shutil.copytree(run["folder"] / "run", folder)
    record = json.loads((folder / "run.json").read_text())
    measured_at = record["epochs"][-1]["step"]
    record["final"]["step"] = measured_at + 7  # as record_end leaves it after a later checkpoint
    (folder / "run.json").write_text(json.dumps(record))
    result = predict_json(str(folder), str(run["val"]))
    assert result["run_val_step"] == measured_at == result["step"]
