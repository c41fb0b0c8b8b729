"""Decoding one WebDataset sample's fields into the (input, label) tensors a model takes.

Input: `input.npy` (uint8 images (C, H, W) scaled to [0, 1], float32 features, int64 token
ids) or an image file (png, jpg, jpeg, webp, bmp, ppm; decoded by `dlscale.data.pixels`: grey
gives one channel, colour three). Label: `cls` (an ASCII integer) or `target.npy` (int64 next
tokens).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dlscale.data.lazy import DataError, to_tensor
from dlscale.data.pixels import ImageLayout, layout_of, open_image, to_chw
from dlscale.errors import one_line

ARRAY_FIELDS = ("input.npy", "npy")
IMAGE_FIELDS = ("png", "jpg", "jpeg", "webp", "bmp", "ppm")
LABEL_FIELDS = ("cls", "target.npy")


def input_field(fields: dict[str, bytes]) -> str | None:
    return next((f for f in (*ARRAY_FIELDS, *IMAGE_FIELDS) if f in fields), None)


def label_field(fields: dict[str, bytes]) -> str | None:
    return next((f for f in LABEL_FIELDS if f in fields), None)


@dataclass
class SampleDecoder:
    """Decodes samples to one shape: the first sample's, or `image_size` for images."""

    image_size: tuple[int, int] | None = None  # (height, width)
    input_shape: tuple[int, ...] | None = None  # set from the first sample; others must match
    num_classes: int | None = None  # classes (or vocabulary): labels must lie below it
    vocab_size: int | None = None  # token inputs: ids must lie below it
    layout: ImageLayout | None = None  # image files: the first one's mode and size

    def decode(self, fields: dict[str, bytes], where: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, label) of one sample; DataError naming `where` for anything that is off."""
        source, target = input_field(fields), label_field(fields)
        if source is None or target is None:
            missing = (
                "input (input.npy or an image: png, jpg, ...)"
                if source is None
                else "label (cls or target.npy)"
            )
            raise DataError(f"{where}: no {missing} field; found: {', '.join(sorted(fields))}")
        x = self._input(fields[source], source, where)
        y = self._label(fields[target], target, where)
        if self.input_shape is not None and tuple(x.shape) != self.input_shape:
            hint = " (set data.image_size: [height, width] to resize every image to one size)"
            raise DataError(
                f"{where}: {source} has shape {tuple(x.shape)}, but the first sample's is "
                f"{self.input_shape}" + (hint if x.ndim == 3 and self.image_size is None else "")
            )
        return x, y

    def _input(self, data: bytes, field: str, where: str) -> torch.Tensor:
        try:
            if field in IMAGE_FIELDS:
                return to_tensor(self._image(data, where))
            x = to_tensor(np.load(io.BytesIO(data), allow_pickle=False))
        except DataError:
            raise
        except Exception as error:  # Pillow and numpy raise many kinds for a corrupt file
            raise DataError(
                f"{where}: {field} does not decode: {type(error).__name__}: "
                f"{one_line(error) or 'no detail'}"
            ) from None
        if self.image_size is not None and x.ndim == 3 and x.is_floating_point():
            x = F.interpolate(x[None], size=self.image_size, mode="bilinear", antialias=True)[0]
        if not x.is_floating_point():
            self._check_range(x, self.vocab_size, "token id", where)
        return x

    def _image(self, data: bytes, where: str) -> np.ndarray:
        """(C, H, W) uint8 of an encoded image in the first image's layout (or image_size)."""
        image = open_image(data)
        if self.layout is None:
            self.layout = layout_of(image, self.image_size, None)
        return to_chw(image, self.layout, where)

    def _label(self, data: bytes, field: str, where: str) -> torch.Tensor:
        try:
            if field == "cls":
                y = torch.tensor(int(data.decode("ascii").strip()))
            else:
                y = torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False)).long()
        except Exception as error:
            raise DataError(
                f"{where}: {field} is not an integer label: {type(error).__name__}: "
                f"{one_line(error) or 'no detail'}"
            ) from None
        self._check_range(y, self.num_classes, "label", where)
        return y

    @staticmethod
    def _check_range(values: torch.Tensor, limit: int | None, what: str, where: str) -> None:
        """Out-of-range ids fail deep in the loss or the embedding; name the sample instead."""
        if limit is None or values.numel() == 0:
            return
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= limit:
            raise DataError(
                f"{where}: {what} {low if low < 0 else high} is outside 0..{limit - 1} "
                "(the range data.num_classes or dataset.json gives)"
            )
