"""PipeDream-2BW on one stage: 1F1B with no flush between steps, two weight versions.

The rules (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021,
section 3.1; https://arxiv.org/abs/2006.09503, read 2026-11-27): every microbatch of a batch
runs its forward and its backward on one weight version; a batch's gradient, summed over its
microbatches, is applied once the batch is done, and a version is made by each update while the
microbatches already in flight keep the version they started with, so
W(t+1) = W(t) − ν·∇f(W(t−1)): the gradient is one update old (staleness 1).

Here a training step is one batch of M microbatches (M ≥ S). In step t the stage runs the
forwards of batch t and the backwards that 1F1B pairs with them (`slots.step_actions`): on stage
s those of the S − 1 − s microbatches before, so the first stages finish batch t − 1 during step
t. Batch t runs on a snapshot of the weights taken as step t starts (the update of batch t − 2
applied); at the end of step t the gradient of batch t − 1 is complete on every stage and is the
one the loop's optimizer applies. Two snapshots live at once (batch t − 1's, still finishing, and
batch t's) beside the optimizer's own weights.

A checkpoint after step t finds batch t's last microbatches in flight (their backwards wait for
step t + 1). `settle` runs those backwards then, so the checkpoint holds batch t's whole
gradient (what step t + 1 would have handed the optimizer) and a resumed run continues exactly:
the backwards compute what they would have a step later (the same saved activations, the same
snapshot, the same order of accumulation), and step t + 1 skips them on every stage alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from torch.func import functional_call

from dlscale.strategies.pipeline.slots import drain_actions, step_actions
from dlscale.train.device import autocast
from dlscale.train.score import compute_loss


class Transport(Protocol):
    """Tensors to a neighbouring stage: `send` does not wait; `recv` waits for the next."""

    def send(self, to_next: bool, tensors: list[torch.Tensor]) -> None: ...

    def recv(
        self, from_next: bool, like: list[tuple[tuple, torch.dtype]]
    ) -> list[torch.Tensor]: ...


@dataclass
class Snapshot:
    """One weight version: the optimizer's weights after `version` updates, copied; each
    copy's `.grad` sums the gradients of the batch run on it. A snapshot restored from a
    checkpoint holds only that batch's finished gradient (`grads`)."""

    version: int
    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor | None] | None = None

    def gradient(self) -> dict[str, torch.Tensor | None]:
        if self.grads is not None:
            return self.grads
        return {name: param.grad for name, param in self.params.items()}


@dataclass
class Log:
    """What ran: (action, microbatch, weight version) in order, and each update's staleness."""

    actions: list[tuple[str, int, int]] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)


class TwoBWStage:
    def __init__(
        self,
        module: nn.Module,
        index: int,
        stages: int,
        micro: int,
        transport: Transport,
        in_meta: list[tuple[tuple, torch.dtype]],
        out_meta: list[tuple[tuple, torch.dtype]],
        device: torch.device,
        precision: str = "fp32",
    ):
        self.module, self.index, self.stages, self.micro = module, index, stages, micro
        self.transport, self.in_meta, self.out_meta = transport, in_meta, out_meta
        self.device, self.precision = device, precision
        self.first, self.last = index == 0, index == stages - 1
        self.version = 0  # updates the optimizer has applied to the module's weights
        self.steps = 0  # steps run
        self.snapshots: dict[int, Snapshot] = {}  # by batch
        self.flight: dict[int, tuple] = {}  # microbatch -> (snapshot, inputs, outputs)
        self.settled_below = 0  # microbatches below this one ran their backward in `settle`
        self.log = Log()
        self.forward_s = self.backward_s = 0.0  # computing, not waiting for a neighbour

    # ---- one step

    def step(self, x: torch.Tensor | None, y: torch.Tensor | None) -> list[torch.Tensor]:
        """Batch `self.steps`'s forwards and the backwards 1F1B pairs with them; the losses of
        its microbatches on the last stage."""
        t = self.steps
        params = {
            n: p.detach().clone().requires_grad_(p.requires_grad)
            for n, p in self.module.named_parameters()
        }
        self.snapshots[t] = Snapshot(self.version, params)
        xs = x.chunk(self.micro) if x is not None else [None] * self.micro
        ys = y.chunk(self.micro) if y is not None else [None] * self.micro
        losses = []
        for kind, k in step_actions("2bw", self.stages, self.micro, self.index, t):
            if kind == "F":
                j = k - t * self.micro
                loss = self.forward(k, t, xs[j], ys[j])
                if loss is not None:
                    losses.append(loss)
            elif k >= self.settled_below:
                self.backward(k)
            # else: run by `settle` for a checkpoint, on every stage alike (nothing to send)
        self.steps += 1
        return losses

    def drain(self) -> None:
        """After the last step, or before a checkpoint: the backwards still in flight (none
        the second time: the final checkpoint follows the last step's drain)."""
        for _, k in drain_actions("2bw", self.stages, self.micro, self.index, self.steps):
            if k >= self.settled_below:
                self.backward(k)
        self.settled_below = self.steps * self.micro

    # ---- checkpoints

    def settle(self) -> dict:
        """Before a checkpoint (every stage at the same step): the backwards in flight run now,
        and what a resume needs besides the weights: the step and version counts and the
        gradient of the batch not yet applied (None before the first step)."""
        self.drain()
        assert not self.flight and len(self.snapshots) <= 1, "a batch still in flight"
        pending = None
        for batch, snapshot in self.snapshots.items():
            pending = {
                "batch": batch,
                "version": snapshot.version,
                "grads": {
                    name: None if grad is None else grad.detach().clone()
                    for name, grad in snapshot.gradient().items()
                },
            }
        return {"steps": self.steps, "version": self.version, "pending": pending}

    def restore(self, state: dict) -> None:
        """Take what `settle` returned in the run that saved the checkpoint."""
        self.steps, self.version = state["steps"], state["version"]
        self.settled_below = self.steps * self.micro
        self.snapshots.clear()
        pending = state["pending"]
        if pending is not None:
            grads = {
                name: None if grad is None else grad.to(self.device)
                for name, grad in pending["grads"].items()
            }
            self.snapshots[pending["batch"]] = Snapshot(pending["version"], {}, grads)

    def take_gradient(self, drained: bool = False) -> bool:
        """Move the gradient now complete into the module's `.grad`, for the optimizer: batch
        t − 1's after step t, the last batch's after the drain; False when none is (step 0)."""
        batch = self.steps - 1 if drained else self.steps - 2
        snapshot = self.snapshots.pop(batch, None)
        if snapshot is None:
            return False
        assert not any(k // self.micro == batch for k in self.flight), "batch still in flight"
        gradient = snapshot.gradient()
        for name, param in self.module.named_parameters():
            param.grad = gradient[name]
        self.log.staleness.append(self.version - snapshot.version)
        return True

    def updated(self) -> None:
        """The optimizer applied the gradient `take_gradient` gave it: a new version."""
        self.version += 1

    # ---- a microbatch

    def forward(self, k: int, batch: int, x, y):
        snapshot = self.snapshots[batch]
        if self.first:
            inputs = [x]
        else:
            inputs = self.transport.recv(False, self.in_meta)
            for tensor in inputs:
                tensor.requires_grad_(tensor.is_floating_point())
        t0 = time.perf_counter()
        with autocast(self.device, self.precision):
            out = functional_call(self.module, snapshot.params, tuple(inputs))
        outputs = list(out) if isinstance(out, tuple) else [out]
        loss = None
        if self.last:
            loss = compute_loss(outputs[0], y)
            outputs = [loss / self.micro]  # the batch's mean: each microbatch's share
        self.forward_s += time.perf_counter() - t0
        if not self.last:
            self.transport.send(True, [o.detach() for o in outputs])
        self.flight[k] = (snapshot, inputs, outputs)
        self.log.actions.append(("F", k, snapshot.version))
        return None if loss is None else loss.detach()

    def backward(self, k: int) -> None:
        snapshot, inputs, outputs = self.flight.pop(k)
        if self.last:
            t0 = time.perf_counter()
            torch.autograd.backward(outputs[0])
        else:
            floating = [o for o in outputs if o.is_floating_point()]
            grads = self.transport.recv(True, [(tuple(o.shape), o.dtype) for o in floating])
            t0 = time.perf_counter()
            pairs = [(o, g) for o, g in zip(floating, grads, strict=True) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.backward_s += time.perf_counter() - t0
        if not self.first:
            sent = [
                t.grad if t.grad is not None else torch.zeros_like(t)
                for t in inputs
                if t.is_floating_point()
            ]
            self.transport.send(False, sent)
        self.log.actions.append(("B", k, snapshot.version))
