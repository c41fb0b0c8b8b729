"""The inputs a trained model runs on, read in batches by dlscale's own readers: image files or
folders, `.npz` archives, token (text) files, WebDataset shards, a saved Hugging Face data set.

The kind is named by the path: a `.tar` or a shard pattern is WebDataset, a folder holding
`dataset_dict.json` or `state.json` is a saved Hugging Face data set, any other folder holds
images (one sub-folder per class gives labels, as the `images` reader takes them; loose images
have none), and a file is taken by its suffix. Each is turned into the model's input exactly as
its run's reader turned its training data: images to the run's channels and size (resized only
where the run resized), pixels to [0, 1], text to UTF-8 bytes as tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dlscale.data.hf import HfRows
from dlscale.data.hf_columns import inspect_columns, load_split
from dlscale.data.images import list_images
from dlscale.data.lazy import to_tensor
from dlscale.data.npz import read_npz_file
from dlscale.data.pixels import IMAGE_SUFFIXES, ImageLayout, WrongSize, open_image, to_chw
from dlscale.data.wds import read_webdataset
from dlscale.errors import UserError
from dlscale.infer.trained import TrainedModel
from dlscale.jobspec import HfData, WebDatasetData

KINDS = ("images", "npz", "tokens", "webdataset", "hf")
TOKEN_SUFFIXES = (".txt",)
HF_MARKERS = ("dataset_dict.json", "state.json")  # what `save_to_disk` writes
USUAL_COLUMNS = ("image", "input", "x", "text")
USUAL_SETTINGS = ("image_column", "input_column", "input_column", "text_column")
# (inputs, labels or None, one name per sample): what every source yields.
Batch = tuple[torch.Tensor, torch.Tensor | None, list[str]]


@dataclass(frozen=True)
class Source:
    """One input path: its kind, how many samples it holds, and its batches in order."""

    path: str
    kind: str
    count: int
    labelled: bool
    batches: Callable[[int], Iterator[Batch]]  # batch size → batches


def kind_of(path: str) -> str:
    """Which reader a path needs; one line for a path that is none of them."""
    if path.endswith(".tar") or any(mark in path for mark in ("{", "*", "?")):
        return "webdataset"
    where = Path(path)
    if where.is_dir():
        return "hf" if any((where / marker).is_file() for marker in HF_MARKERS) else "images"
    if not where.exists():
        raise UserError(f"{path}: no such input file or folder")
    suffix = where.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in IMAGE_SUFFIXES:
        return "images"
    if suffix in TOKEN_SUFFIXES:
        return "tokens"
    raise UserError(
        f"{path}: unknown input format '{suffix or where.name}' (expected images "
        f"({', '.join(IMAGE_SUFFIXES)}) or a folder of them, .npz, .txt tokens, WebDataset "
        ".tar shards, or a Hugging Face data set folder)"
    )


def open_source(path: str | Path, trained: TrainedModel, split: str | None = None) -> Source:
    """The reader for `path`'s kind, set up to give the model of `trained` its inputs."""
    path = str(path)
    kind = kind_of(path)
    if split is not None and kind != "hf":
        raise UserError(f"--split names a split of a Hugging Face data set; {path} is {kind}")
    return OPENERS[kind](path, trained, split)


def decode_images(layout: ImageLayout, sources: Sequence[bytes | str | Path]) -> torch.Tensor:
    """Image files (or their bytes) as one batch (N, C, H, W) in [0, 1], in `layout`; one that
    does not decode, or has another size where the run did not resize, is one line naming it."""
    decoded = []
    for index, source in enumerate(sources):
        where = f"image {index}" if isinstance(source, bytes) else str(source)
        try:
            image = open_image(source, None if layout.resize else (layout.height, layout.width))
        except WrongSize as exc:  # said from the header: the pixels were never decoded
            raise UserError(
                f"{where}: {exc}; this model takes {layout.height}×{layout.width} (its run "
                "did not resize its images)"
            ) from None
        except ValueError as exc:
            raise UserError(f"{where}: {exc}") from None
        decoded.append(to_tensor(to_chw(image, layout, where)))  # (C, H, W)
    if not decoded:
        raise UserError("no images given")
    return torch.stack(decoded)


def _images(path: str, trained: TrainedModel, split: str | None) -> Source:
    layout = trained.image_layout()
    where = Path(path)
    labels: np.ndarray | None = None
    if where.is_file():
        paths = [path]
    elif any(entry.is_dir() and not entry.name.startswith(".") for entry in os.scandir(where)):
        classes, paths, labels = list_images(where)  # class folders: labels, as training read
        if len(classes) != trained.num_classes:
            raise UserError(
                f"{path}: {len(classes)} class folders, but the model has {trained.num_classes} "
                "classes: labels are the class folders' places in name order, so every class "
                "needs its folder (put unlabelled images directly in the folder instead)"
            )
    else:
        paths = sorted(
            str(where / name)
            for name in os.listdir(where)
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES)
        )
        if not paths:
            raise UserError(f"{path}: no images (expected files ending in {IMAGE_SUFFIXES})")

    def batches(size: int) -> Iterator[Batch]:
        for start in range(0, len(paths), size):
            chunk = paths[start : start + size]
            y = None if labels is None else torch.from_numpy(labels[start : start + size])
            yield decode_images(layout, chunk), y, chunk

    return Source(path, "images", len(paths), labels is not None, batches)


def _npz(path: str, trained: TrainedModel, split: str | None) -> Source:
    x, y = read_npz_file(Path(path), labels=False)  # converted as the npz reader trains on it

    def batches(size: int) -> Iterator[Batch]:
        for start in range(0, len(x), size):
            names = [f"{path}[{i}]" for i in range(start, min(start + size, len(x)))]
            yield x[start : start + size], None if y is None else y[start : start + size], names

    return Source(path, "npz", len(x), y is not None, batches)


def _tokens(path: str, trained: TrainedModel, split: str | None) -> Source:
    """A text file as UTF-8 bytes, one token per byte (as the hf reader reads text), cut into
    windows of the run's sequence length; a language model's labels are each window's next
    tokens, read from the file itself."""
    if trained.input_kind != "tokens":
        raise UserError(f"{path}: token file, but this model takes {trained.input_kind}")
    tokens = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8).astype(np.int64)
    length = trained.input_shape[0]
    language = trained.task == "language_modeling"
    span = length + 1 if language else length  # a window and, for a language model, its next
    count = len(tokens) // span
    if count == 0:
        raise UserError(
            f"{path}: {len(tokens)} tokens (bytes); this model reads {length} at a time"
            + (" and predicts the next" if language else "")
        )
    windows = torch.from_numpy(tokens[: count * span].reshape(count, span))
    if int(windows.max()) >= (trained.vocab_size or 0):
        raise UserError(
            f"{path}: byte value {int(windows.max())} is not in this model's vocabulary of "
            f"{trained.vocab_size} tokens"
        )

    def batches(size: int) -> Iterator[Batch]:
        for start in range(0, count, size):
            part = windows[start : start + size]
            names = [f"{path}@{i * span}" for i in range(start, start + len(part))]
            if language:
                yield part[:, :-1], part[:, 1:], names
            else:
                yield part, None, names

    return Source(path, "tokens", count, language, batches)


def _webdataset(path: str, trained: TrainedModel, split: str | None) -> Source:
    """Every sample of the shards once, in file order: read as the run's validation stream."""
    # Resized to the model's size where the run resized its images (digits give one number).
    resized = trained.input_kind == "image" and trained.data_spec.get("image_size") is not None
    size = list(trained.input_shape[1:]) if resized else None
    spec = WebDatasetData(
        name="webdataset", urls=path, val_urls=path, shuffle_buffer=0, image_size=size
    )
    stream = read_webdataset(spec, 0).val

    def batches(size: int) -> Iterator[Batch]:
        done = 0
        for x, y, _io in stream.batches(0, 0, size, shuffle=False, drop_last=False):
            yield x, y, [f"{path}#{i}" for i in range(done, done + len(x))]
            done += len(x)

    return Source(path, "webdataset", len(stream), True, batches)


def _hf(path: str, trained: TrainedModel, split: str | None) -> Source:
    """A split of a saved data set (default: its validation split, else the one data set),
    read with the run's columns when it trained on one, else the usual column names (those
    `dlscale data convert --format hf` writes)."""
    where = HfData(name="hf", path=path, split=split, image_column="image")
    first, validation = load_split(where)
    dataset = validation if split is None and validation is not None else first
    run = trained.data_spec if trained.data_spec.get("name") == "hf" else {}
    settings = ("image_column", "input_column", "text_column", "label_column")
    columns = {key: run[key] for key in settings if run.get(key)} or _usual(dataset, path)
    spec = HfData(name="hf", path=path, split=split, seq_len=trained.input_shape[0], **columns)
    rows = HfRows(dataset, None, inspect_columns(dataset, spec), spec)
    if rows.columns.kind in ("image", "image_array"):
        rows.layout = trained.image_layout()
    elif rows.columns.kind == "array":
        rows.shape = trained.input_shape

    def batches(size: int) -> Iterator[Batch]:
        for start in range(0, len(rows), size):
            indices = list(range(start, min(start + size, len(rows))))
            x, y, _io = rows[indices]
            yield x, y, [rows.where(i) for i in indices]

    return Source(path, "hf", len(rows), True, batches)


def _usual(dataset, path: str) -> dict[str, str]:
    """The input column by its usual name: `image`, `input` (data convert's), `x`, `text`."""
    names = dataset.column_names
    for name, setting in zip(USUAL_COLUMNS, USUAL_SETTINGS, strict=True):
        if name in names:
            return {setting: name}
    raise UserError(
        f"{path}: no input column named {', '.join(USUAL_COLUMNS)} (columns: "
        f"{', '.join(names)}); the run did not train on a Hugging Face data set to name one"
    )


OPENERS: dict[str, Callable[[str, TrainedModel, str | None], Source]] = {
    "images": _images,
    "npz": _npz,
    "tokens": _tokens,
    "webdataset": _webdataset,
    "hf": _hf,
}
