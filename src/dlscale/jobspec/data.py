"""The `data` section: one class per data kind, a union discriminated by `name`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dlscale.jobspec.base import Fraction, Seed, Strict, resolve_path, spec_relative


class FoldSpec(Strict):
    """Cross-validation: train on all but fold `index` of `folds` stratified folds of the
    training data, validate on fold `index` (the data's own validation part is left out)."""

    folds: Annotated[int, Field(ge=2)]
    index: NonNegativeInt

    @model_validator(mode="after")
    def _index_in_range(self) -> FoldSpec:
        if self.index >= self.folds:
            raise ValueError(f"index {self.index} does not exist: folds are 0..{self.folds - 1}")
        return self


class DataSection(Strict):
    """What every data kind shares: the seed of its split (and generation), an optional fold."""

    # Seed of generated data and of the train/validation split; default: the spec's seed. The
    # members of an ensemble differ in `seed` but keep this one, so they share one validation set.
    seed: Seed | None = None
    fold: FoldSpec | None = None


class DigitsData(DataSection):
    """scikit-learn's bundled 8×8 digits (1,797 images), optionally resized (28 for LeNet)."""

    name: Literal["digits"]
    image_size: Annotated[int, Field(ge=8, le=224)] = 8
    val_fraction: Fraction = 0.2


class SyntheticData(DataSection):
    """Seeded generated data of any shape: images/features (`kind: image`) or token sequences."""

    name: Literal["synthetic"]
    kind: Literal["image", "tokens"] = "image"
    shape: list[PositiveInt] = Field(default_factory=lambda: [1, 28, 28], min_length=1)
    num_classes: Annotated[int, Field(ge=2)] = 10
    num_samples: PositiveInt = 1024
    seq_len: PositiveInt = 64
    vocab_size: Annotated[int, Field(ge=2)] = 256
    task: Literal["classification", "language_modeling"] = "classification"
    val_fraction: Fraction = 0.2


class IdxData(DataSection):
    """MNIST / Fashion-MNIST IDX files (`*-idx3-ubyte` images, `*-idx1-ubyte` labels, `.gz` ok)."""

    name: Literal["idx"]
    images: Path
    labels: Path
    val_images: Path | None = None
    val_labels: Path | None = None
    val_fraction: Fraction = 0.2

    _paths = field_validator("images", "labels", "val_images", "val_labels", mode="before")(
        resolve_path
    )

    @model_validator(mode="after")
    def _val_pair(self) -> IdxData:
        if (self.val_images is None) != (self.val_labels is None):
            raise ValueError("give both val_images and val_labels, or neither")
        return self


class Cifar10Data(DataSection):
    """CIFAR-10 binary batches (`data_batch_1.bin` ... `test_batch.bin`, 3,073 bytes a record)."""

    name: Literal["cifar10"]
    train_files: list[Path] = Field(min_length=1)
    val_files: list[Path] = Field(default_factory=list)
    val_fraction: Fraction = 0.2

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _paths(cls, value: Any, info: ValidationInfo) -> list[Path]:
        if not isinstance(value, list):
            raise ValueError("expected a list of file paths")
        return [resolve_path(v, info) for v in value]


class NpzData(DataSection):
    """A NumPy `.npz` with arrays `x` (samples first) and `y` (integer labels)."""

    name: Literal["npz"]
    path: Path
    val_path: Path | None = None
    val_fraction: Fraction = 0.2

    _paths = field_validator("path", "val_path", mode="before")(resolve_path)


def resolve_dir(value: Any, info: ValidationInfo) -> Path | None:
    """A folder in a spec, relative to the spec file's folder; it must exist."""
    if value is None:
        return None
    path = spec_relative(value, info)
    if not path.is_dir():
        raise ValueError(f"folder not found: {path}")
    return path.resolve()


def resolve_pattern(value: Any, info: ValidationInfo) -> str | None:
    """A shard pattern (`shards/train-{000000..000009}.tar`), relative to the spec's folder.
    Whether it matches files is checked when the data is opened (one line naming it)."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        raise ValueError("empty shard pattern")
    if "://" in text:
        raise ValueError(f"{text}: only local or mounted paths are read (no URLs)")
    return str(spec_relative(text, info))


ImageSize = Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(min_length=2, max_length=2)]


class StoredData(DataSection):
    """What the data kinds read from disk while training share (streamed, never loaded whole)."""

    # Copy the files to this local folder first (resumable, checksum-verified), then read there.
    stage: Path | None = None
    skip_bad: bool = False  # skip and count samples that do not decode, instead of stopping
    val_fraction: Fraction = 0.2

    @field_validator("stage", mode="before")
    @classmethod
    def _stage_dir(cls, value: Any, info: ValidationInfo) -> Path | None:
        return None if value is None else spec_relative(value, info).resolve()


class HfData(StoredData):
    """A Hugging Face `datasets` data set saved with `save_to_disk` (Arrow, memory-mapped)."""

    name: Literal["hf"]
    path: Path
    split: str | None = None  # for a DatasetDict: the training split (default "train")
    # For a DatasetDict: the validation split (default: "validation" if it has one, else
    # val_fraction of the training split)
    val_split: str | None = None
    image_column: str | None = None  # PIL images or arrays: image classification
    input_column: str | None = None  # numeric arrays (features) of one shape
    text_column: str | None = None  # strings (UTF-8 bytes as tokens) or token-id lists
    label_column: str | None = "label"  # class labels; none for text (next-token labels)
    image_size: ImageSize | None = None  # [height, width] every image is resized to
    seq_len: PositiveInt = 64  # text: tokens per sample

    _dir = field_validator("path", mode="before")(resolve_dir)

    @model_validator(mode="after")
    def _one_input(self) -> HfData:
        given = [c for c in ("image_column", "input_column", "text_column") if getattr(self, c)]
        if len(given) != 1:
            raise ValueError("give exactly one of image_column, input_column, text_column")
        return self


class WebDatasetData(StoredData):
    """WebDataset tar shards, read sequentially through a shuffle buffer."""

    name: Literal["webdataset"]
    urls: str  # brace pattern: shards/train-{000000..000099}.tar
    val_urls: str | None = None  # validation shards; else val_fraction of the samples
    shuffle_buffer: NonNegativeInt = 1000  # samples held to shuffle the stream (0: in order)
    num_classes: Annotated[int, Field(ge=2)] | None = None  # default: from dataset.json
    image_size: ImageSize | None = None  # resize decoded images to [height, width]

    _patterns = field_validator("urls", "val_urls", mode="before")(resolve_pattern)


class ImagesData(StoredData):
    """A folder with one sub-folder of images per class, decoded with Pillow while training."""

    name: Literal["images"]
    path: Path
    val_path: Path | None = None  # same layout; else val_fraction of the images
    image_size: ImageSize | None = None  # default: the first image's size
    mode: Literal["RGB", "L"] | None = None  # default: the first image's (RGB unless grey)

    _dirs = field_validator("path", "val_path", mode="before")(resolve_dir)


DataSpec = Annotated[
    DigitsData
    | SyntheticData
    | IdxData
    | Cifar10Data
    | NpzData
    | HfData
    | WebDatasetData
    | ImagesData,
    Field(discriminator="name"),
]
DATA_KINDS = ("digits", "synthetic", "idx", "cifar10", "npz", "hf", "webdataset", "images")
