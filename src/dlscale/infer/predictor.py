"""The Predictor: a trained model rebuilt on a device at a precision, taking batches of
prepared inputs and returning each sample's predicted class (or next token) and confidence."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.infer.inputs import decode_images
from dlscale.infer.trained import TrainedModel
from dlscale.models import build_model
from dlscale.models.quantize import quantize_dynamic_int8
from dlscale.train.device import autocast, check_precision, resolve_device
from dlscale.train.score import count_correct

PRECISIONS = ("fp32", "bf16", "int8")
SHOWN_MISMATCHES = 3  # state-dict keys named in a mismatch message


@dataclass
class Prediction:
    """One batch's answers: per sample, the class (for a language model, the next token after
    the sequence) and its softmax probability."""

    classes: list[int]
    confidence: list[float]
    logits: torch.Tensor = field(repr=False)  # (N, C), or (N, T, V) for a language model


@dataclass
class Predictor:
    """A trained model ready for inputs shaped as its run's samples (`input_shape`, batch first).

    Images are float32 (N, C, H, W) in [0, 1], features float32 (N, F), tokens int64 (N, T):
    what the run's data reader gave its model. `predict` checks the shape in one line.
    """

    trained: TrainedModel
    model: nn.Module
    device: torch.device
    precision: str  # "fp32", "bf16" (autocast) or "int8" (dynamic, CPU)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.trained.input_shape

    @property
    def input_kind(self) -> str:
        return self.trained.input_kind

    @property
    def task(self) -> str:
        return self.trained.task

    @property
    def num_classes(self) -> int:
        return self.trained.num_classes

    @property
    def vocab_size(self) -> int | None:
        return self.trained.vocab_size

    def check(self, x: torch.Tensor, where: str = "inputs", per_sample: bool = False) -> None:
        """A batch this model takes, or one line saying what it got (from `where`) and what it
        needs: the batch's shape, or with `per_sample` (a batch read from a file of any
        number of samples) one sample's."""
        expected = ("N", *self.input_shape)
        if x.ndim != len(expected) or tuple(x.shape[1:]) != self.input_shape:
            got, takes = tuple(x.shape), expected
            if per_sample and x.ndim:
                got, takes = tuple(x.shape[1:]), self.input_shape
            raise UserError(
                f"{where}: {'samples of ' if per_sample else ''}shape {got}; this model takes "
                f"({', '.join(map(str, takes))}) ({self.input_kind}, as its run trained on)"
            )
        if self.input_kind == "tokens" and x.is_floating_point():
            raise UserError(f"{where}: {x.dtype}; this model takes int64 token ids")
        if self.input_kind != "tokens" and not x.is_floating_point():
            raise UserError(f"{where}: {x.dtype}; this model takes float32 {self.input_kind}")
        if self.input_kind == "tokens" and x.numel():
            _within(x, self.vocab_size, f"{where}: token id", "this model's vocabulary")

    def check_labels(self, y: torch.Tensor, x: torch.Tensor, where: str) -> None:
        """Labels this model's outputs can be counted against: a class a sample (a token a
        position for a language model), within its classes; else one line."""
        expected = tuple(x.shape) if self.input_kind == "tokens" else (x.shape[0],)
        if tuple(y.shape) != expected:
            shown = (
                "(N, " + ", ".join(map(str, expected[1:])) + ")" if len(expected) > 1 else "(N,)"
            )
            raise UserError(f"{where}: labels of shape {tuple(y.shape)}; this model's are {shown}")
        classes = self.vocab_size if self.input_kind == "tokens" else self.num_classes
        if y.numel():
            _within(y, classes, f"{where}: label", "this model's classes")

    def images(self, sources: Sequence[bytes | str | Path]) -> torch.Tensor:
        """Image files (or their bytes) as one batch (N, C, H, W), decoded as the run's reader
        decoded its images; a bad one is one line naming it."""
        return decode_images(self.trained.image_layout(), sources)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The model's raw outputs for a batch, in float32 on the CPU."""
        self.check(x)
        x = x.to(self.device) if self.input_kind == "tokens" else x.float().to(self.device)
        with autocast(self.device, "bf16" if self.precision == "bf16" else "fp32"):
            out = self.model(x)
        return out.float().cpu()

    def predict(self, x: torch.Tensor) -> Prediction:
        """Each sample's class (a language model's: the token after its sequence) and confidence."""
        logits = self.logits(x)
        last = logits[:, -1] if logits.ndim == 3 else logits  # (N, C)
        confidence, classes = torch.softmax(last, dim=-1).max(dim=-1)
        return Prediction(classes.tolist(), confidence.tolist(), logits)

    @staticmethod
    def correct(prediction: Prediction, labels: torch.Tensor) -> tuple[int, int]:
        """(correct, counted) as training's validation counts them: per sample, or per token."""
        return count_correct(prediction.logits, labels)


def build_predictor(trained: TrainedModel, device: str = "auto", precision: str = "fp32"):
    """The run's model with its weights, in eval mode, on `device` at `precision`."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")
    if precision == "int8":
        # torch's quantized kernels run on the CPU only.
        if device not in ("auto", "cpu"):
            raise UserError(f"--precision int8 runs on the CPU only (asked for {device})")
        device = "cpu"
    on = resolve_device(device)
    check_precision(precision if precision != "int8" else "fp32", on)
    model = build_model(trained.model_name, trained.model_kwargs, trained.model_defaults())
    load_weights(model, trained)
    model.eval()
    if precision == "int8":
        model = quantize_dynamic_int8(model)
    return Predictor(trained, model.to(on), on, precision)


def load_weights(model: nn.Module, trained: TrainedModel) -> None:
    """The checkpoint's weights into the rebuilt model; keys or shapes that differ are one line."""
    own = model.state_dict()
    saved = trained.weights
    missing = [key for key in own if key not in saved]
    extra = [key for key in saved if key not in own]
    reshaped = [
        f"{key} {tuple(saved[key].shape)} vs {tuple(own[key].shape)}"
        for key in own
        if key in saved and tuple(saved[key].shape) != tuple(own[key].shape)
    ]
    problems = [
        f"{what}: {', '.join(items[:SHOWN_MISMATCHES])}{' ...' * (len(items) > SHOWN_MISMATCHES)}"
        for what, items in (("missing", missing), ("unexpected", extra), ("shapes", reshaped))
        if items
    ]
    if problems:
        raise UserError(
            f"{trained.checkpoint}: its weights do not fit model '{trained.model_name}' as the "
            f"run builds it ({'; '.join(problems)}): a checkpoint of another model or spec"
        )
    model.load_state_dict(saved)


def _within(values: torch.Tensor, count: int | None, what: str, among: str) -> None:
    """One line if any of `values` is outside 0..count-1 (`count` None: not known, not checked)."""
    if count is None:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= count:
        bad = low if low < 0 else high
        raise UserError(f"{what} {bad} is not in {among} (0 to {count - 1})")
