"""The data verbs: convert a data set into shards, and stage a data set's files to local disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlscale.data.convert import convert
from dlscale.data.dataset_files import source_files
from dlscale.data.stage import stage
from dlscale.errors import UserError
from dlscale.units import parse_bytes


def convert_data(
    source: str | Path,
    out: str | Path,
    format: str = "webdataset",
    shard_size: str | int = "64MB",
    image_format: str = "npy",
    samples: int | None = None,
    shape: list[int] | None = None,
    classes: int | None = None,
    seed: int | None = None,
    val_fraction: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write `source` (digits, synthetic or a job spec's data) into `out` as WebDataset shards
    with dataset.json, or as a Hugging Face dataset (`format="hf"`); what was written."""
    options = {
        "samples": samples,
        "shape": shape,
        "classes": classes,
        "seed": seed,
        "val_fraction": val_fraction,
    }
    return convert(
        source, Path(out), format, shard_bytes(shard_size), image_format, on_progress, **options
    )


def shard_bytes(size: str | int) -> int:
    """`--shard-size`: '64MB', '1GiB' or bytes → bytes, one line when it is not a size."""
    try:
        value = parse_bytes(size)
    except ValueError as exc:
        raise UserError(f"--shard-size: {exc}") from None
    if not isinstance(value, int) or value < 1:
        raise UserError(f"--shard-size: '{size}' is not a positive size such as 64MB or 1GiB")
    return value


def stage_data(source: str | Path, dst: str | Path) -> dict:
    """Copy a data set (a shard pattern, or a folder of shards, an hf dataset or images) into
    `dst`, resumably and verified by sha256; the staging record, with the read rate."""
    files, root = source_files(source)
    record = stage(files, root, Path(dst), rehash=True)  # the command's promise: hashed now
    seconds = record["seconds"]
    record["copied_bytes_per_s"] = record["copied_bytes"] / seconds if seconds > 0 else None
    return record
