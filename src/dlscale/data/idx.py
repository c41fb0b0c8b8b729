"""MNIST / Fashion-MNIST IDX files (plain or gzipped), checked header to payload."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import split_train_val
from dlscale.errors import UserError, one_line
from dlscale.jobspec import IdxData

# IDX format (http://yann.lecun.com/exdb/mnist/): magic = 0x00 0x00 <dtype code> <ndim>, then
# ndim big-endian uint32 sizes, then the values in C order.
IDX_UBYTE = 0x08
IDX_DTYPE_NAMES = {
    0x08: "unsigned byte",
    0x09: "signed byte",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}
GZIP_MAGIC = b"\x1f\x8b"
PIXEL_MAX_VALUE = 255.0


def read_idx(spec: IdxData, seed: int) -> DataBundle:
    """Images → float32 (N, 1, H, W) in [0, 1], labels → int64 (N,); split unless val files."""
    x, y = read_idx_pair(spec.images, spec.labels)
    if spec.val_images is not None and spec.val_labels is not None:
        val_x, val_y = read_idx_pair(spec.val_images, spec.val_labels)
        if val_x.shape[1:] != x.shape[1:]:
            raise UserError(
                f"{spec.val_images}: images are {_hw(val_x)} but the training images in "
                f"{spec.images} are {_hw(x)} (expected the same size)"
            )
        train, val = TensorDataset(x, y), TensorDataset(val_x, val_y)
        max_label = max(int(y.max()), int(val_y.max()))
    else:
        train, val = split_train_val(x, y, spec.val_fraction, seed, source=str(spec.images))
        max_label = int(y.max())
    return DataBundle(
        train=train,
        val=val,
        num_classes=max(max_label + 1, 2),
        task="classification",
    )


def read_idx_pair(images_path: Path, labels_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One images file and its labels file: float32 (N, 1, H, W) / 255 and int64 (N,)."""
    images = read_idx_file(images_path, expected_ndim=3, what="an images file (*-idx3-ubyte)")
    labels = read_idx_file(labels_path, expected_ndim=1, what="a labels file (*-idx1-ubyte)")
    if len(images) != len(labels):
        raise UserError(
            f"{labels_path}: {len(labels)} labels but {images_path} has {len(images)} images "
            "(expected one label per image)"
        )
    if len(images) == 0:
        raise UserError(f"{images_path}: contains no images (expected at least one)")
    x = torch.from_numpy(images.astype(np.float32)).div_(PIXEL_MAX_VALUE).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y  # (N, 1, H, W), (N,)


def read_idx_file(path: Path, expected_ndim: int, what: str) -> np.ndarray:
    """The uint8 array stored in an IDX file, shape as its header says; UserError if malformed."""
    data = _read_maybe_gzipped(path)
    if len(data) < 4:
        raise UserError(f"{path}: {len(data)} bytes is too short for an IDX header (4+ bytes)")
    if data[0] != 0 or data[1] != 0:
        found = int.from_bytes(data[:4], "big")
        raise UserError(f"{path}: not an IDX file (expected magic 0x0000080N, found 0x{found:08x})")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != IDX_UBYTE:
        name = IDX_DTYPE_NAMES.get(dtype_code, "unknown")
        raise UserError(
            f"{path}: IDX data type 0x{dtype_code:02x} ({name}) is not supported "
            f"(expected 0x08, unsigned byte, for images and labels)"
        )
    if ndim != expected_ndim:
        raise UserError(
            f"{path}: IDX file has {ndim} dimension(s); expected {expected_ndim} for {what}"
        )
    header_bytes = 4 + 4 * ndim
    if len(data) < header_bytes:
        raise UserError(
            f"{path}: truncated IDX header ({len(data)} bytes; {ndim} dimensions need "
            f"{header_bytes})"
        )
    sizes = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    payload_bytes = len(data) - header_bytes
    expected_bytes = math.prod(sizes)
    if payload_bytes != expected_bytes:
        shape = "×".join(str(s) for s in sizes)
        raise UserError(
            f"{path}: IDX payload is {payload_bytes} bytes but the header says {shape} = "
            f"{expected_bytes} (file truncated or not {what})"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header_bytes).reshape(sizes)


def _read_maybe_gzipped(path: Path) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic (an IDX file cannot)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or one_line(exc)})") from None
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise UserError(
            f"{path}: truncated or corrupt gzip file ({one_line(exc)}); expected a gzipped IDX file"
        ) from None


def _hw(x: torch.Tensor) -> str:
    return f"{x.shape[-2]}×{x.shape[-1]}"
