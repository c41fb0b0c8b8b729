"""Example inputs a user gives for models whose forward takes more than one tensor.

`--inputs package.module:make_inputs` names a function called with the batch size. It returns
one tensor, a tuple of positional arguments, a dict of keyword arguments, or (args, kwargs).
It runs under `torch.device("meta")`, so `torch.zeros(batch, 128, dtype=torch.long)` allocates
nothing; tensors it makes on the CPU anyway are moved to the meta device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from dlscale.errors import UserError, a_or_an
from dlscale.models.registry import user_code_failure

Inputs = tuple[tuple, dict]


def load_inputs(reference: str) -> Callable[[int], Any]:
    """The function a `package.module:function` reference names (imported from the cwd)."""
    from dlscale.models.registry import resolve_factory

    if ":" not in reference:
        raise UserError(f"--inputs must look like package.module:function (got '{reference}')")
    return resolve_factory(reference, what="--inputs", returns="inputs")


def example_inputs(
    make: Callable[[int], Any], batch_size: int, label: str, device: str = "meta"
) -> Inputs:
    """(args, kwargs) on `device` (meta, or cpu under fake tensors) from the user's function."""
    try:
        with torch.device(device):
            made = make(batch_size)
    except (Exception, SystemExit) as error:
        raise UserError(f"--inputs {label} failed: {user_code_failure(error)}") from None
    args, kwargs = _split(made, label)
    if not any(isinstance(t, torch.Tensor) for t in tree_leaves((args, kwargs))):
        raise UserError(f"--inputs {label} returned no tensor")

    def moved(value):
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return tree_map(moved, args), tree_map(moved, kwargs)


def _split(made: Any, label: str) -> Inputs:
    if isinstance(made, torch.Tensor):
        return (made,), {}
    if isinstance(made, dict):
        return (), dict(made)
    if isinstance(made, tuple | list):
        if len(made) == 2 and isinstance(made[0], tuple | list) and isinstance(made[1], dict):
            return tuple(made[0]), dict(made[1])
        return tuple(made), {}
    raise UserError(
        f"--inputs {label} returned {a_or_an(type(made).__name__)}; return a tensor, a tuple of "
        "arguments, a dict of keyword arguments, or (args, kwargs)"
    )


def logits_of(output: Any) -> Any:
    """The logits in a model's output: a tensor, a transformers ModelOutput's `.logits`, a
    dict's 'logits', or the first tensor of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, dict) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, tuple | list):
        return next((t for t in output if isinstance(t, torch.Tensor)), output)
    return output
