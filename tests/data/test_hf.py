"""Hugging Face data sets saved to disk: columns, labels, splits, workers, bad input, training."""

import io
import json
import pickle
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from dlscale import api
from dlscale.data import build_data
from dlscale.data.lazy import DataError
from dlscale.errors import UserError
from dlscale.jobspec import HfData, parse_spec
from tests.small_runs import final_weights


def png(value: int, size_hw=(5, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((*size_hw, 3), value, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def image_dataset(path: Path, count: int = 12) -> Path:
    """PNG images (every pixel of row i is i) with a ClassLabel of four names, three used."""
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c", "d"])}
    )
    rows = {
        "image": [{"bytes": png(i), "path": None} for i in range(count)],
        "label": [i % 3 for i in range(count)],
    }
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(path))
    return path


def feature_dataset(path: Path, count: int = 200, width: int = 20, seed: int = 0) -> Path:
    """Float features of a fixed shape (an Array feature) and int labels 0..3 that they predict."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, count)
    x = rng.normal(size=(count, width)).astype(np.float32)
    x[np.arange(count), labels] += 3.0  # learnable: the label's feature stands out
    features = datasets.Features(
        {
            "x": datasets.Sequence(datasets.Value("float32"), length=width),
            "y": datasets.Value("int64"),
        }
    )
    datasets.Dataset.from_dict({"x": x, "y": labels}, features=features).save_to_disk(str(path))
    return path


def spec(path: Path, **fields) -> HfData:
    return HfData.model_validate({"name": "hf", "path": str(path), **fields})


def pixel_values(x: torch.Tensor) -> list[int]:
    return [round(float(v) * 255) for v in x.flatten(1)[:, 0]]


def test_image_feature_rows_decode_to_images_with_the_classlabel_count(tmp_path: Path):
    bundle = build_data(spec(image_dataset(tmp_path / "ds"), image_column="image"), seed=0)
    assert bundle.num_classes == 4 and bundle.input_shape == (3, 5, 6)  # ClassLabel names 4
    assert len(bundle.train) == 9 and len(bundle.val) == 3
    x, y, io = bundle.train[list(range(9))]
    values = pixel_values(x)  # each sample says which row it came from
    assert x.shape == (9, 3, 5, 6) and y.tolist() == [v % 3 for v in values]
    val_values = pixel_values(bundle.val[[0, 1, 2]][0])
    assert sorted(values + val_values) == list(range(12))  # disjoint, and nothing lost
    assert io[4] == 9 and io[2] == 0 and io[3] == sum(len(png(v)) for v in values)
    again = build_data(spec(tmp_path / "ds", image_column="image"), seed=0)
    assert pixel_values(again.val[[0, 1, 2]][0]) == val_values  # the split is seeded
    other = build_data(spec(tmp_path / "ds", image_column="image"), seed=1)
    assert pixel_values(other.val[[0, 1, 2]][0]) != val_values


def test_image_arrays_are_resized_and_features_keep_their_shape(tmp_path: Path):
    pixels = np.arange(4 * 6 * 8 * 3, dtype=np.int64).reshape(4, 6, 8, 3) % 256
    features = datasets.Features(
        {"img": datasets.Array3D((6, 8, 3), "uint8"), "label": datasets.Value("int64")}
    )
    rows = {"img": pixels.astype(np.uint8), "label": [0, 1, 5, 1]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "arrays"))
    images = build_data(
        spec(tmp_path / "arrays", image_column="img", image_size=[3, 4], val_fraction=0.5), seed=0
    )
    assert images.input_shape == (3, 3, 4) and images.num_classes == 6  # largest label + 1
    features_bundle = build_data(
        spec(feature_dataset(tmp_path / "f"), input_column="x", label_column="y"), seed=0
    )
    x, _, _ = features_bundle.train[[0, 1]]
    assert x.shape == (2, 20) and x.dtype == torch.float32 and features_bundle.num_classes == 4
    assert features_bundle.vocab_size is None


def test_text_becomes_next_token_windows(tmp_path: Path):
    rows = {"text": ["hello world", "ab"], "ids": [[1, 2, 3, 4, 5, 6], [9]]}
    split = datasets.Dataset.from_dict(rows)
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "t"))
    text = build_data(spec(tmp_path / "t", text_column="text", seq_len=4, val_split="test"), 0)
    assert text.task == "language_modeling" and text.num_classes == text.vocab_size == 256
    x, y, io = text.train[[0, 1]]
    assert x.tolist() == [list(b"hell"), [97, 98, 0, 0]]  # long texts cut, short ones padded
    assert y.tolist() == [list(b"ello"), [98, 0, 0, 0]]
    assert io[3] == len("hello world") + 2 and len(text.val) == 2
    ids = build_data(spec(tmp_path / "t", text_column="ids", seq_len=3, val_split="test"), 0)
    assert ids.vocab_size == 10 and ids.train[[0]][0].tolist() == [[1, 2, 3]]


def test_workers_map_the_file_and_give_the_same_batches(tmp_path: Path):
    bundle = build_data(
        spec(
            feature_dataset(tmp_path / "f", count=2000, width=64),
            input_column="x",
            label_column="y",
        ),
        seed=0,
    )
    table_bytes = bundle.train.table.nbytes
    assert table_bytes > 500_000
    # A worker receives the file's name, not the table: pickling must not carry the data.
    assert len(pickle.dumps(bundle.train)) < table_bytes / 20
    batches = BatchSampler(SequentialSampler(range(40)), 16, drop_last=False)
    here = [bundle.train[index] for index in batches]
    there = list(DataLoader(bundle.train, sampler=batches, batch_size=None, num_workers=2))
    assert len(there) == len(here) == 3
    for (x, y, stats), (x2, y2, stats2) in zip(here, there, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert stats[3] == stats2[3] == len(x) * 64 * 4  # float32 features read


def test_a_row_that_does_not_decode_names_the_row_or_is_skipped(tmp_path: Path):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = {
        "image": [
            {"bytes": png(1), "path": None},
            {"bytes": b"not a png", "path": None},
            {"bytes": png(3), "path": None},
        ],
        "label": [0, 1, 0],
    }
    split = datasets.Dataset.from_dict(rows, features=features)
    first_bad = split.select([1, 0, 2])
    splits = {"train": split, "val": split, "first_bad": first_bad}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "bad"))
    strict = build_data(spec(tmp_path / "bad", image_column="image", val_split="val"), seed=0)
    with pytest.raises(DataError) as error:
        strict.train[[0, 1, 2]]
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'bad'} [train] row 1: cannot read sample 1")
    assert "Pillow cannot decode it" in message and "\n" not in message
    lenient = build_data(
        spec(tmp_path / "bad", image_column="image", val_split="val", skip_bad=True), seed=0
    )
    x, y, io = lenient.train[[0, 1, 2]]
    assert pixel_values(x) == [1, 3] and y.tolist() == [0, 0] and io[2] == 1 and io[4] == 2
    # The first row sets the image layout, so it must decode.
    with pytest.raises(DataError) as error:
        build_data(spec(tmp_path / "bad", image_column="image", split="first_bad"), seed=0)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'bad'} [first_bad] row ") and "\n" not in message
    assert "cannot read the first sample" in message and "Pillow cannot decode it" in message


@pytest.mark.parametrize(
    "fields, expected",
    [
        (
            {"image_column": "picture"},
            "no column 'picture' (data.image_column; columns: image, label)",
        ),
        (
            {"image_column": "image", "label_column": "class"},
            "no label column 'class' (data.label_column; columns: image, label)",
        ),
        (
            {"input_column": "image"},
            "column 'image' holds Image(mode=None, decode=True); "
            "data.input_column expects numeric arrays",
        ),
        ({"image_column": "image", "split": "train"}, "holds one data set, not splits"),
        (
            {"image_column": "image", "label_column": None},
            "trains a classifier: set data.label_column",
        ),
    ],
)
def test_a_column_that_does_not_fit_is_one_line_naming_it(tmp_path: Path, fields, expected):
    path = image_dataset(tmp_path / "ds", count=3)
    with pytest.raises(UserError) as error:
        build_data(spec(path, **fields), seed=0)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def test_a_folder_that_is_not_a_saved_data_set_is_one_line(tmp_path: Path):
    (tmp_path / "plain" / "sub").mkdir(parents=True)
    with pytest.raises(UserError) as error:
        build_data(spec(tmp_path / "plain", input_column="x"), seed=0)
    assert str(error.value).startswith(f"{tmp_path / 'plain'}: not a Hugging Face data set saved")
    rows = datasets.Dataset.from_dict({"x": [[1.0]] * 4, "y": [0, -1, 1, 0]})
    datasets.DatasetDict({"train": rows}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UserError, match=r"no split 'validation' \(data.val_split; splits: train\)"):
        build_data(spec(tmp_path / "dd", input_column="x", val_split="validation"), seed=0)
    with pytest.raises(UserError, match=r"\[train\]: label column 'y' has label -1"):
        build_data(spec(tmp_path / "dd", input_column="x", label_column="y", split="train"), 0)


TRAIN = {
    "name": "hf",
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "optimizer": {"name": "sgd", "lr": 0.05},
    "device": "cpu",
    "seed": 3,
    "steps": 8,
}


def test_training_reads_rows_from_disk_and_records_it(tmp_path: Path):
    data = {
        "name": "hf",
        "path": str(feature_dataset(tmp_path / "f")),
        "input_column": "x",
        "label_column": "y",
    }
    api.train(parse_spec({**TRAIN, "data": data, "batch_size": 16}), out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "completed" and record["data"]["read_from_disk"] is True
    assert record["data"]["train_samples"] == 160 and record["data"]["num_classes"] == 4
    assert record["timing"]["decode_s_per_sample"] > 0 and record["timing"]["read_bytes"] > 0


@pytest.mark.slow
def test_ddp_two_workers_at_batch_b_equal_one_process_at_2b(tmp_path: Path):
    data = {
        "name": "hf",
        "path": str(feature_dataset(tmp_path / "f")),
        "input_column": "x",
        "label_column": "y",
    }
    single = parse_spec({**TRAIN, "data": data, "batch_size": 16})
    ddp = parse_spec(
        {**TRAIN, "data": data, "batch_size": 8, "strategy": {"name": "ddp", "workers": 2}}
    )
    api.train(single, out_dir=tmp_path / "single")
    record = api.train(ddp, out_dir=tmp_path / "ddp")
    assert record.data.read_from_disk is True
    assert all(w.samples == 8 * 8 for w in record.workers)
    reference, parallel = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    for name, expected in reference.items():
        difference = (parallel[name] - expected).norm() / expected.norm()
        assert difference <= 1e-5, (name, float(difference))
