"""Seeded train/validation split for readers that were given no separate validation files."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dlscale.data.bundle import DataBundle
from dlscale.errors import UserError


def split_train_val(
    x: torch.Tensor, y: torch.Tensor, val_fraction: float, seed: int, source: str
) -> tuple[TensorDataset, TensorDataset]:
    """Split samples into (train, val); validation gets `val_fraction` of them.

    Class labels (y of shape (N,)) are split stratified when every class can give at least one
    sample to each side, so a rare class is not lost from validation; otherwise (next-token
    labels of shape (N, T), or singleton classes) the split is a plain seeded permutation.
    The same seed always gives the same split. `source` names the data in error messages.
    """
    assert len(x) == len(y), "samples and labels differ in count"
    num_samples = len(x)
    num_val = num_val_samples(num_samples, val_fraction, source)
    val_index, train_index = _split_indices(y, num_val, seed)
    train = TensorDataset(x[train_index], y[train_index])
    val = TensorDataset(x[val_index], y[val_index])
    return train, val


def num_val_samples(num_samples: int, val_fraction: float, source: str) -> int:
    """Validation size as scikit-learn counts it, ceil(N * fraction); UserError if 0 or all N."""
    # The epsilon keeps 0.7 * 10 = 7.000000000000001 from rounding up to 8.
    num_val = math.ceil(num_samples * val_fraction - 1e-9)
    if num_val < 1 or num_val >= num_samples:
        raise UserError(
            f"{source}: data set is too small to split: {num_samples} sample(s) with "
            f"val_fraction {val_fraction} leaves {num_val} for validation and "
            f"{num_samples - num_val} for training (each needs at least 1)"
        )
    return num_val


def _split_indices(y: torch.Tensor, num_val: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(val_index, train_index) as int64 tensors; stratified by class when that is possible."""
    num_samples = len(y)
    num_train = num_samples - num_val
    if y.ndim == 1:
        class_counts = torch.bincount(y)
        class_counts = class_counts[class_counts > 0]
        num_present = len(class_counts)
        if int(class_counts.min()) >= 2 and min(num_val, num_train) >= num_present:
            # scikit-learn is slow to import (~0.2 s); only pay for it when we stratify.
            from sklearn.model_selection import train_test_split

            train_np, val_np = train_test_split(
                np.arange(num_samples), test_size=num_val, random_state=seed, stratify=y.numpy()
            )
            return torch.from_numpy(val_np).long(), torch.from_numpy(train_np).long()
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_samples, generator=generator)
    return order[:num_val], order[num_val:]


# A fold scored on one sample is right or wrong, 0% or 100% (leave-one-out): the sweep would
# compare configurations by the mean of coin flips, with no spread to tell them apart by.
MIN_SAMPLES_PER_FOLD = 2


def cross_validation_fold(bundle: DataBundle, folds: int, index: int, seed: int) -> DataBundle:
    """Fold `index` of `folds` over the training part: it validates, the other folds train.

    Stratified (scikit-learn's StratifiedKFold, shuffled by `seed`) when every class has at least
    `folds` samples, so each fold holds every class in proportion; otherwise (next-token labels,
    rare classes) a plain shuffled KFold. The bundle's own validation part is left out.
    """
    from sklearn.model_selection import KFold, StratifiedKFold

    if not bundle.in_memory:
        raise UserError(
            "sweep.kfold: folds are cut from a data set in memory; data read from disk "
            "while training (hf, webdataset, images) gives its validation part by val_fraction, "
            "val_path or val_urls instead"
        )
    x, y = bundle.train.tensors
    if len(y) < MIN_SAMPLES_PER_FOLD * folds:
        raise UserError(
            f"sweep.kfold: {folds} folds need at least {MIN_SAMPLES_PER_FOLD * folds} training "
            f"samples ({MIN_SAMPLES_PER_FOLD} to score each fold on); the data has {len(y)}: "
            f"use at most {len(y) // MIN_SAMPLES_PER_FOLD} folds"
        )
    counts = torch.bincount(y) if y.ndim == 1 else None
    stratify = counts is not None and int(counts[counts > 0].min()) >= folds
    splitter = (StratifiedKFold if stratify else KFold)(folds, shuffle=True, random_state=seed)
    labels = y.numpy() if stratify else None
    train_np, val_np = list(splitter.split(np.zeros(len(y)), labels))[index]
    train_index, val_index = torch.from_numpy(train_np).long(), torch.from_numpy(val_np).long()
    return dataclasses.replace(
        bundle,
        train=TensorDataset(x[train_index], y[train_index]),
        val=TensorDataset(x[val_index], y[val_index]),
    )
