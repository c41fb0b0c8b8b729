"""A spec tried without training: its data read, its model built on the meta device (no memory)
and given one sample, so `validate` finds what `train` would stop on in its first second."""

from __future__ import annotations

import torch

from dlscale.data import DataBundle, build_data
from dlscale.errors import UserError
from dlscale.models import build_model
from dlscale.spec import Spec
from dlscale.train.plan import check_model_fits_data, check_trainable


def preflight(spec: Spec) -> DataBundle:
    """Read the data and try the model on one sample; every problem is a one-line UserError.

    A factory or forward that needs real tensors (it reads a value, loads weights) cannot run
    on the meta device; that is no fault of the spec, so it is left for `train` to try.
    """
    data = build_data(spec.data, spec.seed)  # where it is: trying a spec copies nothing
    name = spec.model.name
    try:
        with torch.device("meta"):
            model = build_model(name, spec.model.kwargs, data.model_defaults())
        check_model_fits_data(model, data, name)
        check_trainable(model, name)
    except UserError as exc:
        if not _needs_real_tensors(exc.__cause__ or exc.__context__):
            raise
    return data


def _needs_real_tensors(error: BaseException | None) -> bool:
    """True for the errors torch raises when an operation has no meta-device implementation
    or asks a meta tensor for its values."""
    if isinstance(error, NotImplementedError):
        return True
    return error is not None and "meta" in str(error).lower()
