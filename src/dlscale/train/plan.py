"""Before training: how long the run is for this trainer's share, and whether the model takes
the data at all."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dlscale.data import DataBundle
from dlscale.errors import UserError, one_line
from dlscale.jobspec import Spec
from dlscale.models.registry import user_code_failure


@dataclass
class Plan:
    """How long the run is, in optimizer steps and epochs, for this worker's share of the data.
    `batch_size` is a micro-batch; with `accumulate` K, a worker's step runs K of them, so a
    step's global batch is K × batch_size × workers."""

    steps_per_epoch: int
    total_steps: int
    epochs: int
    batch_size: int
    global_batch_size: int
    accumulate: int = 1

    @classmethod
    def of(cls, spec: Spec, num_train: int, world_size: int = 1) -> Plan:
        global_batch = spec.batch_size * spec.accumulate * world_size
        steps_per_epoch = num_train // global_batch
        if steps_per_epoch == 0:
            raise UserError(
                f"batch_size {spec.batch_size}"
                + (f" × accumulate {spec.accumulate}" if spec.accumulate > 1 else "")
                + (f" × {world_size} workers" if world_size > 1 else "")
                + f" is larger than the training set ({num_train} samples)"
            )
        if spec.steps is not None:
            total = spec.steps
            epochs = math.ceil(total / steps_per_epoch)
        else:
            epochs = spec.epochs or 1
            total = epochs * steps_per_epoch
        return cls(steps_per_epoch, total, epochs, spec.batch_size, global_batch, spec.accumulate)

    @property
    def step_batch_size(self) -> int:
        """The samples one worker takes per optimizer step: its K micro-batches."""
        return self.batch_size * self.accumulate


def check_model_fits_data(model: nn.Module, data: DataBundle, model_name: str) -> None:
    """One forward pass on one real sample, so a shape mismatch is one clear line, not a trace."""
    x, y = data.example(1)
    try:
        with torch.no_grad():
            was_training = model.training
            model.eval()
            out = model(x.to(_device_of(model)))
            model.train(was_training)
    except UserError:  # the factory's own failure, already one line
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        shape = tuple(data.input_shape)
        raise UserError(
            f"model '{model_name}' cannot take this data's samples of shape {shape}: "
            f"{one_line(exc)}"
        ) from None
    except (Exception, SystemExit) as exc:  # a defect in the user's forward: name it, and where
        raise UserError(
            f"model '{model_name}' failed on one sample: {user_code_failure(exc)}"
        ) from None
    check_logits(out, y, data, model_name)


def check_trainable(model: nn.Module, model_name: str) -> None:
    """A model with no trainable parameter would fail its first backward inside autograd."""
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"model '{model_name}' has no trainable parameters: nothing to train")


def check_logits(out: object, y: torch.Tensor, data: DataBundle, model_name: str) -> None:
    """Logits the loss and the accuracy can score: (B, classes), or (B, T, vocabulary) for
    labels (B, T); the class dimension may be wider than the data needs, never narrower."""
    if not isinstance(out, torch.Tensor):
        raise UserError(f"model '{model_name}' must return a tensor of logits, got {type(out)}")
    expected = (*y.shape, data.num_classes)
    if tuple(out.shape[:-1]) != tuple(y.shape):
        axes = "(batch, tokens, vocabulary)" if y.ndim > 1 else "(batch, classes)"
        raise UserError(
            f"model '{model_name}' returned logits of shape {_shape(out.shape)} for 1 sample; "
            f"expected {_shape(expected)}: {axes}"
        )
    if out.shape[-1] < data.num_classes:
        raise UserError(
            f"model '{model_name}' outputs {out.shape[-1]} classes but the data has "
            f"{data.num_classes}; set model.kwargs.num_classes"
        )


def _shape(shape: tuple) -> str:
    """'(1, 10)', '(1,)' and '()' as Python writes them, without torch.Size around them."""
    return str(tuple(int(d) for d in shape))


def _device_of(model: nn.Module) -> torch.device:
    """Where the sample must go: the model's parameters' device (meta, when only checked)."""
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")
