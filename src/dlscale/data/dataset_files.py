"""Which files a data set on disk is made of, and its spec pointed at their staged copy.

`data.stage: DIR` and `dlscale data stage SRC DST` share this: a shard pattern is its shards
plus the dataset.json beside them; a folder (a Hugging Face dataset, a tree of images, a folder
of shards) is every file under it. Files keep their layout below the data set's root folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlscale.data.images import list_images
from dlscale.data.shards import expand_pattern
from dlscale.data.stage import PART_SUFFIX, STAGING_FILES, check_outside, stage
from dlscale.errors import UserError
from dlscale.jobspec import HfData, ImagesData, StoredData, WebDatasetData


def stage_spec(spec: StoredData, run: str | None = None) -> tuple[StoredData, dict]:
    """Stage the files `spec` reads into `spec.stage`; the spec reading the copies instead,
    and the staging record for the run (its folder `run`: see stage.stage)."""
    assert spec.stage is not None
    dst = spec.stage
    if isinstance(spec, WebDatasetData):
        patterns = [p for p in (spec.urls, spec.val_urls) if p is not None]
        files = [f for pattern in patterns for f in pattern_files(pattern)]
        folders = sorted({f.parent for f in files})
        root = _common_root(folders)
        update = {name: _moved(getattr(spec, name), root, dst) for name in ("urls", "val_urls")}
    elif isinstance(spec, HfData | ImagesData):
        folders = [p for p in (spec.path, getattr(spec, "val_path", None)) if p is not None]
        root = _common_root(folders)
        check_outside(folders, dst)  # before listing: a stage folder inside would be listed too
        files = [f for folder in folders for f in tree_files(folder)]
        update = {"path": Path(_moved(str(spec.path), root, dst))}
        if isinstance(spec, ImagesData) and spec.val_path is not None:
            update["val_path"] = Path(_moved(str(spec.val_path), root, dst))
    else:  # the spec's union admits only the kinds above as StoredData
        raise AssertionError(f"no staging layout for {type(spec).__name__}")
    record = stage(sorted(set(files)), root, dst, sources=folders, run=run)
    return spec.model_copy(update=update), record


def source_files(source: str | Path) -> tuple[list[Path], Path]:
    """`dlscale data stage SRC`: the files of a shard pattern or a folder, and their root."""
    text = str(source)
    if Path(text).is_dir():
        folder = Path(text).resolve()
        check_data_set(folder)
        return tree_files(folder), folder
    if Path(text).is_file() or any(mark in text for mark in "{}*?["):
        files = pattern_files(str(Path(text).absolute()))
        return files, _common_root([f.parent for f in files])
    raise UserError(
        f"{source}: not found: give a shard pattern (shards/train-{{000000..000009}}.tar), a "
        "folder of shards with dataset.json, a Hugging Face dataset folder or a folder of images"
    )


def pattern_files(pattern: str) -> list[Path]:
    """A shard pattern's files (each must exist), plus the dataset.json beside them."""
    files = [Path(name) for name in dict.fromkeys(expand_pattern(pattern))]
    listings = {f.parent / "dataset.json" for f in files}
    return files + sorted(p for p in listings if p.is_file())


# What marks a folder as a data set `data stage` copies whole: convert's listing of its shards,
# and the files `datasets.save_to_disk` writes for a Dataset and for a DatasetDict.
DATA_SET_MARKERS = ("dataset.json", "state.json", "dataset_dict.json")


def check_data_set(folder: Path) -> None:
    """One line unless `folder` is a data set dlscale reads: shards (with dataset.json, or
    .tar files), a Hugging Face dataset saved to disk, or class folders of images."""
    if any((folder / name).is_file() for name in DATA_SET_MARKERS):
        return
    if any(path.suffix == ".tar" for path in folder.iterdir() if path.is_file()):
        return
    try:
        list_images(folder)
    except UserError as exc:
        raise UserError(
            f"{folder}: not a data set, so nothing was copied: expected a folder of shards "
            "(.tar files, or dataset.json from `dlscale data convert`), a Hugging Face "
            "dataset saved to disk (dataset_info.json and state.json, or dataset_dict.json), "
            f"or class folders of images ({exc})"
        ) from None


def tree_files(folder: Path) -> list[Path]:
    """Every file under `folder` (not staging's own files)."""
    found = []
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.name in STAGING_FILES or path.name.endswith(PART_SUFFIX):
            continue
        found.append(path)
    if not found:
        raise UserError(f"{folder}: no files to stage in this folder")
    return found


def _common_root(folders: list[Path]) -> Path:
    return Path(os.path.commonpath([str(Path(f).absolute()) for f in folders]))


def _moved(path: str | None, root: Path, dst: Path) -> str | None:
    """`path` (a file, folder or brace pattern under `root`) as it lies once staged in `dst`."""
    if path is None:
        return None
    return str(Path(dst) / os.path.relpath(str(Path(path).absolute()), root))
