"""Opening a saved Hugging Face data set and checking its columns against the spec, one line each.

What a column holds decides how a row becomes a sample: a `datasets.Image` (decoded with Pillow)
or pixel arrays, numeric arrays (features, or token ids), text (UTF-8 bytes as tokens) or token-id
lists. Class counts and vocabularies come from the features' metadata (`ClassLabel`), else from
one pass of Arrow compute over the memory-mapped column: fast, and nothing is loaded whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from dlscale.errors import UserError, one_line
from dlscale.jobspec import HfData

Kind = Literal["image", "image_array", "array", "text", "tokens"]
MAX_TOKEN_ID = 2**31 - 1  # token ids become int64 tensors; larger ones are not a vocabulary
INPUT_SETTINGS = ("image_column", "input_column", "text_column")


@dataclass(frozen=True)
class Columns:
    """Which columns a split's samples come from, and what they hold."""

    source: str  # the data set's folder, and the split's name when it has several
    input: str
    kind: Kind
    label: str | None  # None: next-token labels (text, tokens)
    num_classes: int | None = None  # classes (from ClassLabel or the largest label + 1)
    vocab_size: int | None = None  # token inputs: the largest id + 1 (bytes: 256, set later)
    integer: bool = False  # numeric arrays of integers: token ids

    def merge(self, other: Columns) -> Columns:
        """Training and validation columns together: the model must fit both."""
        if other.kind != self.kind:
            raise UserError(
                f"{other.source}: column '{other.input}' holds {other.kind} data but "
                f"{self.source}'s holds {self.kind}; expected the same in both splits"
            )
        return dataclasses.replace(
            self,
            num_classes=_larger(self.num_classes, other.num_classes),
            vocab_size=_larger(self.vocab_size, other.vocab_size),
        )


def _larger(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else max(v for v in (a, b) if v is not None)


def load_split(spec: HfData) -> tuple[Any, Any | None]:
    """(training split, validation split or None) of the data set saved at `spec.path`; a split
    of a DatasetDict carries its name in `dlscale_source` for messages."""
    import datasets  # ~1 s to import; only runs that read Hugging Face data pay for it

    try:
        # Never copied into memory, whatever HF_DATASETS_IN_MEMORY_MAX_SIZE says.
        loaded = datasets.load_from_disk(str(spec.path), keep_in_memory=False)
    except FileNotFoundError:
        raise UserError(
            f"{spec.path}: not a Hugging Face data set saved with save_to_disk (expected "
            "state.json and dataset_info.json, or dataset_dict.json and one folder per split)"
        ) from None
    except Exception as error:
        raise UserError(
            f"{spec.path}: cannot load the saved data set ({type(error).__name__}: "
            f"{one_line(str(error))})"
        ) from None
    if not isinstance(loaded, datasets.DatasetDict):
        if spec.split or spec.val_split:
            raise UserError(
                f"{spec.path}: holds one data set, not splits (a DatasetDict); "
                "drop data.split and data.val_split"
            )
        return loaded, None
    train = _split(loaded, spec.split or "train", spec, "split")
    val_split = spec.val_split
    if val_split is None and "validation" in loaded and spec.split in (None, "train"):
        val_split = "validation"  # the Hub's convention, and what `dlscale data convert` writes
    val = _split(loaded, val_split, spec, "val_split") if val_split else None
    return train, val


def _split(loaded: Any, name: str, spec: HfData, setting: str) -> Any:
    if name not in loaded:
        raise UserError(
            f"{spec.path}: no split '{name}' (data.{setting}; splits: {', '.join(loaded)})"
        )
    dataset = loaded[name]
    dataset.dlscale_source = f"{spec.path} [{name}]"
    return dataset


def inspect_columns(dataset: Any, spec: HfData) -> Columns:
    """What the spec's columns hold in this split; a missing or unusable column: one line."""
    source = _source(dataset, spec)
    if dataset.num_rows == 0:
        raise UserError(f"{source}: the data set has no rows (expected at least one sample)")
    setting = next(s for s in INPUT_SETTINGS if getattr(spec, s))
    name = getattr(spec, setting)
    _require(dataset, name, setting, source)
    kind, integer = _input_kind(dataset, name, setting, source)
    if kind in ("text", "tokens"):
        if "label_column" in spec.model_fields_set and spec.label_column is not None:
            raise UserError(
                f"{source}: text_column trains next-token prediction and uses no class labels; "
                "drop data.label_column (or give input_column for token-id classification)"
            )
        columns = Columns(source, name, kind, None)
    else:
        columns = Columns(source, name, kind, _label(dataset, spec, setting, source))
        columns = dataclasses.replace(columns, num_classes=_num_classes(dataset, columns))
    if kind == "tokens" or integer:
        low, high = value_range(dataset, name)
        if low < 0 or high > MAX_TOKEN_ID:
            raise UserError(
                f"{source}: column '{name}' has token ids from {low} to {high}; "
                f"expected ids from 0 to {MAX_TOKEN_ID}"
            )
        columns = dataclasses.replace(columns, vocab_size=high + 1, integer=integer)
    return columns


def _source(dataset: Any, spec: HfData) -> str:
    return getattr(dataset, "dlscale_source", str(spec.path))


def _require(dataset: Any, name: str, setting: str, source: str) -> None:
    if name not in dataset.column_names:
        raise UserError(
            f"{source}: no column '{name}' (data.{setting}; columns: "
            f"{', '.join(dataset.column_names)})"
        )


def _input_kind(dataset: Any, name: str, setting: str, source: str) -> tuple[Kind, bool]:
    """(kind, integer) of the input column, from its feature and Arrow type."""
    import datasets

    feature = dataset.features[name]
    arrow_type = dataset.data.table.schema.field(name).type
    leaf, depth = _leaf(arrow_type)
    numeric = pa.types.is_integer(leaf) or pa.types.is_floating(leaf)
    integer = pa.types.is_integer(leaf) and not pa.types.is_uint8(leaf)
    if setting == "image_column":
        if isinstance(feature, datasets.Image):
            return "image", False
        if numeric and depth >= 2:
            return "image_array", False
        expected = "images (a datasets.Image feature) or pixel arrays (H, W[, C])"
    elif setting == "input_column":
        if numeric and depth >= 1:
            return "array", integer
        expected = "numeric arrays of one shape"
    else:
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            return "text", False
        if integer and depth == 1:
            return "tokens", False
        expected = "strings or lists of token ids"
    raise UserError(f"{source}: column '{name}' holds {feature}; data.{setting} expects {expected}")


def _label(dataset: Any, spec: HfData, setting: str, source: str) -> str:
    name = spec.label_column
    if name is None:
        raise UserError(f"{source}: data.{setting} trains a classifier: set data.label_column")
    if name not in dataset.column_names:
        raise UserError(
            f"{source}: no label column '{name}' (data.label_column; columns: "
            f"{', '.join(dataset.column_names)})"
        )
    arrow_type = dataset.data.table.schema.field(name).type
    if not pa.types.is_integer(arrow_type):
        raise UserError(
            f"{source}: label column '{name}' holds {dataset.features[name]}; "
            "expected integer class indices (or a ClassLabel)"
        )
    return name


def _num_classes(dataset: Any, columns: Columns) -> int:
    """A ClassLabel's count of names, else the largest label + 1; labels must be ≥ 0."""
    feature = dataset.features[columns.label]
    low, high = value_range(dataset, columns.label)
    if low < 0:
        raise UserError(
            f"{columns.source}: label column '{columns.label}' has label {low} (unlabelled "
            "rows, as test splits often have?); expected class indices ≥ 0"
        )
    return max(getattr(feature, "num_classes", 0), high + 1)


def value_range(dataset: Any, name: str) -> tuple[int, int]:
    """(smallest, largest) value of a column, lists flattened: one Arrow pass over the file."""
    column = dataset.data.table.column(name)
    chunks = [c.storage if isinstance(c.type, pa.ExtensionType) else c for c in column.chunks]
    values = pa.chunked_array(chunks, type=chunks[0].type) if chunks else column
    while _is_list(values.type):
        values = pc.list_flatten(values)
    extremes = pc.min_max(values).as_py()
    return int(extremes["min"] or 0), int(extremes["max"] or 0)


def _leaf(arrow_type: pa.DataType) -> tuple[pa.DataType, int]:
    """The element type under any lists (and datasets' Array extension), and how deep it is."""
    if isinstance(arrow_type, pa.ExtensionType):
        arrow_type = arrow_type.storage_type
    depth = 0
    while _is_list(arrow_type):
        arrow_type, depth = arrow_type.value_type, depth + 1
    return arrow_type, depth


def _is_list(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )
