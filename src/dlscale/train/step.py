"""The one training step every strategy runs: forward, loss, backward, the exchange, the update."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from dlscale.jobspec import OptimizerSpec
from dlscale.train.device import autocast, grad_scaler
from dlscale.train.exchange import Exchange
from dlscale.train.faults import NoGradient
from dlscale.train.score import compute_loss


def build_optimizer(params, spec: OptimizerSpec) -> torch.optim.Optimizer:
    """`sgd` is plain SGD; `momentum` is SGD with (heavy-ball) momentum; adam/adamw as in torch.

    On a CPU the update runs as torch's fused kernel (`fused=True`: one pass over each tensor,
    no temporaries) where every parameter is a plain floating-point CPU tensor; torch's own
    CPU default is a loop of several kernels per tensor, which ran AlexNet's Adam update 6.1×
    and VGG-16's 4.6× slower on this project's machine, with the same result to 1.5e-7
    relative (benchmarks/sqrt_zeros.py; whole steps: benchmarks/fused_update.py).
    Accelerators keep torch's default (multi-tensor foreach kernels), which the GPU
    predictions price. The choice holds after `load_state_dict` (which would restore the
    checkpoint's own flags: a CPU run's checkpoint resumed on a GPU would turn the fused
    kernels on there), and a step with a gradient the fused kernels mishandle moves its group
    to torch's loop from then on: a sparse one (`nn.Embedding(sparse=True)`), which they
    refuse, or one laid out unlike its parameter, whose strides they ignore.
    """
    params = [_listed(p) for p in params]
    fused = _fused_on_cpu(params)
    extra = {"fused": True} if fused else {}
    if spec.name == "sgd":
        optimizer = torch.optim.SGD(params, lr=spec.lr, weight_decay=spec.weight_decay, **extra)
    elif spec.name == "momentum":
        optimizer = torch.optim.SGD(
            params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, **extra
        )
    elif spec.name == "adam":
        optimizer = torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay, **extra
        )
    elif spec.name == "adamw":
        optimizer = torch.optim.AdamW(
            params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay, **extra
        )
    elif spec.name == "adagrad":
        optimizer = torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay, **extra)
    else:
        raise AssertionError(f"optimizer {spec.name} passed validation but has no builder")
    built = [(group.get("fused"), group.get("foreach")) for group in optimizer.param_groups]

    def keep_built(optimizer: torch.optim.Optimizer) -> None:
        for group, (group_fused, foreach) in zip(optimizer.param_groups, built, strict=True):
            group["fused"], group["foreach"] = group_fused, foreach

    optimizer.register_load_state_dict_post_hook(keep_built)
    if fused:
        optimizer.register_step_pre_hook(_unfuse_for_unfit_gradients)
    return optimizer


def _listed(group):
    """A parameter group with its parameters in a list (a generator would be used up by the
    look at them before torch's own; a lone tensor is a list of one); a tensor as it is."""
    if isinstance(group, dict):
        listed = group["params"]
        listed = [listed] if isinstance(listed, torch.Tensor) else list(listed)
        return {**group, "params": listed}
    return group


def _fused_on_cpu(params: list) -> bool:
    """Whether every parameter (of plain tensors or groups listed by `_listed`) is a plain
    floating-point tensor on the CPU: what torch's fused CPU kernels take (no DTensor, no meta
    tensor)."""
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    return bool(tensors) and all(
        type(t) in (torch.Tensor, nn.Parameter) and t.device.type == "cpu" and t.is_floating_point()
        for t in tensors
    )


def _unfuse_for_unfit_gradients(optimizer: torch.optim.Optimizer, _args, _kwargs) -> None:
    """Before a step: a group holding a sparse gradient, or one laid out unlike its parameter
    (a gradient assigned by hand as a transposed view), leaves the fused kernel for good."""
    for group in optimizer.param_groups:
        if group.get("fused") and any(
            p.grad is not None and (p.grad.is_sparse or p.grad.stride() != p.stride())
            for p in group["params"]
        ):
            group["fused"] = False


class TrainStep:
    """One step under the chosen precision, with the strategy's exchange around it:

        zero the gradients → forward and backward (or the pipeline schedule) → the exchange's
        work on the gradients → the optimizer update, here or on a server → the exchange's work
        on the weights.

    The exchange decides what moves between processes; this class does the rest for all of
    them: autocast, fp16 loss scaling (with the overflow check agreed between trainers),
    gradient accumulation, and the update.

    With `accumulate` K the batch is run as K micro-batches, one forward and backward each,
    their gradients summed in `.grad` before the one update: each micro-batch's mean loss is
    weighted by its share of the batch (1/K), so the sum is the gradient of the whole batch's
    mean loss, as one pass over it would give (BatchNorm's statistics excepted: they are each
    micro-batch's). Only the last micro-batch's backward lets the exchange synchronise (ddp's
    all-reduce); the others run inside `exchange.accumulating()`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        exchange: Exchange | None = None,
        accumulate: int = 1,
    ):
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.precision = precision
        self.exchange = exchange or Exchange()
        self.scaler = grad_scaler(device, precision)
        self.accumulate = accumulate

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gradients of the batch's mean loss land in `.grad` (added to what is there), over
        `accumulate` micro-batches; returns the batch's mean loss, detached."""
        if self.accumulate == 1:
            return self.micro_step(x, y, 1.0)
        xs, ys = x.tensor_split(self.accumulate), y.tensor_split(self.accumulate)
        total = torch.zeros((), device=self.device)
        for i, (x_micro, y_micro) in enumerate(zip(xs, ys, strict=True)):
            last = i == self.accumulate - 1
            with nullcontext() if last else self.exchange.accumulating():
                total += self.micro_step(x_micro, y_micro, y_micro.shape[0] / y.shape[0])
        return total

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, share: float) -> torch.Tensor:
        """Forward and backward of `share` × the mean loss on (x, y); that share, detached."""
        with autocast(self.device, self.precision):
            loss = compute_loss(self.model(x), y)
        if not loss.requires_grad:  # backward would fail in autograd, naming no one
            raise NoGradient()
        weighted = loss * share if share != 1.0 else loss
        self.backward(weighted)
        return weighted.detach()

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def unscale(self) -> bool:
        """fp16: divide the gradients by the loss scale; True if any trainer's overflowed (the
        update is then skipped everywhere and the scale lowered by `update_scale`)."""
        if self.scaler is None:
            return False
        self.scaler.unscale_(self.optimizer)
        # GradScaler keeps its overflow flags per optimizer; the exchange makes them agree.
        found = self.scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"]
        self.exchange.agree_on_overflow(list(found.values()))
        return any(bool(flag.item()) for flag in found.values())

    def update_scale(self) -> None:
        if self.scaler is not None:
            self.scaler.update()

    def apply(self) -> None:
        """Update the weights from `.grad` (unscaling fp16 gradients first)."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.unscale()
        self.scaler.step(self.optimizer)  # skips the update if the gradients overflowed
        self.scaler.update()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """One step; the loss (None on a pipeline stage that does not compute it)."""
        exchange = self.exchange
        exchange.zero_grad(self.optimizer)
        loss = exchange.forward_backward(self, x, y)
        exchange.after_backward(self)
        if exchange.updates_locally:
            self.apply()
        exchange.after_update(self)
        return loss
