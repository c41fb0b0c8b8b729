"""Content digests: sha256 over tensors' raw bytes and plain data, equal wherever they load.

A checkpoint's digest is taken over what it holds, not over the file: the same state saved
twice gives the same digest, and a flipped byte anywhere in a tensor's data or in the plain
data around it (a step, a spec hash) changes it, while torch's loader, which does not check
the zip's CRCs, would hand the damage on unnoticed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def feed_tensor(digest, tensor: torch.Tensor) -> None:
    """Its dtype, shape and raw bytes (any dtype, bf16 too; a GPU tensor is copied first)."""
    tensor = tensor.detach().cpu().contiguous()
    digest.update(f"{tensor.dtype}|{list(tensor.shape)}".encode() + b"\x00")
    digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # its buffer, not a copy


def _feed(digest, value: Any) -> None:
    # Dicts in insertion order: pickling keeps it, so the loaded state walks as the saved one.
    if isinstance(value, torch.Tensor):
        digest.update(b"T")
        feed_tensor(digest, value)
    elif isinstance(value, dict):
        digest.update(b"D%d\x00" % len(value))
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, list | tuple):
        digest.update(b"L%d\x00" % len(value))
        for item in value:
            _feed(digest, item)
    else:  # a number, text, None: its type and repr (1, 1.0 and True differ)
        digest.update(f"{type(value).__name__}:{value!r}".encode() + b"\x00")


def content_digest(value: Any) -> str:
    """sha256 over a nested structure of dicts, lists, tensors and plain values."""
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.hexdigest()
