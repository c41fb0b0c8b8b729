"""A folder of images, one sub-folder per class, decoded with Pillow a batch at a time.

The layout torchvision's `ImageFolder` reads: `path/<class>/<image>` (sub-folders of a class
folder are searched too). Class folders sorted by name give the class indices. Listing opens
only the first image (it sets mode and size); the rest are read and decoded while training, in
the loader's worker processes when `loader.workers` > 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import _split_indices, num_val_samples
from dlscale.data.lazy import DataError, LazyDataset, to_tensor
from dlscale.data.pixels import IMAGE_SUFFIXES, ImageLayout, layout_of, open_image, to_chw
from dlscale.errors import UserError
from dlscale.jobspec import ImagesData


class ImageFiles(LazyDataset):
    """Image files and their class indices; a sample is one file read and decoded."""

    def __init__(self, paths: list[str], labels: np.ndarray, layout: ImageLayout, skip_bad: bool):
        super().__init__(len(paths), skip_bad)
        self.paths = paths
        self.labels = labels  # (N,) int64
        self.layout = layout

    def read(self, index: int) -> tuple[bytes, int]:
        data = Path(self.paths[index]).read_bytes()
        return data, len(data)

    def decode(self, raw: bytes, index: int) -> tuple[torch.Tensor, int]:
        image = open_image(raw)
        return to_tensor(to_chw(image, self.layout, self.paths[index])), int(self.labels[index])

    def where(self, index: int) -> str:
        return self.paths[index]

    def files(self) -> list[str]:
        return list(self.paths)

    def subset(self, indices: np.ndarray) -> ImageFiles:
        """The samples at `indices` (a list of names, not a copy of any image)."""
        paths = [self.paths[i] for i in indices]
        return ImageFiles(paths, self.labels[indices], self.layout, self.skip_bad)


def read_images(spec: ImagesData, seed: int) -> DataBundle:
    """The image folder (and `val_path`, else a seeded `val_fraction` split) as a DataBundle."""
    classes, paths, labels = list_images(spec.path)
    layout = layout_of(_first_image(paths, spec.skip_bad), spec.image_size, spec.mode)
    everything = ImageFiles(paths, labels, layout, spec.skip_bad)
    if spec.val_path is not None:
        val_classes, val_paths, val_labels = list_images(spec.val_path)
        _check_same_classes(spec.path, classes, spec.val_path, val_classes)
        train, val = everything, ImageFiles(val_paths, val_labels, layout, spec.skip_bad)
    else:
        num_val = num_val_samples(len(paths), spec.val_fraction, str(spec.path))
        # Stratified by class when every class can give to both sides, as for data in memory.
        val_index, train_index = _split_indices(torch.from_numpy(labels), num_val, seed)
        train = everything.subset(train_index.numpy())
        val = everything.subset(val_index.numpy())
    return DataBundle(
        train=train, val=val, num_classes=max(len(classes), 2), _input_shape=layout.shape
    )


def list_images(root: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(class names, image paths, labels) of a class-per-folder tree; no image is opened."""
    classes = sorted(
        entry.name for entry in os.scandir(root) if entry.is_dir() and not _hidden(entry.name)
    )
    if not classes:
        loose = sum(1 for entry in os.scandir(root) if _is_image(entry.name))
        found = f"found {loose} image(s) but no sub-folder" if loose else "found no sub-folder"
        raise UserError(f"{root}: no class folders ({found}; expected {root}/<class>/<image>)")
    paths: list[str] = []
    labels: list[int] = []
    for index, name in enumerate(classes):
        found = _images_under(root / name)
        if not found:
            raise UserError(
                f"{root / name}: class folder has no images "
                f"(expected files ending in {', '.join(IMAGE_SUFFIXES)})"
            )
        paths += found
        labels += [index] * len(found)
    return classes, paths, np.asarray(labels, dtype=np.int64)


def _images_under(folder: Path) -> list[str]:
    """Image files under a class folder, sorted, hidden files and folders left out."""
    found = []
    for parent, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))  # walk in order, skip .cache etc.
        found += [os.path.join(parent, n) for n in sorted(names) if _is_image(n)]
    return found


def _is_image(name: str) -> bool:
    return not _hidden(name) and name.lower().endswith(IMAGE_SUFFIXES)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _first_image(paths: list[str], skip_bad: bool):
    """The first image that decodes (it sets the layout); with skip_bad, bad ones are passed."""
    for path in paths:
        try:
            return open_image(path)
        except ValueError as error:
            if not skip_bad:
                raise DataError(
                    f"{path}: {error} (data.skip_bad: true skips and counts such images)"
                ) from None
    raise DataError(f"{Path(paths[0]).parent.parent}: none of {len(paths)} images decodes")


def _check_same_classes(path: Path, classes: list[str], val_path: Path, val_classes: list[str]):
    """Class indices come from folder names, so both folders must name the same classes."""
    if classes == val_classes:
        return
    missing = sorted(set(classes) - set(val_classes))
    extra = sorted(set(val_classes) - set(classes))
    differences = [
        f"{what} {', '.join(names)}"
        for what, names in (("missing", missing), ("extra", extra))
        if names
    ]
    raise UserError(
        f"{val_path}: validation classes differ from {path}'s ({'; '.join(differences)}; "
        "expected the same class folders)"
    )
