"""LeNet-5 for 28×28 single-channel digits: the smallest CNN in the zoo."""

from __future__ import annotations

from torch import Tensor, nn


class LeNet5(nn.Module):
    """LeNet-5 sized for 28×28 input; every layer is its own named module.

    ReLUs and the flatten are modules (not functional calls) so a per-layer profiler that hooks
    modules sees them as layers of their own.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5)  # 28 → 24
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)  # 24 → 12
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)  # 12 → 8
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)  # 8 → 4
        self.flatten = nn.Flatten()  # 16 × 4 × 4 = 256
        self.fc1 = nn.Linear(256, 120)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(120, 60)
        self.relu4 = nn.ReLU()
        self.fc3 = nn.Linear(60, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))  # (B, 6, 12, 12)
        x = self.pool2(self.relu2(self.conv2(x)))  # (B, 16, 4, 4)
        x = self.flatten(x)  # (B, 256)
        x = self.relu3(self.fc1(x))  # (B, 120)
        x = self.relu4(self.fc2(x))  # (B, 60)
        return self.fc3(x)  # (B, num_classes)


def lenet(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """LeNet-5 for (in_channels, 28, 28) input; 41,282 parameters at 10 classes and 1 channel."""
    return LeNet5(num_classes=num_classes, in_channels=in_channels)
