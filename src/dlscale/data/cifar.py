"""CIFAR-10 binary batches: records of 1 label byte + 3×32×32 pixel bytes, channel-major."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import split_train_val
from dlscale.errors import UserError, one_line
from dlscale.jobspec import Cifar10Data

# https://www.cs.toronto.edu/~kriz/cifar.html, "Binary version".
CIFAR_CHANNELS = 3
CIFAR_SIZE_PX = 32
CIFAR_PIXEL_BYTES = CIFAR_CHANNELS * CIFAR_SIZE_PX * CIFAR_SIZE_PX  # 3072
CIFAR_RECORD_BYTES = 1 + CIFAR_PIXEL_BYTES  # 3073
NUM_CIFAR10_CLASSES = 10
PIXEL_MAX_VALUE = 255.0


def read_cifar10(spec: Cifar10Data, seed: int) -> DataBundle:
    """Train files concatenated → float32 (N, 3, 32, 32) in [0, 1], int64 labels (N,)."""
    x, y = read_cifar_files(spec.train_files)
    if spec.val_files:
        train, val = TensorDataset(x, y), TensorDataset(*read_cifar_files(spec.val_files))
    else:
        train, val = split_train_val(x, y, spec.val_fraction, seed, source=str(spec.train_files[0]))
    return DataBundle(
        train=train,
        val=val,
        num_classes=NUM_CIFAR10_CLASSES,
        task="classification",
    )


def read_cifar_files(paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several batch files, in order: float32 (N, 3, 32, 32) / 255 and int64 (N,)."""
    images, labels = zip(*(read_cifar_file(path) for path in paths), strict=True)
    return torch.cat(images), torch.cat(labels)


def read_cifar_file(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch file: float32 (N, 3, 32, 32) / 255 and int64 (N,); UserError if malformed."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or one_line(exc)})") from None
    record_format = f"CIFAR-10 binary record: 1 label byte + {CIFAR_PIXEL_BYTES} pixel bytes"
    if len(data) == 0:
        raise UserError(
            f"{path}: file is empty (expected {CIFAR_RECORD_BYTES}-byte records; {record_format})"
        )
    if len(data) % CIFAR_RECORD_BYTES != 0:
        raise UserError(
            f"{path}: size {len(data)} bytes is not a multiple of {CIFAR_RECORD_BYTES} "
            f"({record_format})"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD_BYTES)  # (N, 3073)
    labels = records[:, 0]
    bad = np.flatnonzero(labels >= NUM_CIFAR10_CLASSES)
    if len(bad):
        raise UserError(
            f"{path}: record {bad[0]} has label {labels[bad[0]]}, expected 0..9 (CIFAR-10; "
            "the CIFAR-100 binary format, with 2 label bytes, is not supported)"
        )
    pixels = records[:, 1:].reshape(-1, CIFAR_CHANNELS, CIFAR_SIZE_PX, CIFAR_SIZE_PX)
    x = torch.from_numpy(pixels.astype(np.float32)).div_(PIXEL_MAX_VALUE)  # (N, 3, 32, 32)
    y = torch.from_numpy(labels.astype(np.int64))  # (N,)
    return x, y
