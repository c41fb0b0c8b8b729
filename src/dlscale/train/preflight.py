"""A spec tried without training: its data read, its model built on the meta device (no memory)
and given one sample, and its strategy's plan made (a pipeline's split, a tensor plan), so
`validate` finds what `train` would stop on in its first second."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.data import DataBundle, build_data
from dlscale.errors import CannotTrace, UserError
from dlscale.jobspec import Spec
from dlscale.models import build_model
from dlscale.train.plan import Plan, check_model_fits_data, check_trainable

# A strategy's plan for a model on the meta device and the data (strategies.CHECKS): one
# UserError where `train` would refuse it. The model is None where its factory needs real
# tensors: a strategy that builds it on the meta device at train time too says so (CannotTrace);
# one that builds it on a real device has nothing to check.
StrategyCheck = Callable[[Spec, torch.nn.Module, DataBundle], None]


def preflight(spec: Spec, plan_strategy: StrategyCheck | None = None) -> DataBundle:
    """Read the data, try the model on one sample and plan the strategy; every problem is a
    one-line UserError.

    A factory or forward that needs real tensors (it reads a value, loads weights) cannot run
    on the meta device; that is no fault of the spec, so it is left for `train` to try, unless
    the strategy itself must trace the model there (a pipeline's stages: CannotTrace).
    """
    data = build_data(spec.data, spec.seed)  # where it is: trying a spec copies nothing
    # A global batch larger than the data, cut into one share per data-parallel replica.
    Plan.of(spec, data.num_train, spec.strategy.replicas)
    name = spec.model.name
    model = None
    try:
        with torch.device("meta"):
            model = build_model(name, spec.model.kwargs, data.model_defaults())
        check_model_fits_data(model, data, name)
        check_trainable(model, name)
    except UserError as exc:
        if not needs_real_tensors(exc.__cause__ or exc.__context__):
            raise
        if model is None and plan_strategy is None:
            return data
    if plan_strategy is not None:  # the strategy's own check, given by the caller above
        try:
            plan_strategy(spec, model, data)
        except CannotTrace:  # the strategy traces on the meta device at train time too
            raise
        except UserError as exc:
            if not needs_real_tensors(exc.__cause__ or exc.__context__):
                raise
    return data


def needs_real_tensors(error: BaseException | None) -> bool:
    """True for the errors torch raises when an operation has no meta-device implementation
    or asks a meta tensor for its values."""
    if isinstance(error, NotImplementedError):
        return True
    return error is not None and "meta" in str(error).lower()
