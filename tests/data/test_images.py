"""A folder of images per class: listing, labels, splits, Pillow decoding, bad input, training."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from dlscale import api
from dlscale.data import build_data
from dlscale.data.lazy import DataError
from dlscale.errors import UserError
from dlscale.jobspec import ImagesData, parse_spec

CLASSES = ("cat", "dog", "emu")  # sorted: indices 0, 1, 2


def write_image(path: Path, value: int, size_hw=(6, 7), mode="RGB") -> Path:
    """An image whose every pixel is `value`, so a decoded sample says which file it came from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = size_hw if mode == "L" else (*size_hw, 3)
    Image.fromarray(np.full(shape, value, dtype=np.uint8), mode).save(path)
    return path


def image_folder(root: Path, per_class: int = 6, **options) -> Path:
    """CLASSES × per_class PNGs; image k of class c has pixel value 40·c + k."""
    for c, name in enumerate(CLASSES):
        for k in range(per_class):
            write_image(root / name / f"{k:03d}.png", 40 * c + k, **options)
    return root


def spec(root: Path, **fields) -> ImagesData:
    return ImagesData.model_validate({"name": "images", "path": str(root), **fields})


def pixel_values(x: torch.Tensor) -> list[int]:
    """The value each decoded sample's pixels hold (see image_folder)."""
    return [round(float(v) * 255) for v in x.flatten(1)[:, 0]]


def test_classes_come_from_sorted_folder_names_and_only_image_files_count(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=2)
    write_image(root / "dog" / "deeper" / "UPPER.PNG", 99)  # nested and upper-case: an image
    (root / "dog" / "notes.txt").write_text("not an image")
    write_image(root / "dog" / ".hidden.png", 123)
    write_image(root / ".thumbnails" / "x.png", 124)  # a hidden folder is not a class
    bundle = build_data(spec(root, val_path=str(root)), seed=0)
    assert bundle.num_classes == 3 and bundle.input_shape == (3, 6, 7)
    assert len(bundle.train) == 7
    x, y, io = bundle.train[list(range(7))]
    assert x.shape == (7, 3, 6, 7) and x.dtype == torch.float32
    assert y.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert pixel_values(x) == [0, 1, 40, 41, 99, 80, 81]  # a folder's files, then sub-folders'
    file_bytes = sum(Path(p).stat().st_size for p in bundle.train.files())
    assert io[4] == 7 and io[3] == file_bytes and io[2] == 0


def test_the_split_is_seeded_stratified_and_disjoint(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=10)
    bundle = build_data(spec(root, val_fraction=0.3), seed=5)
    train, val = set(bundle.train.files()), set(bundle.val.files())
    assert len(val) == 9 and len(train) == 21 and not train & val
    assert len(train | val) == 30
    _, val_labels, _ = bundle.val[list(range(9))]
    assert sorted(val_labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # every class validated
    again = build_data(spec(root, val_fraction=0.3), seed=5)
    assert again.val.files() == bundle.val.files() and again.train.files() == bundle.train.files()
    other = build_data(spec(root, val_fraction=0.3), seed=6)
    assert set(other.val.files()) != val


def test_grey_images_are_one_channel_and_image_size_resizes(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=2, mode="L")
    grey = build_data(spec(root, val_path=str(root)), seed=0)
    assert grey.input_shape == (1, 6, 7) and grey.train[[0]][0].shape == (1, 1, 6, 7)
    resized = build_data(spec(root, val_path=str(root), image_size=[4, 5], mode="RGB"), seed=0)
    x, _, _ = resized.train[[0, 3]]
    assert x.shape == (2, 3, 4, 5) and pixel_values(x) == [0, 41]  # flat images stay flat


def test_an_image_of_another_size_names_the_file_both_sizes_and_the_setting(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=2)
    odd = write_image(root / "emu" / "999.png", 7, size_hw=(9, 9))
    bundle = build_data(spec(root, val_path=str(root)), seed=0)
    with pytest.raises(DataError) as error:
        bundle.train[list(range(len(bundle.train)))]
    message = str(error.value)
    assert message.startswith(str(odd)) and "\n" not in message
    assert "9×9" in message and "6×7" in message and "data.image_size" in message


def test_listing_opens_only_the_first_image(tmp_path: Path, monkeypatch):
    root = image_folder(tmp_path / "imgs", per_class=5)
    opened = []
    real_open = Image.open
    monkeypatch.setattr(
        Image, "open", lambda source, *a, **k: opened.append(source) or real_open(source, *a, **k)
    )
    build_data(spec(root), seed=0)
    assert len(opened) == 1


def test_a_broken_image_is_one_line_or_with_skip_bad_skipped_and_counted(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=2)
    broken = root / "dog" / "001.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated: the header survives, pixels do not
    strict = build_data(spec(root, val_path=str(root)), seed=0)
    with pytest.raises(DataError) as error:
        strict.train[[0, 1, 2, 3]]
    message = str(error.value)
    assert message.startswith(f"{broken}: cannot read sample 3") and "\n" not in message
    assert "data.skip_bad" in message
    lenient = build_data(spec(root, val_path=str(root), skip_bad=True), seed=0)
    _, y, io = lenient.train[[0, 1, 2, 3, 4]]
    assert y.tolist() == [0, 0, 1, 2] and io[2] == 1 and io[4] == 4


def test_a_broken_first_image_stops_the_listing_unless_skip_bad(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=2)
    first = root / "cat" / "000.png"
    first.write_bytes(b"not a png")
    with pytest.raises(DataError) as error:
        build_data(spec(root), seed=0)
    message = str(error.value)
    assert message.startswith(f"{first}: Pillow cannot decode it") and "\n" not in message
    lenient = build_data(spec(root, val_path=str(root), skip_bad=True), seed=0)
    assert lenient.input_shape == (3, 6, 7)  # the next image set the layout
    _, y, io = lenient.train[list(range(6))]
    assert y.tolist() == [0, 1, 1, 2, 2] and io[2] == 1


@pytest.mark.parametrize(
    "layout, expected",
    [
        ("loose", "no class folders (found 2 image(s) but no sub-folder; expected"),
        ("nothing", "no class folders (found no sub-folder"),
        ("empty class", "class folder has no images (expected files ending in .png"),
    ],
)
def test_a_folder_without_the_layout_is_one_line_naming_it(tmp_path: Path, layout, expected):
    root = tmp_path / "imgs"
    root.mkdir()
    named = root
    if layout == "loose":
        write_image(root / "a.png", 1), write_image(root / "b.jpg", 2)
    elif layout == "empty class":
        write_image(root / "cat" / "a.png", 1)
        (root / "dog").mkdir()
        (root / "dog" / "readme.txt").write_text("no images here")
        named = root / "dog"
    with pytest.raises(UserError) as error:
        build_data(spec(root), seed=0)
    message = str(error.value)
    assert message.startswith(f"{named}: ") and expected in message and "\n" not in message


def test_validation_classes_must_match(tmp_path: Path):
    root = image_folder(tmp_path / "train", per_class=2)
    val = tmp_path / "val"
    write_image(val / "cat" / "a.png", 1), write_image(val / "eel" / "b.png", 2)
    with pytest.raises(UserError) as error:
        build_data(spec(root, val_path=str(val)), seed=0)
    assert str(error.value) == (
        f"{val}: validation classes differ from {root}'s (missing dog, emu; extra eel; "
        "expected the same class folders)"
    )


def test_loader_workers_give_the_same_batches_as_this_process(tmp_path: Path):
    bundle = build_data(spec(image_folder(tmp_path / "imgs", per_class=4)), seed=0)
    batches = BatchSampler(SequentialSampler(bundle.train), 3, drop_last=False)
    here = [bundle.train[index] for index in batches]
    loader = DataLoader(bundle.train, sampler=batches, batch_size=None, num_workers=2)
    there = list(loader)
    assert len(there) == len(here) == 3
    for (x, y, io), (x2, y2, io2) in zip(here, there, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2) and io[4] == io2[4] and io[3] == io2[3]


def test_training_decodes_in_loader_workers_and_records_it(tmp_path: Path):
    root = image_folder(tmp_path / "imgs", per_class=8)
    run = parse_spec(
        {
            "name": "images",
            "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
            "data": {"name": "images", "path": str(root)},
            "batch_size": 6,
            "epochs": 2,
            "loader": {"workers": 2},
            "optimizer": {"name": "adam", "lr": 0.01},
            "device": "cpu",
        }
    )
    api.train(run, out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "completed"
    data = record["data"]
    assert data["read_from_disk"] is True and data["streamed"] is False
    assert data["train_samples"] == 19 and data["input_shape"] == [3, 6, 7]
    assert record["timing"]["decode_s_per_sample"] > 0 and record["timing"]["bad_samples"] == 0
    assert record["timing"]["read_bytes"] > 0
