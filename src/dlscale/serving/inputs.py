"""A /predict request body checked structurally and turned into one batch the model takes: one
HTTP status and one line for anything else, before any of it reaches the model."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dlscale.errors import UserError

MAX_SAMPLES_PER_REQUEST = 256  # a bigger batch is the client's to split; it bounds one request
MAX_BODY_BYTES = 16 * 1024 * 1024  # 256 base64 images of about 48 KiB, or 256 × 16k floats


class BadInput(Exception):
    """What was wrong with a request, said in one line, with the HTTP status it answers."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class Model(Protocol):
    """What the checks need from a Predictor (dlscale.api.inference)."""

    input_shape: tuple[int, ...]
    input_kind: str  # "image", "features" or "tokens"
    num_classes: int
    vocab_size: int | None  # token ids lie in [0, vocab_size); not the classes for a classifier

    def images(self, files: list) -> torch.Tensor: ...


@dataclass
class Batch:
    """The samples of one request, batch first, as the model takes them."""

    tensor: torch.Tensor  # (N, *input_shape)

    @property
    def num_samples(self) -> int:
        return int(self.tensor.shape[0])


def parse_body(body: object, model: Model) -> Batch:
    """`{"inputs": [sample, ...]}`: each sample a nested list of numbers shaped as one of the
    run's samples (token ids for a language model), or for an image model a base64 image file."""
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadInput('the body must be a JSON object {"inputs": [sample, ...]}', 400)
    extra = sorted(set(body) - {"inputs"})
    if extra:
        raise BadInput(f"unknown field(s) {', '.join(extra)}: the body takes only 'inputs'", 400)
    samples = body["inputs"]
    if not isinstance(samples, list) or not samples:
        raise BadInput("'inputs' must be a non-empty list of samples", 400)
    if len(samples) > MAX_SAMPLES_PER_REQUEST:
        raise BadInput(
            f"{len(samples)} samples in one request; send at most {MAX_SAMPLES_PER_REQUEST}", 413
        )
    if all(isinstance(sample, str) for sample in samples):
        return Batch(_images(samples, model))
    if any(isinstance(sample, str) for sample in samples):
        raise BadInput("mix of base64 images and arrays in one request: send one kind")
    return Batch(torch.stack([_array(i, sample, model) for i, sample in enumerate(samples)]))


def _array(index: int, sample: object, model: Model) -> torch.Tensor:
    where = f"inputs[{index}]"
    if not _only_numbers(sample, len(model.input_shape)):
        raise BadInput(f"{where}: not a rectangular array of numbers")
    try:
        values = np.asarray(sample, dtype=np.float64)
    except ValueError:  # ragged
        raise BadInput(f"{where}: not a rectangular array of numbers") from None
    except OverflowError:  # a whole number past float64 (JSON's integers have no bound)
        raise BadInput(f"{where}: a number too large for float64") from None
    if tuple(values.shape) != tuple(model.input_shape):
        raise BadInput(
            f"{where}: shape {tuple(values.shape)}; this model takes one sample of shape "
            f"{tuple(model.input_shape)} ({model.input_kind})"
        )
    if not np.isfinite(values).all():
        raise BadInput(f"{where}: contains NaN or infinity")
    if model.input_kind != "tokens":
        return torch.from_numpy(values.astype(np.float32))
    if (values != np.round(values)).any():
        raise BadInput(f"{where}: token ids must be whole numbers")
    vocab = model.vocab_size or 0
    if values.min() < 0 or values.max() >= vocab:
        raise BadInput(f"{where}: token ids must lie in [0, {vocab})")
    return torch.from_numpy(values.astype(np.int64))


def _only_numbers(sample: object, depth: int) -> bool:
    """Lists of numbers, at most `depth` (a sample's rank) deep: a shallower sample is left for
    the shape check to name. numpy would read "3" as 3.0 and true as 1.0: in a JSON body either
    is the client's mistake, said rather than guessed. The depth bounds the recursion, however
    deep a hostile body nests."""
    if isinstance(sample, list):
        return depth > 0 and all(_only_numbers(item, depth - 1) for item in sample)
    return isinstance(sample, int | float) and not isinstance(sample, bool)


def _images(samples: list[str], model: Model) -> torch.Tensor:
    if model.input_kind != "image":
        raise BadInput(
            f"base64 images sent to a model of {model.input_kind}: send arrays shaped "
            f"{tuple(model.input_shape)}"
        )
    files = []
    for index, text in enumerate(samples):
        try:
            files.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise BadInput(f"inputs[{index}]: not base64") from None
    try:
        return model.images(files)  # decoded as the run's reader decoded its images
    except UserError as exc:
        raise BadInput(str(exc)) from None
