"""DataBundle: what every dataset reader returns, and what the model builder learns from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import TensorDataset

Task = Literal["classification", "language_modeling"]


@dataclass
class DataBundle:
    """Train and validation data, plus the facts a model needs to fit them.

    `train` and `val` are tensors in memory (`TensorDataset`), or data read from disk while
    training: a `LazyDataset` (indexed a batch at a time) or a `StreamDataset` (yields batches).

    Images are float32 (N, C, H, W) scaled to [0, 1]; flat features are float32 (N, F); token
    sequences are int64 (N, T). Labels are int64: (N,) for classification, (N, T) next tokens
    for language modelling.
    """

    train: Any  # TensorDataset | LazyDataset | StreamDataset
    val: Any
    num_classes: int  # classes, or the vocabulary size for language modelling
    task: Task = "classification"
    vocab_size: int | None = None  # token inputs only
    _input_shape: tuple[int, ...] | None = None  # given by a reader that knows it, or derived
    _sample_bytes: int | None = None  # derived from the first sample, once
    staging: dict | None = None  # what copying the files to local disk took, when staged

    @property
    def in_memory(self) -> bool:
        return isinstance(self.train, TensorDataset)

    @property
    def streamed(self) -> bool:
        """Whether training batches come from the data set itself (not an index sampler)."""
        return getattr(self.train, "streamed", False)

    def example(self, count: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` training samples as (x, y) batches, wherever the data lives."""
        if self.in_memory:
            x, y = self.train.tensors
            return x[:count], y[:count]
        return self.train.example(count)

    @property
    def sample_bytes(self) -> int:
        """Bytes one training sample (input and label) takes in memory (read from disk once)."""
        if self._sample_bytes is None:
            x, y = self.example(1)
            self._sample_bytes = x[0].numel() * x.element_size() + y[0].numel() * y.element_size()
        return self._sample_bytes

    @property
    def resident_bytes(self) -> int:
        """Bytes of data each process holds: all of it in memory, none of it when read from disk
        (the loader's buffers are counted with the process)."""
        if not self.in_memory:
            return 0
        return sum(t.numel() * t.element_size() for t in [*self.train.tensors, *self.val.tensors])

    def model_defaults(self) -> dict[str, int]:
        """Factory arguments implied by the data; the builder passes those a factory accepts."""
        defaults = {"num_classes": self.num_classes}
        if self.vocab_size is not None:  # token sequences (N, T)
            defaults["vocab_size"] = self.vocab_size
            defaults["context_length"] = self.input_shape[0]
        else:
            defaults["in_channels"] = self.input_shape[0]
            defaults["input_size"] = int(torch.Size(self.input_shape).numel())
        return defaults

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, without the batch dimension."""
        if self._input_shape is None:
            self._input_shape = tuple(self.example(1)[0].shape[1:])
        return self._input_shape

    @property
    def num_train(self) -> int:
        return len(self.train)
