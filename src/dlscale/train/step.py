"""The one training step every strategy calls: forward, loss, backward, optimizer update."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.spec import OptimizerSpec
from dlscale.train.device import autocast, eval_mode, grad_scaler


def build_optimizer(params, spec: OptimizerSpec) -> torch.optim.Optimizer:
    """`sgd` is plain SGD; `momentum` is SGD with (heavy-ball) momentum; adam/adamw as in torch."""
    params = list(params)
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.name == "momentum":
        return torch.optim.SGD(
            params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    if spec.name == "adam":
        return torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay
        )
    if spec.name == "adamw":
        return torch.optim.AdamW(
            params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay
        )
    if spec.name == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay)
    raise AssertionError(f"optimizer {spec.name} passed validation but has no builder")


def compute_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequence outputs (B, T, V) are scored at every position."""
    # Loss in fp32 even under autocast: softmax over a large vocabulary loses bits in bf16.
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def count_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct predictions, predictions made): per sample, or per token for sequences."""
    predicted = logits.argmax(dim=-1)
    return int((predicted == targets).sum()), targets.numel()


class TrainStep:
    """Forward and backward under the chosen precision, then the optimizer update.

    Strategies differ only in what happens between `forward_backward` and `apply` (allreduce,
    push to a parameter server, ...); calling the object does both for one device.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
    ):
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.precision = precision
        self.scaler = grad_scaler(device, precision)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gradients of the mean loss land in `.grad`; returns the loss, detached."""
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.precision):
            loss = compute_loss(self.model(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def apply(self) -> None:
        """Update the weights from `.grad` (unscaling fp16 gradients first)."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.forward_backward(x, y)
        self.apply()
        return loss


def evaluate(model: nn.Module, loader, device: torch.device, precision: str) -> tuple[float, float]:
    """Mean loss and accuracy over a whole loader, in eval mode."""
    total_loss, correct, seen, batches = 0.0, 0, 0, 0
    with eval_mode(model):
        for x, y in loader:
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
        for x, y in loader:
            with autocast(device, precision):
                logits = model(x.to(device))
            probabilities.append(torch.softmax(logits.float(), dim=-1).cpu())
            labels.append(y)
    return torch.cat(probabilities), torch.cat(labels)
