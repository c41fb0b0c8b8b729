"""scikit-learn's bundled handwritten digits: 1,797 real 8×8 images, no download needed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import split_train_val
from dlscale.jobspec import DigitsData

DIGITS_SIZE_PX = 8  # load_digits images are 8×8
DIGITS_MAX_VALUE = 16.0  # pixel values are counts 0..16 (ink in a 4×4 block of the scan)
NUM_DIGIT_CLASSES = 10


def read_digits(spec: DigitsData, seed: int) -> DataBundle:
    """The digits as float32 (N, 1, S, S) in [0, 1], S = spec.image_size, split by `seed`."""
    # Imported here: scikit-learn's dataset module is slow to import and only this reader needs it.
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy(digits.images).to(torch.float32) / DIGITS_MAX_VALUE  # (N, 8, 8)
    x = x.unsqueeze(1)  # (N, 1, 8, 8)
    if spec.image_size != DIGITS_SIZE_PX:
        # Resized once here rather than per batch, so the training loop pays nothing for it.
        size = (spec.image_size, spec.image_size)
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)  # (N, 1, S, S)
    y = torch.from_numpy(digits.target).to(torch.int64)  # (N,)
    train, val = split_train_val(x, y, spec.val_fraction, seed, source="data 'digits'")
    return DataBundle(
        train=train,
        val=val,
        num_classes=NUM_DIGIT_CLASSES,
        task="classification",
    )
