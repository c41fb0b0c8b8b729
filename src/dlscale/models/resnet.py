"""ResNet-18 and ResNet-50 with torchvision's module names and shapes (ResNet v1.5)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed by batch norm, whose shift makes a bias redundant.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3×3 convs and a shortcut; used by ResNet-18 and -34."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv3x3(in_channels, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = _shortcut(in_channels, width * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3, 1×1 expand (×4); the stride sits on the 3×3 conv as in torchvision."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv1x1(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, width * self.expansion, stride)

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Sequential | None:
    """A projection shortcut when the block changes shape, else None (identity)."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(_conv1x1(in_channels, out_channels, stride), nn.BatchNorm2d(out_channels))


class ResNet(nn.Module):
    """Stem, four stages of residual blocks, global average pool, linear classifier."""

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        blocks_per_stage: list[int],
        num_classes: int,
        in_channels: int,
        small_input: bool,
    ):
        super().__init__()
        if small_input:
            # 3×3 stride-1 stem and no max pool: a 32×32 image keeps 32×32 into layer1 instead
            # of shrinking to 8×8, which would leave nothing to learn from in the last stage.
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self._channels = 64
        self.layer1 = self._make_stage(block, 64, blocks_per_stage[0], stride=1)
        self.layer2 = self._make_stage(block, 128, blocks_per_stage[1], stride=2)
        self.layer3 = self._make_stage(block, 256, blocks_per_stage[2], stride=2)
        self.layer4 = self._make_stage(block, 512, blocks_per_stage[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self._init_weights()

    def _make_stage(
        self, block: type[BasicBlock | Bottleneck], width: int, num_blocks: int, stride: int
    ) -> nn.Sequential:
        blocks = []
        for i in range(num_blocks):
            blocks.append(block(self._channels, width, stride if i == 0 else 1))
            self._channels = width * block.expansion
        return nn.Sequential(*blocks)

    def _init_weights(self) -> None:
        # He init suits ReLU networks (He et al. 2015); batch norm starts as the identity.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))  # (B, 64, H/4, W/4) or (B, 64, H, W)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))  # (B, 512·expansion, h, w)
        x = torch.flatten(self.avgpool(x), 1)  # (B, 512·expansion)
        return self.fc(x)  # (B, num_classes)


def resnet18(num_classes: int = 1000, in_channels: int = 3, small_input: bool = False) -> nn.Module:
    """ResNet-18; 11,689,512 parameters at 1000 classes and 3 channels with the ImageNet stem.

    ``small_input=True`` (for 28×28 or 32×32 images) replaces the 7×7 stride-2 stem conv and max
    pool with a 3×3 stride-1 conv, so conv1 has 64·C·9 weights instead of 64·C·49 and the total
    parameter count drops (by 7,680 for 3 channels).
    """
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, in_channels, small_input)


def resnet50(num_classes: int = 1000, in_channels: int = 3, small_input: bool = False) -> nn.Module:
    """ResNet-50; 25,557,032 parameters at 1000 classes and 3 channels with the ImageNet stem.

    ``small_input=True`` swaps the stem as in :func:`resnet18`, which changes conv1's parameter
    count the same way.
    """
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, in_channels, small_input)
