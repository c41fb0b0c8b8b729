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

from dlscale.spec.base import Fraction, Seed, Strict, resolve_path


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


DataSpec = Annotated[
    DigitsData | SyntheticData | IdxData | Cifar10Data | NpzData, Field(discriminator="name")
]
DATA_KINDS = ("digits", "synthetic", "idx", "cifar10", "npz")
