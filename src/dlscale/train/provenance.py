"""What makes a run reproducible, as digests: the weights it ended with, the data it read, and
the software it ran on (for the service's job records and its reruns' comparisons)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from dlscale import __version__
from dlscale.data import build_data
from dlscale.data.dataset_files import pattern_files, tree_files
from dlscale.data.stage import expected_hashes
from dlscale.jobspec import (
    Cifar10Data,
    HfData,
    IdxData,
    ImagesData,
    NpzData,
    WebDatasetData,
    load_spec,
)
from dlscale.train import checkpoint as ckpt
from dlscale.train.digest import feed_tensor

# Files read in full for the data digest, at most; past it, big files count by size and mtime
# (hashing a terabyte of shards would take longer than the job).
DATA_HASH_LIMIT_BYTES = 256 * 2**20


def _tensor_digest(digest, name: str, value) -> None:
    """Feed one state-dict entry: its name, dtype, shape and raw bytes (any dtype, bf16 too)."""
    digest.update(name.encode() + b"\x00")
    if not isinstance(value, torch.Tensor):  # plain extra state: its JSON, keys sorted
        digest.update(json.dumps(value, sort_keys=True, default=repr).encode() + b"\x00")
        return
    feed_tensor(digest, value)


def state_digest(state: dict) -> str:
    """sha256 over a state dict: sorted keys, each entry's dtype, shape and raw bytes; equal for
    bit-identical weights on any machine."""
    digest = hashlib.sha256()
    for name in sorted(state):
        _tensor_digest(digest, name, state[name])
    return digest.hexdigest()


def weights_digest(run_dir: str | Path) -> str | None:
    """The digest of the model weights in a run's latest checkpoint; None if it saved none."""
    latest = ckpt.latest_checkpoint(Path(run_dir))
    if latest is None:
        return None
    return state_digest(ckpt.load_checkpoint(latest)["model"])


def _stored_files(data) -> list[Path] | None:
    """The files a data section reads, or None for data made in memory (digits, synthetic)."""
    if isinstance(data, WebDatasetData):
        patterns = [p for p in (data.urls, data.val_urls) if p is not None]
        return [f for pattern in patterns for f in pattern_files(pattern)]
    if isinstance(data, HfData | ImagesData):
        folders = [p for p in (data.path, getattr(data, "val_path", None)) if p is not None]
        return [f for folder in folders for f in tree_files(folder)]
    if isinstance(data, NpzData):
        return [p for p in (data.path, data.val_path) if p is not None]
    if isinstance(data, IdxData):
        paths = (data.images, data.labels, data.val_images, data.val_labels)
        return [p for p in paths if p is not None]
    if isinstance(data, Cifar10Data):
        return [*data.train_files, *data.val_files]
    return None


def _files_fingerprint(files: list[Path]) -> dict:
    """Relative names, sizes and sha256 of the files (dataset.json's listed hashes where it has
    them); over DATA_HASH_LIMIT_BYTES of unlisted files, those count by size and mtime."""
    files = sorted({Path(f).absolute() for f in files})
    root = os.path.commonpath([str(f.parent) for f in files])
    known = expected_hashes(files)
    stats = {f: f.stat() for f in files}
    unlisted = sum(stats[f].st_size for f in files if f not in known)
    partial = unlisted > DATA_HASH_LIMIT_BYTES
    digest = hashlib.sha256()
    for path in files:
        size = stats[path].st_size
        if path in known:
            content = known[path]
        elif partial:
            content = f"mtime_ns={stats[path].st_mtime_ns}"
        else:
            with open(path, "rb") as handle:
                content = hashlib.file_digest(handle, "sha256").hexdigest()
        name = os.path.relpath(path, root)
        digest.update(f"{name}\x00{size}\x00{content}\n".encode())
    total = sum(s.st_size for s in stats.values())
    return {"sha256": digest.hexdigest(), "partial": partial, "files": len(files), "bytes": total}


def _memory_fingerprint(spec) -> dict:
    """The train and validation tensors as the spec's seed builds them (dtype, shape, bytes)."""
    bundle = build_data(spec.data, spec.seed)
    digest = hashlib.sha256()
    total = 0
    for split in (bundle.train, bundle.val):
        for index, tensor in enumerate(split.tensors):
            _tensor_digest(digest, str(index), tensor)
            total += tensor.numel() * tensor.element_size()
    return {"sha256": digest.hexdigest(), "partial": False, "files": 0, "bytes": total}


def data_fingerprint(spec_path: str | Path) -> dict:
    """{"sha256", "partial", "files", "bytes"} of the data a spec trains on; `partial` when
    big files were identified by size and mtime rather than read."""
    spec = load_spec(spec_path)
    files = _stored_files(spec.data)
    return _memory_fingerprint(spec) if files is None else _files_fingerprint(files)


def data_digest(spec_path: str | Path) -> str:
    """sha256 of the data a spec trains on (see data_fingerprint)."""
    return data_fingerprint(spec_path)["sha256"]


def _declared_dependencies() -> list[str]:
    """The names of the packages dlscale's metadata requires (extras included)."""
    names = []
    for requirement in metadata.requires("dlscale") or []:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match:
            names.append(match.group(0))
    return sorted(set(names), key=str.lower)


def environment() -> dict:
    """The software a job ran on: Python, the platform, dlscale, torch, numpy and the installed
    versions of dlscale's declared dependencies."""
    packages = {}
    for name in _declared_dependencies():
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an optional extra (ray) not installed here
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "dlscale": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "packages": packages,
    }
