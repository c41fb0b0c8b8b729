"""VGG-11 and VGG-16 (configurations A and D), laid out like torchvision's."""

from __future__ import annotations

import torch
from torch import Tensor, nn

# Output channels per 3×3 conv; "M" is a 2×2 max pool (Simonyan & Zisserman 2014, Table 1).
_CONFIGS: dict[str, list[int | str]] = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


def _make_features(config: list[int | str], in_channels: int, batch_norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    channels = in_channels
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            continue
        assert isinstance(item, int)
        layers.append(nn.Conv2d(channels, item, kernel_size=3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(item))
        layers.append(nn.ReLU(inplace=True))
        channels = item
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """features → AdaptiveAvgPool2d((7, 7)) → three-layer classifier.

    The adaptive pool lets small inputs (e.g. 32×32, which leaves 1×1 after five pools) reach
    the same 25,088-wide classifier as 224×224 ImageNet input.
    """

    def __init__(self, features: nn.Sequential, num_classes: int, dropout: float):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )
        self._init_weights()

    def _init_weights(self) -> None:
        # Without batch norm a plain VGG stalls under PyTorch's default init; He init for the
        # convs and small Gaussians for the classifier are what torchvision uses too.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (B, 512, h, w)
        x = self.avgpool(x)  # (B, 512, 7, 7)
        x = torch.flatten(x, 1)  # (B, 25088)
        return self.classifier(x)  # (B, num_classes)


def _vgg(config: str, num_classes: int, in_channels: int, dropout: float, batch_norm: bool) -> VGG:
    features = _make_features(_CONFIGS[config], in_channels, batch_norm)
    return VGG(features, num_classes=num_classes, dropout=dropout)


def vgg11(
    num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5, batch_norm: bool = False
) -> nn.Module:
    """VGG-11 (configuration A); 132,863,336 parameters at 1000 classes without batch norm."""
    return _vgg("A", num_classes, in_channels, dropout, batch_norm)


def vgg16(
    num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5, batch_norm: bool = False
) -> nn.Module:
    """VGG-16 (configuration D); 138,357,544 parameters at 1000 classes without batch norm."""
    return _vgg("D", num_classes, in_channels, dropout, batch_norm)
