"""A tenant's own model for the training service: a small convolutional network for the 8×8
digits, built by `build`. Uploaded with its spec (own-model.yaml), it is imported in the job's
sandbox as `inputs.mynet`; its factory gets the data's facts it names (num_classes,
in_channels) and the spec's kwargs (width)."""

from torch import nn


class DigitNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, width: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),  # (B, width, 8, 8)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (B, width, 4, 4)
            nn.Conv2d(width, 2 * width, 3, padding=1),  # (B, 2 width, 4, 4)
            nn.ReLU(),
        )
        self.head = nn.Linear(2 * width * 16, num_classes)

    def forward(self, images):  # (B, C, 8, 8) -> (B, num_classes)
        return self.head(self.features(images).flatten(1))


def build(in_channels: int = 1, num_classes: int = 10, width: int = 16) -> nn.Module:
    return DigitNet(in_channels, num_classes, width)
