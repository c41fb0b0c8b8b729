"""What the parent of a process-group strategy (ps, pipeline, hybrid) does around its launch:
refuse what the processes cannot run, keep the warnings for run.json while forwarding events,
and evaluate and checkpoint the model it assembled from their results."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.launch.base import EventHandler
from dlscale.spec import Spec
from dlscale.strategies.events import forward_to
from dlscale.train import checkpoint as ckpt
from dlscale.train.reporter import Reporter
from dlscale.train.step import evaluate


def require_cpu_fp32(spec: Spec, processes: str) -> None:
    if spec.device not in ("auto", "cpu") or spec.precision != "fp32":
        raise UserError(
            f"strategy '{spec.strategy.name}' trains fp32 on CPU {processes} in this release "
            "(device: cpu, precision: fp32)"
        )


def warned_events(
    spec: Spec, reporter: Reporter, rename: Callable[[str], str] = str
) -> tuple[list[str], EventHandler]:
    """The spec's warnings (shown now) and a handler that forwards the processes' events to
    `reporter`, adding each warning they send (through `rename`) to the same list."""
    warnings = list(spec.warnings())
    for message in warnings:
        reporter.warn(message)
    forward = forward_to(reporter)

    def handle(kind: str, args: tuple[Any, ...]) -> None:
        if kind == "warn":
            args = (rename(args[0]),)
            warnings.append(args[0])
        forward(kind, args)

    return warnings, handle


def evaluate_and_save(
    spec: Spec, run_dir: Path, model: nn.Module, data, step: int
) -> tuple[float, float, int]:
    """(validation loss, accuracy, step) of the assembled model, saved as the final checkpoint."""
    val_loader = torch.utils.data.DataLoader(data.val, batch_size=max(256, spec.batch_size))
    val_loss, val_acc = evaluate(model, val_loader, torch.device("cpu"), "fp32")
    ckpt.save_checkpoint(
        run_dir, step,
        {"spec_hash": spec.spec_hash(), "model": model.state_dict(),
         "strategy": spec.strategy.name},
        spec.checkpoint.keep_last,
    )  # fmt: skip
    return val_loss, val_acc, step
