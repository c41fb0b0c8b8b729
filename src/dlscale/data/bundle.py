"""DataBundle: what every dataset reader returns, and what the model builder learns from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.data import TensorDataset

Task = Literal["classification", "language_modeling"]


@dataclass
class DataBundle:
    """Train and validation tensors in memory, plus the facts a model needs to fit them.

    Images are float32 (N, C, H, W) scaled to [0, 1]; flat features are float32 (N, F); token
    sequences are int64 (N, T). Labels are int64: (N,) for classification, (N, T) next tokens
    for language modelling.
    """

    train: TensorDataset
    val: TensorDataset
    num_classes: int  # classes, or the vocabulary size for language modelling
    task: Task = "classification"
    vocab_size: int | None = None  # token inputs only

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
        return tuple(self.train.tensors[0].shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.train)
