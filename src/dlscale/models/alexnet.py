"""AlexNet: torchvision's single-GPU layout (parameter counts match published figures) and the
paper's original two-column network."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn


class AlexNet(nn.Module):
    """features → AdaptiveAvgPool2d((6, 6)) → classifier, as in torchvision.

    The adaptive pool makes the classifier independent of input size; inputs down to 63×63
    survive the three stride-2 max pools.
    """

    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        dropout: float = 0.5,
        features: nn.Sequential | None = None,  # the convolutions (default: torchvision's)
    ):
        super().__init__()
        self.features = (
            features
            if features is not None
            else nn.Sequential(
                nn.Conv2d(in_channels, 64, kernel_size=11, stride=4, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(64, 192, kernel_size=5, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(192, 384, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(384, 256, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(256, 256, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
            )
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (B, 256, h, w)
        x = self.avgpool(x)  # (B, 256, 6, 6)
        x = torch.flatten(x, 1)  # (B, 9216)
        return self.classifier(x)  # (B, num_classes)


def alexnet(num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5) -> nn.Module:
    """AlexNet; 61,100,840 parameters at 1000 classes and 3 input channels."""
    return AlexNet(num_classes=num_classes, in_channels=in_channels, dropout=dropout)


class ColumnLRN(nn.Module):
    """Local response normalisation within each column's channels (the paper's k=2, n=5,
    α=1e-4, β=0.75; torch divides α by n). Columns are `column_channels` wide, so the same
    module normalises both columns of one device or the one column a device holds."""

    def __init__(self, column_channels: int):
        super().__init__()
        self.column_channels = column_channels
        self.norm = nn.LocalResponseNorm(size=5, alpha=5e-4, beta=0.75, k=2.0)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W), C a multiple of column_channels
        B, C, H, W = x.shape
        columns = x.reshape(B * (C // self.column_channels), self.column_channels, H, W)
        return self.norm(columns).reshape(B, C, H, W)


class AlexNet2GPU(AlexNet):
    """The network of Krizhevsky, Sutskever & Hinton (NeurIPS 2012, Figure 2), trained on two
    3 GB GTX 580s: every layer's kernels split in two columns, one per GPU. The columns meet
    only where the paper has them meet: the third convolution and the fully connected layers
    take input from both; the second, fourth and fifth convolutions only from their own
    column (grouped convolutions, groups=2). Local response normalisation follows the first
    two convolutions, within each column. Padding and the adaptive pool are torchvision's, so
    224×224 input (and smaller, down to 63×63) works; the parameter count is the paper's
    layer shapes': 60,965,224 at 1000 classes.

    `tp_plan` puts one column on each of two devices (strategy `tensor`, degree 2).
    """

    tp_plan: ClassVar[dict[str, str]] = {
        "features.0": "colwise",  # 48 kernels each; the columns' maps stay apart
        "features.4": "grouped_gather",  # own column in, then both columns' maps to all
        "features.8": "colwise",  # the cross-column layer: all 256 maps in, 192 kernels each
        "features.10": "grouped",
        "features.12": "grouped_gather",  # the fully connected layers see both columns
        "classifier.1": "colwise",
        "classifier.4": "rowwise",
    }

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5):
        columns = nn.Sequential(
            nn.Conv2d(in_channels, 96, kernel_size=11, stride=4, padding=2),  # 2 × 48
            nn.ReLU(inplace=True),
            ColumnLRN(48),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2),  # 2 × 128, own column
            nn.ReLU(inplace=True),
            ColumnLRN(128),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(256, 384, kernel_size=3, padding=1),  # 2 × 192, from both columns
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2),  # 2 × 192, own column
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2),  # 2 × 128, own column
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        super().__init__(num_classes, in_channels, dropout, features=columns)


def alexnet_2gpu(num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5) -> nn.Module:
    """AlexNet's original two-column network; 60,965,224 parameters at 1000 classes."""
    return AlexNet2GPU(num_classes=num_classes, in_channels=in_channels, dropout=dropout)
