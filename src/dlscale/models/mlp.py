"""Multi-layer perceptron over flattened input: the baseline for images and tabular features."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(
    input_size: int = 784,
    hidden: Sequence[int] | int = (512, 256),
    num_classes: int = 10,
    dropout: float = 0.0,
) -> nn.Module:
    """Flatten, then Linear + ReLU (+ Dropout when dropout > 0) per hidden width, then a classifier.

    ``input_size`` is the number of values in one sample (C·H·W for images), so any sample shape
    works once flattened. ``hidden`` may be one width or a list of widths; an empty list gives
    plain logistic regression.
    """
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    if any(not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"hidden widths must be positive integers, got {hidden!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")

    layers: list[nn.Module] = [nn.Flatten()]  # (B, ...) → (B, input_size)
    in_features = input_size
    for width in widths:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        in_features = width
    layers.append(nn.Linear(in_features, num_classes))  # (B, num_classes)
    return nn.Sequential(*layers)
