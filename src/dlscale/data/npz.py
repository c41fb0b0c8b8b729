"""NumPy .npz archives with arrays x (samples first) and y (integer labels or next tokens)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import split_train_val
from dlscale.errors import UserError, one_line
from dlscale.jobspec import NpzData

PIXEL_MAX_VALUE = 255.0
ZIP_MAGIC = b"PK"  # every zip record signature starts with Phil Katz's initials
NPY_MAGIC = b"\x93NUMPY"


def read_npz(spec: NpzData, seed: int) -> DataBundle:
    """Arrays x and y as a DataBundle; validation from `val_path`, else a seeded split.

    x: uint8 → float32 / 255, floating → float32, other integers (N, T) → int64 token sequences.
    y: int64 labels (N,), or next tokens (N, T) shaped like token x (language modelling).
    """
    x, y = read_npz_file(spec.path)
    if spec.val_path is not None:
        val_x, val_y = read_npz_file(spec.val_path)
        _check_same_layout(spec.path, x, y, spec.val_path, val_x, val_y)
        train, val = TensorDataset(x, y), TensorDataset(val_x, val_y)
        all_x, all_y = (x, val_x), (y, val_y)
    else:
        train, val = split_train_val(x, y, spec.val_fraction, seed, source=str(spec.path))
        all_x, all_y = (x,), (y,)
    max_label = max(int(t.max()) for t in all_y)
    if y.ndim == 2:  # next tokens: the vocabulary covers inputs and targets
        vocab_size = max(max_label, *(int(t.max()) for t in all_x)) + 1
        num_classes, task = vocab_size, "language_modeling"
    else:
        vocab_size = max(int(t.max()) for t in all_x) + 1 if x.dtype == torch.int64 else None
        num_classes, task = max(max_label + 1, 2), "classification"
    return DataBundle(
        train=train,
        val=val,
        num_classes=num_classes,
        task=task,
        vocab_size=vocab_size,
    )


def read_npz_file(path: Path, labels: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One archive's (x, y) as tensors, converted and checked; UserError if malformed. With
    `labels=False` (inputs to predict on), y may be absent: then it is None."""
    raw_x, raw_y = _load_arrays(path, labels)
    x = _convert_x(path, raw_x)
    y = None if raw_y is None else _convert_y(path, raw_y, raw_x)
    return x, y


def _load_arrays(path: Path, labels: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Arrays x and y from the archive, without ever unpickling (allow_pickle=False)."""
    _check_is_zip(path)
    # numpy's parser fails on damaged bytes with many exception types (BadZipFile, zlib.error,
    # ValueError, even SyntaxError from a mangled .npy header); every one means a bad file.
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise UserError(f"{path}: cannot read as a NumPy .npz archive ({one_line(exc)})") from None
    with loaded:
        for name in ("x", "y") if labels else ("x",):
            if name not in loaded.files:
                found = ", ".join(loaded.files) or "none"
                raise UserError(
                    f"{path}: missing array '{name}' (expected arrays x and y; found: {found})"
                )
        try:
            return loaded["x"], loaded["y"] if "y" in loaded.files else None
        except Exception as exc:
            raise UserError(f"{path}: cannot read arrays x and y ({one_line(exc)})") from None


def _check_is_zip(path: Path) -> None:
    """An .npz is a zip archive; say so plainly before numpy guesses (it tries pickle next)."""
    try:
        with path.open("rb") as file:
            magic = file.read(len(NPY_MAGIC))
    except OSError as exc:
        raise UserError(f"{path}: cannot read file ({exc.strerror or one_line(exc)})") from None
    if magic == NPY_MAGIC:
        raise UserError(
            f"{path}: is a single .npy array, not an .npz archive (expected arrays x and y; "
            "write them with np.savez(path, x=x, y=y))"
        )
    if not magic.startswith(ZIP_MAGIC):
        raise UserError(
            f"{path}: not an .npz archive (expected a zip file with arrays x and y, as written "
            f"by np.savez; found first bytes {magic.hex() or 'none'})"
        )


def _convert_x(path: Path, x: np.ndarray) -> torch.Tensor:
    """uint8 → float32 / 255, floating → float32, 2-D integers → int64 tokens."""
    if x.ndim < 2 or len(x) == 0:
        raise UserError(
            f"{path}: x has shape {x.shape}; expected samples first, at least one sample and at "
            "least one value per sample, e.g. (N, C, H, W), (N, F) or (N, T)"
        )
    if x.dtype == np.uint8:
        return torch.from_numpy(x.astype(np.float32)).div_(PIXEL_MAX_VALUE)
    if np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all():
            raise UserError(f"{path}: x contains NaN or infinite values (expected finite numbers)")
        return torch.from_numpy(x.astype(np.float32))
    if np.issubdtype(x.dtype, np.integer) and x.ndim == 2:
        if x.min() < 0:
            raise UserError(f"{path}: x has negative token ids (expected token ids ≥ 0)")
        return torch.from_numpy(x.astype(np.int64))  # (N, T) token sequences
    raise UserError(
        f"{path}: x has dtype {x.dtype} and shape {x.shape}; expected uint8 pixels, floating "
        "point values, or 2-D integer token sequences (N, T)"
    )


def _convert_y(path: Path, y: np.ndarray, x: np.ndarray) -> torch.Tensor:
    """Integer labels (N,), or next tokens shaped like 2-D integer x, as int64."""
    if not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{path}: y has dtype {y.dtype}; expected integer labels")
    is_tokens = np.issubdtype(x.dtype, np.integer) and x.dtype != np.uint8
    next_tokens = is_tokens and y.shape == x.shape
    if not next_tokens and y.shape != (len(x),):
        expected = f"({len(x)},)" + (f" or {x.shape} (next tokens)" if is_tokens else "")
        raise UserError(f"{path}: y has shape {y.shape}; expected {expected} to match x")
    if y.min() < 0:
        raise UserError(f"{path}: y has negative values (expected labels ≥ 0)")
    return torch.from_numpy(y.astype(np.int64))


def _check_same_layout(
    path: Path,
    x: torch.Tensor,
    y: torch.Tensor,
    val_path: Path,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
) -> None:
    """Validation samples must look like training samples, or the model cannot take both."""
    if val_x.dtype != x.dtype or val_x.shape[1:] != x.shape[1:] or val_y.ndim != y.ndim:
        raise UserError(
            f"{val_path}: x is {val_x.dtype} {tuple(val_x.shape[1:])} per sample with "
            f"{val_y.ndim}-D y, but {path} has {x.dtype} {tuple(x.shape[1:])} with {y.ndim}-D y "
            "(expected the same layout)"
        )
