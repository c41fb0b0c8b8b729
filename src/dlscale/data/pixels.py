"""Images through Pillow: decoded into the (C, H, W) uint8 a model takes, or encoded as PNG.

Every image of a data set must come out the same shape, or batches cannot be stacked. The first
image sets the layout (its mode mapped to grey `L` or `RGB`, its size) unless the spec says
otherwise; `image_size` resizes every image, and without it an image of another size is an
error naming the file and both sizes. `png_bytes` is how `dlscale data convert` stores an image.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from dlscale.data.lazy import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".ppm")
# Single-band modes (and grey with alpha) train as one channel; everything else, palette
# images included, as three.
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


@dataclass(frozen=True)
class ImageLayout:
    """What every decoded image is converted to."""

    mode: str  # "L" (1 channel) or "RGB" (3 channels)
    height: int
    width: int
    resize: bool  # the spec gave image_size: resize; else a different size is an error

    @property
    def shape(self) -> tuple[int, int, int]:
        return (1 if self.mode == "L" else 3, self.height, self.width)


def layout_of(first: Image.Image, image_size: list[int] | None, mode: str | None) -> ImageLayout:
    """The layout the first image (and the spec's `image_size` [H, W] and `mode`) sets."""
    mode = mode or ("L" if first.mode in GREY_MODES else "RGB")
    if image_size is not None:
        return ImageLayout(mode, image_size[0], image_size[1], resize=True)
    return ImageLayout(mode, first.height, first.width, resize=False)


class WrongSize(ValueError):
    """An image whose header gives another (height, width) than the one asked for."""

    def __init__(self, height: int, width: int):
        super().__init__(f"image is {height}×{width} (H×W)")
        self.height, self.width = height, width


def open_image(source: bytes | str | Path, size: tuple[int, int] | None = None) -> Image.Image:
    """An image decoded whole (Pillow opens lazily; `load` makes a truncated file fail here).
    With `size` (height, width), one of another size is WrongSize from its header alone, before
    its pixels are decoded (a small file can hold a huge image)."""
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        if size is not None and (image.height, image.width) != tuple(size):
            raise WrongSize(image.height, image.width)
        image.load()
    except WrongSize:
        raise
    # DecompressionBombError: more pixels than Pillow decodes (a small file, a huge image).
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        detail = "not an image file" if isinstance(error, UnidentifiedImageError) else error
        raise ValueError(
            f"Pillow cannot decode it ({detail}; expected {', '.join(IMAGE_SUFFIXES)})"
        ) from None
    return image


def array_image(array: np.ndarray) -> Image.Image:
    """An image stored as an array: (H, W), (H, W, C) or (C, H, W) with C in 1, 3, 4."""
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)  # (C, H, W) → (H, W, C), as Pillow takes it
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise ValueError(f"image array has shape {array.shape}; expected (H, W) or (H, W, C)")
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.size and array.max() <= 1.0:
            array = array * 255.0  # floats in [0, 1]: pixels
        array = np.clip(array, 0, 255).astype(np.uint8)
    return Image.fromarray(array)


def to_chw(image: Image.Image, layout: ImageLayout, where: str) -> np.ndarray:
    """The image in the layout: (C, H, W) uint8. A size that differs without resizing: DataError."""
    if image.mode != layout.mode:
        image = image.convert(layout.mode)
    if (image.height, image.width) != (layout.height, layout.width):
        if not layout.resize:
            raise DataError(
                f"{where}: image is {image.height}×{image.width} (H×W) but the first image is "
                f"{layout.height}×{layout.width}; set data.image_size: [H, W] to resize all"
            )
        image = image.resize((layout.width, layout.height), Image.Resampling.BILINEAR)
    pixels = np.array(image, dtype=np.uint8)  # a writable copy: torch shares its memory
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)  # (C, H, W)


def png_bytes(image: np.ndarray) -> bytes:
    """A uint8 (C, H, W) image, C = 1 (grey, mode L) or 3 (RGB), as PNG (`data convert`)."""
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)  # (H, W[, 3])
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue()
