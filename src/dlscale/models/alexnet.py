"""AlexNet in torchvision's single-GPU layout, so parameter counts match published figures."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AlexNet(nn.Module):
    """features → AdaptiveAvgPool2d((6, 6)) → classifier, as in torchvision.

    The adaptive pool makes the classifier independent of input size; inputs down to 63×63
    survive the three stride-2 max pools.
    """

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5):
        super().__init__()
        self.features = nn.Sequential(
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
