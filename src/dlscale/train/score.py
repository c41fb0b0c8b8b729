"""Loss and accuracy: the training loss, and scoring a model on a whole loader."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.train.device import autocast, eval_mode

# A target the loss leaves out (F.cross_entropy's default ignore_index): the rows a pipeline
# adds to a batch that skipped samples (strategies/pipeline/exchange.py `filled`).
IGNORED_TARGET = -100


def compute_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequence outputs (B, T, V) are scored at every position; targets of
    IGNORED_TARGET are left out."""
    # Loss in fp32 even under autocast: softmax over a large vocabulary loses bits in bf16.
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def count_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct predictions, predictions made): per sample, or per token for sequences."""
    predicted = logits.argmax(dim=-1)
    return int((predicted == targets).sum()), targets.numel()


def evaluate(model: nn.Module, loader, device: torch.device, precision: str) -> tuple[float, float]:
    """Mean loss and accuracy over a whole loader, in eval mode."""
    total_loss, correct, seen, batches = 0.0, 0, 0, 0
    with eval_mode(model):
        for x, y, *_ in loader:
            x, y = x.to(device), y.to(device)
            with autocast(device, precision):
                logits = model(x)
            total_loss += float(compute_loss(logits, y)) * y.shape[0]
            right, count = count_correct(logits, y)
            correct += right
            seen += count
            batches += y.shape[0]
    if batches == 0:
        return float("nan"), float("nan")
    return total_loss / batches, correct / seen


def predict(model: nn.Module, loader, device: torch.device, precision: str):
    """Class probabilities (softmax, float32, on the CPU) for every sample of a loader, and the
    labels: what an ensemble averages. Shapes (N, C) and (N,), or (N, T, V) and (N, T)."""
    probabilities, labels = [], []
    with eval_mode(model):
        for x, y, *_ in loader:
            with autocast(device, precision):
                logits = model(x.to(device))
            probabilities.append(torch.softmax(logits.float(), dim=-1).cpu())
            labels.append(y)
    return torch.cat(probabilities), torch.cat(labels)
