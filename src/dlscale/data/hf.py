"""Hugging Face `datasets` saved with `save_to_disk`, read a row at a time from memory-mapped Arrow.

Nothing is loaded whole: a sample is one row sliced out of the mapped Arrow table (read), then
turned into tensors (decode: Pillow for images). The table pickles as its file names, so loader
worker processes map the same files instead of receiving a copy. Validation is the data set's
`val_split`, else a seeded `val_fraction` of the row numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from dlscale.data.bundle import DataBundle
from dlscale.data.hf_columns import Columns, inspect_columns, load_split
from dlscale.data.holdout import _split_indices, num_val_samples
from dlscale.data.lazy import DataError, LazyDataset, to_tensor
from dlscale.data.pixels import ImageLayout, array_image, layout_of, open_image, to_chw
from dlscale.errors import one_line
from dlscale.jobspec import HfData

BYTE_VOCAB_SIZE = 256  # text is read as UTF-8 bytes: one token per byte


class HfRows(LazyDataset):
    """Rows of a saved data set (all, or those numbered in `rows`) as samples."""

    def __init__(self, dataset: Any, rows: np.ndarray | None, columns: Columns, spec: HfData):
        super().__init__(len(rows) if rows is not None else dataset.num_rows, spec.skip_bad)
        # The datasets Table (memory-mapped, pickled as its file names), not a pyarrow copy.
        self.table = dataset.data
        self.arrow_files = [entry["filename"] for entry in dataset.cache_files]
        self.rows = rows  # (N,) int64 row numbers, or None for every row in order
        self.columns = columns
        self.seq_len = spec.seq_len
        self.source = columns.source
        self.layout: ImageLayout | None = None  # set from the first image by `read_hf`
        self.shape: tuple[int, ...] | None = None  # set from the first array by `read_hf`

    def row(self, index: int) -> int:
        return int(self.rows[index]) if self.rows is not None else index

    def cell(self, name: str, index: int) -> pa.Array:
        """Column `name` of the sample's row, as a one-element Arrow array (no copy)."""
        return self.table.table.column(name).slice(self.row(index), 1).chunk(0)

    def read(self, index: int) -> tuple[tuple[Any, int | None], int]:
        kind = self.columns.kind
        cell = self.cell(self.columns.input, index)
        if kind == "image":
            data = cell.field("bytes")[0].as_py() or cell.field("path")[0].as_py()
            size = len(data) if isinstance(data, bytes) else Path(data).stat().st_size
        elif kind == "text":
            data = cell[0].as_py().encode("utf-8")
            size = len(data)
        else:  # arrays: copied out of the mapped file here, so reading is timed as reading
            data = _values(cell)
            size = data.nbytes
        label = None
        if self.columns.label is not None:
            label = self.cell(self.columns.label, index)[0].as_py()
        return (data, label), size

    def decode(self, raw: tuple[Any, int | None], index: int) -> tuple[torch.Tensor, Any]:
        data, label = raw
        kind = self.columns.kind
        if kind in ("text", "tokens"):  # next-token prediction over seq_len + 1 tokens
            tokens = np.frombuffer(data, np.uint8) if kind == "text" else data
            if tokens.ndim != 1:
                raise ValueError(f"token ids have shape {tokens.shape}; expected a flat list")
            window = np.zeros(self.seq_len + 1, dtype=np.int64)  # short texts padded with 0
            length = min(len(tokens), self.seq_len + 1)
            window[:length] = tokens[:length]
            return torch.from_numpy(window[:-1]), torch.from_numpy(window[1:])
        if label is None:
            raise ValueError(f"label is missing (null) in column '{self.columns.label}'")
        if kind == "image":
            sample = to_chw(open_image(data), self.layout, self.where(index))  # (C, H, W)
        elif kind == "image_array":
            sample = to_chw(array_image(data), self.layout, self.where(index))  # (C, H, W)
        else:
            if data.shape != self.shape:  # every sample must stack into one batch
                raise ValueError(f"input has shape {data.shape}; expected {self.shape}")
            sample = data
        return to_tensor(sample), label

    def where(self, index: int) -> str:
        return f"{self.source} row {self.row(index)}"

    def files(self) -> list[str]:
        return list(self.arrow_files)


def read_hf(spec: HfData, seed: int) -> DataBundle:
    """The saved data set as a DataBundle of `HfRows`; bad paths and columns raise one line."""
    train_set, val_set = load_split(spec)
    columns = inspect_columns(train_set, spec)
    if val_set is not None:
        val_columns = inspect_columns(val_set, spec)
        train = HfRows(train_set, None, columns, spec)
        val = HfRows(val_set, None, val_columns, spec)
        columns = columns.merge(val_columns)
    else:
        num_val = num_val_samples(train_set.num_rows, spec.val_fraction, columns.source)
        val_rows, train_rows = _split_rows(train_set, columns, num_val, seed)
        train = HfRows(train_set, train_rows, columns, spec)
        val = HfRows(train_set, val_rows, columns, spec)
    _set_layout(train, val, spec)
    if columns.kind in ("text", "tokens"):
        vocab_size = BYTE_VOCAB_SIZE if columns.kind == "text" else columns.vocab_size
        return DataBundle(
            train=train,
            val=val,
            num_classes=vocab_size,
            task="language_modeling",
            vocab_size=vocab_size,
        )
    return DataBundle(
        train=train, val=val, num_classes=max(columns.num_classes, 2), vocab_size=columns.vocab_size
    )


def _split_rows(dataset: Any, columns: Columns, num_val: int, seed: int):
    """(val rows, train rows) as int64 arrays: stratified by class when labelled, as in memory."""
    if columns.label is None:  # next-token labels: a plain seeded permutation
        order = torch.randperm(dataset.num_rows, generator=torch.Generator().manual_seed(seed))
        return order[:num_val].numpy(), order[num_val:].numpy()
    # One integer per row, read from the mapped column: small next to the data it labels.
    labels = dataset.data.table.column(columns.label).to_numpy().astype(np.int64)
    val_rows, train_rows = _split_indices(torch.from_numpy(labels), num_val, seed)
    return val_rows.numpy(), train_rows.numpy()


def _set_layout(train: HfRows, val: HfRows, spec: HfData) -> None:
    """Images take the first one's mode and size (or image_size); arrays the first one's shape."""
    kind = train.columns.kind
    if kind not in ("image", "image_array", "array"):
        return
    try:
        (first, _), _ = train.read(0)
        if kind == "array":
            train.shape = val.shape = first.shape
            return
        image = open_image(first) if kind == "image" else array_image(first)
    except (ValueError, OSError) as error:
        raise DataError(
            f"{train.where(0)}: cannot read the first sample, whose shape all must share "
            f"({one_line(str(error))})"
        ) from None
    train.layout = val.layout = layout_of(image, spec.image_size, None)


def _values(cell: pa.Array) -> np.ndarray:
    """One row of a (nested) list or fixed-shape array column as a numpy array of its shape."""
    import pyarrow.compute as pc

    if isinstance(cell.type, pa.ExtensionType):  # datasets' Array2D..Array5D
        cell = cell.storage
    shape: list[int] = []
    while (
        pa.types.is_list(cell.type)
        or pa.types.is_large_list(cell.type)
        or (pa.types.is_fixed_size_list(cell.type))
    ):
        lengths = pc.min_max(pc.list_value_length(cell)).as_py()
        if lengths["min"] != lengths["max"]:
            raise ValueError(f"array is ragged ({lengths['min']} to {lengths['max']} values)")
        shape.append(lengths["min"] or 0)
        cell = cell.flatten()
    if cell.null_count:
        raise ValueError("array has missing (null) values")
    return np.array(cell.to_numpy(zero_copy_only=False)).reshape(shape)  # a copy: the read
