"""Data readers: exact values from hand-written files, seeded splits, learnable synthetic data."""

from __future__ import annotations

import gzip
import struct
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.data import build_data
from dlscale.data.build import READERS
from dlscale.data.holdout import split_train_val
from dlscale.errors import UserError
from dlscale.jobspec import (
    Cifar10Data,
    DataSpec,
    DigitsData,
    IdxData,
    NpzData,
    SyntheticData,
)

# ------------------------------------------------------------------------- helpers


def write_idx(path: Path, array: np.ndarray, dtype_code: int = 0x08) -> Path:
    """An IDX file as the MNIST site describes it; gzipped when the name ends in .gz."""
    header = bytes([0, 0, dtype_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_cifar(path: Path, labels: list[int], pixels: np.ndarray) -> Path:
    """CIFAR-10 binary records: one label byte then 3072 channel-major pixel bytes each."""
    records = [
        bytes([label]) + pixels[i].astype(np.uint8).tobytes() for i, label in enumerate(labels)
    ]
    path.write_bytes(b"".join(records))
    return path


def idx_spec(tmp_path: Path, **fields: object) -> IdxData:
    return IdxData.model_validate({"name": "idx", **fields}, context={"base_dir": tmp_path})


def cifar_spec(tmp_path: Path, **fields: object) -> Cifar10Data:
    return Cifar10Data.model_validate({"name": "cifar10", **fields}, context={"base_dir": tmp_path})


def npz_spec(tmp_path: Path, **fields: object) -> NpzData:
    return NpzData.model_validate({"name": "npz", **fields}, context={"base_dir": tmp_path})


def synthetic(seed: int = 0, **fields: object) -> object:
    return build_data(SyntheticData(name="synthetic", **fields), seed)


def assert_user_error(path: Path, call: typing.Callable[[], object], *fragments: str) -> None:
    """call() raises a one-line UserError naming `path` and containing every fragment."""
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------------------- build


def test_every_data_kind_has_a_reader() -> None:
    union = typing.get_args(typing.get_args(DataSpec)[0])
    assert set(union) == set(READERS)


# ------------------------------------------------------------------------------ IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_reads_exact_pixels_and_labels(tmp_path: Path, suffix: str) -> None:
    images = np.arange(3 * 2 * 4).reshape(3, 2, 4) * 10  # values 0..230
    val_images = np.array([[[255, 0, 1, 2], [3, 4, 5, 6]]])
    write_idx(tmp_path / f"train-images{suffix}", images)
    write_idx(tmp_path / f"train-labels{suffix}", np.array([0, 2, 1]))
    write_idx(tmp_path / f"val-images{suffix}", val_images)
    write_idx(tmp_path / f"val-labels{suffix}", np.array([4]))
    spec = idx_spec(
        tmp_path,
        images=f"train-images{suffix}",
        labels=f"train-labels{suffix}",
        val_images=f"val-images{suffix}",
        val_labels=f"val-labels{suffix}",
    )
    bundle = build_data(spec, seed=0)
    x, y = bundle.train.tensors
    assert x.dtype == torch.float32 and x.shape == (3, 1, 2, 4)
    assert torch.equal(x[:, 0], torch.tensor(images, dtype=torch.float32) / 255)
    assert x[2, 0, 1, 3].item() == pytest.approx(230 / 255)
    assert y.dtype == torch.int64 and y.tolist() == [0, 2, 1]
    val_x, val_y = bundle.val.tensors
    assert val_x[0, 0, 0].tolist() == pytest.approx([1.0, 0.0, 1 / 255, 2 / 255])
    assert val_y.tolist() == [4]
    assert bundle.input_shape == (1, 2, 4)
    assert bundle.num_classes == 5  # max label 4 over train and validation, plus one
    assert bundle.task == "classification" and bundle.vocab_size is None


def test_idx_split_keeps_each_image_with_its_label(tmp_path: Path) -> None:
    labels = np.arange(20) % 4
    images = np.broadcast_to(labels[:, None, None] * 50, (20, 3, 3))  # pixels encode the label
    write_idx(tmp_path / "images", images)
    write_idx(tmp_path / "labels", labels)
    bundle = build_data(idx_spec(tmp_path, images="images", labels="labels"), seed=3)
    assert (len(bundle.train), len(bundle.val)) == (16, 4)
    for part in (bundle.train, bundle.val):
        x, y = part.tensors
        assert torch.equal(torch.round(x[:, 0, 0, 0] * 255).long(), y * 50)
    # Stratified: 4 classes, 4 validation samples → one of each.
    assert sorted(bundle.val.tensors[1].tolist()) == [0, 1, 2, 3]


def test_idx_malformed_files_raise_one_line_errors(tmp_path: Path) -> None:
    labels = write_idx(tmp_path / "labels", np.array([1, 2]))
    images = write_idx(tmp_path / "images", np.zeros((2, 2, 2)))
    bad_magic = tmp_path / "bad-magic"
    bad_magic.write_bytes(bytes.fromhex("1234abcd") + bytes(16))
    float_idx = tmp_path / "float-images"
    float_idx.write_bytes(bytes([0, 0, 0x0D, 3]) + struct.pack(">3I", 1, 1, 1) + bytes(4))
    truncated = tmp_path / "truncated-images"
    truncated.write_bytes(images.read_bytes()[:-1])
    truncated_gz = tmp_path / "images.gz"
    truncated_gz.write_bytes(gzip.compress(images.read_bytes())[:-10])
    short = tmp_path / "short"
    short.write_bytes(b"\x00\x00")
    three_labels = write_idx(tmp_path / "three-labels", np.array([1, 2, 3]))

    def load(images_name: str, labels_name: str = "labels") -> object:
        return build_data(idx_spec(tmp_path, images=images_name, labels=labels_name), seed=0)

    assert_user_error(bad_magic, lambda: load("bad-magic"), "not an IDX file", "0x1234abcd")
    assert_user_error(float_idx, lambda: load("float-images"), "0x0d", "not supported", "0x08")
    assert_user_error(truncated, lambda: load("truncated-images"), "payload is 7 bytes", "8")
    assert_user_error(truncated_gz, lambda: load("images.gz"), "gzip")
    assert_user_error(short, lambda: load("short"), "too short")
    assert_user_error(labels, lambda: load("labels"), "1 dimension", "expected 3")
    assert_user_error(images, lambda: load("images", "images"), "3 dimension", "expected 1")
    assert_user_error(three_labels, lambda: load("images", "three-labels"), "3 labels", "2 images")


def test_idx_val_pair_must_be_complete(tmp_path: Path) -> None:
    write_idx(tmp_path / "images", np.zeros((2, 2, 2)))
    write_idx(tmp_path / "labels", np.array([0, 1]))
    with pytest.raises(ValueError, match="val_images and val_labels"):
        idx_spec(tmp_path, images="images", labels="labels", val_images="images")


# ---------------------------------------------------------------------------- CIFAR


def test_cifar_reads_records_channel_major_in_file_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(4, 3072))
    write_cifar(tmp_path / "data_batch_1.bin", [3, 9], pixels[:2])
    write_cifar(tmp_path / "data_batch_2.bin", [0], pixels[2:3])
    write_cifar(tmp_path / "test_batch.bin", [7], pixels[3:])
    spec = cifar_spec(
        tmp_path,
        train_files=["data_batch_1.bin", "data_batch_2.bin"],
        val_files=["test_batch.bin"],
    )
    bundle = build_data(spec, seed=0)
    x, y = bundle.train.tensors
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
    assert y.tolist() == [3, 9, 0] and y.dtype == torch.int64
    expected = torch.tensor(pixels[:3].reshape(3, 3, 32, 32), dtype=torch.float32) / 255
    assert torch.equal(x, expected)
    # Channel-major: byte 1024 of a record is the first green pixel.
    assert x[1, 1, 0, 0].item() == pytest.approx(pixels[1, 1024] / 255)
    assert bundle.val.tensors[1].tolist() == [7]
    assert torch.equal(
        bundle.val.tensors[0][0, 2, 31, 31] * 255, torch.tensor(float(pixels[3, -1]))
    )
    assert bundle.input_shape == (3, 32, 32) and bundle.num_classes == 10


def test_cifar_splits_without_val_files(tmp_path: Path) -> None:
    write_cifar(tmp_path / "b.bin", [i % 10 for i in range(10)], np.zeros((10, 3072)))
    bundle = build_data(cifar_spec(tmp_path, train_files=["b.bin"], val_fraction=0.3), seed=1)
    assert (len(bundle.train), len(bundle.val)) == (7, 3)


def test_cifar_malformed_files_raise_one_line_errors(tmp_path: Path) -> None:
    odd = tmp_path / "odd.bin"
    odd.write_bytes(bytes(1000))
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    cifar100 = write_cifar(tmp_path / "c100.bin", [1, 12], np.zeros((2, 3072)))

    def load(name: str) -> object:
        return build_data(cifar_spec(tmp_path, train_files=[name]), seed=0)

    assert_user_error(odd, lambda: load("odd.bin"), "size 1000 bytes", "not a multiple of 3073")
    assert_user_error(empty, lambda: load("empty.bin"), "empty")
    assert_user_error(cifar100, lambda: load("c100.bin"), "record 1", "label 12")


# ------------------------------------------------------------------------------ npz


def test_npz_uint8_images_are_scaled(tmp_path: Path) -> None:
    x = np.arange(10 * 2 * 2, dtype=np.uint8).reshape(10, 1, 2, 2)
    np.savez(tmp_path / "train.npz", x=x[:6], y=np.arange(6) % 3)
    np.savez(tmp_path / "val.npz", x=x[6:], y=np.array([0, 1, 2, 0], dtype=np.int32))
    bundle = build_data(npz_spec(tmp_path, path="train.npz", val_path="val.npz"), seed=0)
    train_x, train_y = bundle.train.tensors
    assert torch.equal(train_x, torch.tensor(x[:6], dtype=torch.float32) / 255)
    assert train_y.tolist() == [0, 1, 2, 0, 1, 2]
    assert bundle.val.tensors[1].dtype == torch.int64
    assert bundle.input_shape == (1, 2, 2) and bundle.num_classes == 3
    assert bundle.vocab_size is None and bundle.task == "classification"


def test_npz_float_features_split(tmp_path: Path) -> None:
    x = np.arange(40 * 3).reshape(40, 3) * 0.5  # float64 becomes float32, not rescaled
    y = np.arange(40) % 2
    np.savez(tmp_path / "d.npz", x=x, y=y)
    bundle = build_data(npz_spec(tmp_path, path="d.npz", val_fraction=0.25), seed=0)
    train_x, train_y = bundle.train.tensors
    assert train_x.dtype == torch.float32 and (len(bundle.train), len(bundle.val)) == (30, 10)
    assert bundle.input_shape == (3,) and bundle.num_classes == 2
    row = (train_x[:, 0] / 1.5).long()  # row i starts with 1.5 * i
    assert torch.equal(train_x, torch.tensor(x[row.numpy()], dtype=torch.float32))
    assert torch.equal(row % 2, train_y)  # each row still has its own label


def test_npz_token_classification_and_language_modelling(tmp_path: Path) -> None:
    tokens = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]], dtype=np.int32)
    np.savez(tmp_path / "cls.npz", x=tokens, y=np.array([0, 1, 0, 1]))
    bundle = build_data(npz_spec(tmp_path, path="cls.npz", val_fraction=0.5), seed=0)
    assert bundle.task == "classification" and bundle.vocab_size == 10
    assert bundle.num_classes == 2 and bundle.train.tensors[0].dtype == torch.int64

    np.savez(tmp_path / "lm.npz", x=tokens[:, :2], y=tokens[:, 1:])
    np.savez(tmp_path / "lm-val.npz", x=np.array([[11, 0]]), y=np.array([[0, 12]]))
    bundle = build_data(npz_spec(tmp_path, path="lm.npz", val_path="lm-val.npz"), seed=0)
    assert bundle.task == "language_modeling"
    assert bundle.vocab_size == 13 and bundle.num_classes == 13  # max token 12 is in val y
    assert bundle.train.tensors[1].tolist() == [[2, 3], [5, 6], [8, 9], [1, 1]]
    assert bundle.input_shape == (2,)


def test_npz_malformed_files_raise_one_line_errors(tmp_path: Path) -> None:
    x = np.zeros((4, 2), dtype=np.float32)
    cases = {
        "no-y.npz": ({"x": x}, ("missing array 'y'", "expected arrays x and y")),
        "short-y.npz": ({"x": x, "y": np.arange(3)}, ("y has shape (3,)", "(4,)")),
        "float-y.npz": ({"x": x, "y": np.zeros(4)}, ("float64", "integer labels")),
        "neg-y.npz": ({"x": x, "y": -np.ones(4, dtype=int)}, ("negative",)),
        "flat-x.npz": ({"x": np.zeros(4), "y": np.zeros(4, dtype=int)}, ("x has shape (4,)",)),
        "nan-x.npz": ({"x": x + np.nan, "y": np.zeros(4, dtype=int)}, ("NaN",)),
        "int-images.npz": (
            {"x": np.zeros((4, 1, 2, 2), dtype=np.int32), "y": np.zeros(4, dtype=int)},
            ("int32", "token sequences"),
        ),
        "objects.npz": (
            {"x": np.array([None] * 4, dtype=object), "y": np.zeros(4, dtype=int)},
            ("pickle",),
        ),
    }
    for name, (arrays, fragments) in cases.items():
        np.savez(tmp_path / name, **arrays)
        assert_user_error(
            tmp_path / name,
            lambda name=name: build_data(npz_spec(tmp_path, path=name), seed=0),
            *fragments,
        )
    not_zip = tmp_path / "garbage.npz"
    not_zip.write_bytes(b"this is not numpy data at all")
    np.save(tmp_path / "single.npy", x)
    truncated = tmp_path / "truncated.npz"
    np.savez(truncated, x=np.arange(1000).reshape(100, 10), y=np.zeros(100, dtype=int))
    truncated.write_bytes(truncated.read_bytes()[:500])
    corrupt = tmp_path / "corrupt.npz"  # damaged deflate stream: numpy raises odd exceptions
    np.savez_compressed(corrupt, x=np.arange(1000.0).reshape(100, 10), y=np.zeros(100, int))
    damaged = bytearray(corrupt.read_bytes())
    damaged[200] ^= 0xFF
    corrupt.write_bytes(bytes(damaged))
    broken = [
        (not_zip, "not an .npz archive"),
        (tmp_path / "single.npy", ".npy array"),
        (truncated, "cannot read"),
        (corrupt, "cannot read"),
    ]
    for path, fragment in broken:
        assert_user_error(path, lambda p=path: build_data(npz_spec(tmp_path, path=p), 0), fragment)


def test_npz_val_file_must_match_train_layout(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 3), np.float32), y=np.zeros(4, dtype=int))
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 5), np.float32), y=np.zeros(4, dtype=int))
    spec = npz_spec(tmp_path, path="a.npz", val_path="b.npz")
    assert_user_error(tmp_path / "b.npz", lambda: build_data(spec, 0), "same layout")


# --------------------------------------------------------------------------- digits


def test_digits_are_the_real_bundled_images() -> None:
    from sklearn.datasets import load_digits

    bundle = build_data(DigitsData(name="digits"), seed=0)
    x = torch.cat([bundle.train.tensors[0], bundle.val.tensors[0]])
    y = torch.cat([bundle.train.tensors[1], bundle.val.tensors[1]])
    assert len(x) == 1797 and (len(bundle.train), len(bundle.val)) == (1437, 360)
    assert x.shape[1:] == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.min() == 0.0 and x.max() == 1.0
    reference = load_digits()
    assert torch.bincount(y).tolist() == np.bincount(reference.target).tolist()
    assert x.sum().item() == pytest.approx(reference.images.sum() / 16, rel=1e-6)
    assert bundle.input_shape == (1, 8, 8) and bundle.num_classes == 10


def test_digits_resize_to_28() -> None:
    small = build_data(DigitsData(name="digits"), seed=0)
    large = build_data(DigitsData(name="digits", image_size=28), seed=0)
    assert large.input_shape == (1, 28, 28)
    assert large.train.tensors[0].shape == (1437, 1, 28, 28)
    assert large.train.tensors[0].min() >= 0.0 and large.train.tensors[0].max() <= 1.0
    # Same seed → same split, so the labels line up and bilinear resizing keeps mean brightness.
    assert torch.equal(small.train.tensors[1], large.train.tensors[1])
    assert large.train.tensors[0].mean().item() == pytest.approx(
        small.train.tensors[0].mean().item(), abs=0.02
    )


def test_digits_split_is_seeded_and_stratified() -> None:
    first = build_data(DigitsData(name="digits"), seed=0)
    again = build_data(DigitsData(name="digits"), seed=0)
    other = build_data(DigitsData(name="digits"), seed=1)
    assert torch.equal(first.val.tensors[0], again.val.tensors[0])
    assert not torch.equal(first.val.tensors[0], other.val.tensors[0])
    val_counts = torch.bincount(first.val.tensors[1], minlength=10).float()
    all_counts = val_counts + torch.bincount(first.train.tensors[1], minlength=10)
    assert torch.all((val_counts - all_counts * 360 / 1797).abs() <= 1)


# ------------------------------------------------------------------------ synthetic


@pytest.mark.parametrize("shape", [[1, 28, 28], [16], [3, 8, 8]])
def test_synthetic_images_shape_and_determinism(shape: list[int]) -> None:
    bundle = synthetic(shape=shape, num_samples=100, num_classes=4, seed=5)
    again = synthetic(shape=shape, num_samples=100, num_classes=4, seed=5)
    other = synthetic(shape=shape, num_samples=100, num_classes=4, seed=6)
    x, y = bundle.train.tensors
    assert x.shape == (80, *shape) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert bundle.val.tensors[0].shape == (20, *shape)
    assert bundle.input_shape == tuple(shape) and bundle.num_classes == 4
    assert x.min() >= 0.0 and x.max() <= 1.0 and y.min() >= 0 and y.max() < 4
    assert torch.equal(x, again.train.tensors[0]) and torch.equal(y, again.train.tensors[1])
    assert not torch.equal(x, other.train.tensors[0])


def test_synthetic_image_classes_are_separable() -> None:
    bundle = synthetic(shape=[8], num_samples=2000, num_classes=10)
    x, y = bundle.train.tensors
    centroids = torch.stack([x[y == k].mean(0) for k in range(10)])  # (K, F)
    val_x, val_y = bundle.val.tensors
    predicted = torch.cdist(val_x, centroids).argmin(1)
    accuracy = (predicted == val_y).float().mean().item()
    assert accuracy > 0.8  # chance is 0.1


def test_synthetic_language_modelling_is_predictable_from_bigrams() -> None:
    vocab = 64
    bundle = synthetic(
        kind="tokens", task="language_modeling", vocab_size=vocab, seq_len=32, num_samples=500
    )
    x, y = bundle.train.tensors
    assert x.shape == (400, 32) and y.shape == (400, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    assert bundle.task == "language_modeling"
    assert bundle.num_classes == vocab and bundle.vocab_size == vocab
    assert bundle.input_shape == (32,) and x.max() < vocab and x.min() >= 0
    counts = torch.zeros(vocab, vocab).index_put_((x.flatten(), y.flatten()), torch.ones(1), True)
    val_x, val_y = bundle.val.tensors
    accuracy = (counts.argmax(1)[val_x] == val_y).float().mean().item()
    assert accuracy > 0.3  # chance is 1/64; the chain makes ~0.45 reachable


def test_synthetic_token_classes_are_identifiable() -> None:
    vocab, classes = 32, 4
    bundle = synthetic(kind="tokens", vocab_size=vocab, num_classes=classes, seq_len=24)
    x, y = bundle.train.tensors
    assert x.shape == (819, 24) and y.shape == (819,) and bundle.task == "classification"
    assert bundle.num_classes == classes and bundle.vocab_size == vocab
    # A bigram table per class; classify validation sequences by log-likelihood.
    log_probs = torch.zeros(classes, vocab, vocab)
    for k in range(classes):
        seqs = x[y == k]
        counts = torch.ones(vocab, vocab).index_put_(
            (seqs[:, :-1].flatten(), seqs[:, 1:].flatten()), torch.ones(1), accumulate=True
        )
        log_probs[k] = (counts / counts.sum(1, keepdim=True)).log()
    val_x, val_y = bundle.val.tensors
    scores = log_probs[:, val_x[:, :-1], val_x[:, 1:]].sum(-1)  # (K, N)
    assert (scores.argmax(0) == val_y).float().mean().item() > 0.9  # chance is 0.25


def test_synthetic_rejects_impossible_settings() -> None:
    with pytest.raises(UserError, match="kind: tokens"):
        synthetic(kind="image", task="language_modeling")
    with pytest.raises(UserError, match="too small"):
        synthetic(num_samples=1)


# ---------------------------------------------------------------------------- split


def test_split_of_next_token_labels_is_a_seeded_permutation() -> None:
    x = torch.arange(50).reshape(10, 5)
    y = x + 1
    train, val = split_train_val(x, y, 0.3, seed=0, source="s")
    again_train, _ = split_train_val(x, y, 0.3, seed=0, source="s")
    assert (len(train), len(val)) == (7, 3)
    assert torch.equal(train.tensors[0], again_train.tensors[0])
    assert torch.equal(train.tensors[0] + 1, train.tensors[1])
    rows = torch.cat([train.tensors[0][:, 0], val.tensors[0][:, 0]]).sort().values
    assert torch.equal(rows, torch.arange(0, 50, 5))


def test_split_with_singleton_class_falls_back_to_permutation() -> None:
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2])  # class 2 cannot be stratified
    train, val = split_train_val(torch.arange(9), y, 0.34, seed=0, source="s")
    assert (len(train), len(val)) == (5, 4)
    assert sorted(torch.cat([train.tensors[0], val.tensors[0]]).tolist()) == list(range(9))
