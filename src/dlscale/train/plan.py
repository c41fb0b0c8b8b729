"""Before training: how long the run is for this trainer's share, and whether the model takes
the data at all."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dlscale.data import DataBundle
from dlscale.errors import UserError, one_line
from dlscale.spec import Spec


@dataclass
class Plan:
    """How long the run is, in steps and epochs, for this worker's share of the data."""

    steps_per_epoch: int
    total_steps: int
    epochs: int
    batch_size: int
    global_batch_size: int

    @classmethod
    def of(cls, spec: Spec, num_train: int, world_size: int = 1) -> Plan:
        global_batch = spec.batch_size * world_size
        steps_per_epoch = num_train // global_batch
        if steps_per_epoch == 0:
            raise UserError(
                f"batch_size {spec.batch_size}"
                + (f" × {world_size} workers" if world_size > 1 else "")
                + f" is larger than the training set ({num_train} samples)"
            )
        if spec.steps is not None:
            total = spec.steps
            epochs = math.ceil(total / steps_per_epoch)
        else:
            epochs = spec.epochs or 1
            total = epochs * steps_per_epoch
        return cls(steps_per_epoch, total, epochs, spec.batch_size, global_batch)


def check_model_fits_data(model: nn.Module, data: DataBundle, model_name: str) -> None:
    """One forward pass on one real sample, so a shape mismatch is one clear line, not a trace."""
    x = data.train.tensors[0][:1]
    try:
        with torch.no_grad():
            was_training = model.training
            model.eval()
            out = model(x)
            model.train(was_training)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        shape = tuple(data.input_shape)
        raise UserError(
            f"model '{model_name}' cannot take this data's samples of shape {shape}: "
            f"{one_line(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor):
        raise UserError(f"model '{model_name}' must return a tensor of logits, got {type(out)}")
    if out.shape[-1] < data.num_classes:
        raise UserError(
            f"model '{model_name}' outputs {out.shape[-1]} classes but the data has "
            f"{data.num_classes}; set model.kwargs.num_classes"
        )
