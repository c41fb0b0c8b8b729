"""The model registry: a zoo name or user factory in, an nn.Module or a one-line UserError out."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlscale.errors import UserError, a_or_an, one_line
from dlscale.models.alexnet import alexnet, alexnet_2gpu
from dlscale.models.gpt import gpt
from dlscale.models.lenet import lenet
from dlscale.models.lstm import lstm
from dlscale.models.mlp import mlp
from dlscale.models.resnet import resnet18, resnet50
from dlscale.models.vgg import vgg11, vgg16


@dataclass(frozen=True)
class ZooEntry:
    """One built-in model: how to build it and what a sample for its listed size looks like."""

    name: str
    factory: Callable[..., nn.Module]
    summary: str  # one line for `dlscale models`
    listing_kwargs: dict  # kwargs used when listing parameter counts ({} → the factory defaults)
    input_kind: str  # "image", "features" or "tokens"
    example_input_shape: tuple  # one sample without batch, matching listing_kwargs


_IMAGENET = (3, 224, 224)
_OWN_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/dlscale

ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in [
        ZooEntry("lenet", lenet, "LeNet-5 CNN for 28×28 digits", {}, "image", (1, 28, 28)),
        ZooEntry("mlp", mlp, "MLP on flattened input, hidden 512-256", {}, "features", (784,)),
        ZooEntry("alexnet", alexnet, "AlexNet (torchvision layout)", {}, "image", _IMAGENET),
        ZooEntry(
            "alexnet_2gpu",
            alexnet_2gpu,
            "AlexNet as published: two columns, one per GPU",
            {},
            "image",
            _IMAGENET,
        ),
        ZooEntry("vgg11", vgg11, "VGG-11 (configuration A)", {}, "image", _IMAGENET),
        ZooEntry("vgg16", vgg16, "VGG-16 (configuration D)", {}, "image", _IMAGENET),
        ZooEntry("resnet18", resnet18, "ResNet-18, basic blocks", {}, "image", _IMAGENET),
        ZooEntry("resnet50", resnet50, "ResNet-50, bottleneck blocks", {}, "image", _IMAGENET),
        ZooEntry("gpt", gpt, "decoder-only transformer, 2 layers × 128", {}, "tokens", (64,)),
        ZooEntry("lstm", lstm, "LSTM sequence classifier", {}, "tokens", (64,)),
    ]
}


def resolve_factory(
    name: str, what: str = "model", returns: str = "an nn.Module"
) -> Callable[..., Any]:
    """The factory for a zoo name or a "package.module:factory" reference; `what` names it in
    errors (a model, or --inputs) and `returns` says what the callable should return."""
    if name in ZOO and what == "model":
        return ZOO[name].factory
    if ":" not in name:
        zoo = ", ".join(ZOO)
        raise UserError(
            f"unknown model '{name}'; the zoo has: {zoo} (or give package.module:factory)"
        )
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise UserError(f"{what} '{name}' must look like package.module:factory")
    # A user's model file usually sits next to their spec, in the directory they run from;
    # the console-script entry point does not put that directory on sys.path by itself.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UserError(f"cannot import module '{module_name}': {one_line(error)}") from error
    except (Exception, SystemExit) as error:  # user code failing at import is still the user's
        raise UserError(
            f"importing module '{module_name}' failed: {user_code_failure(error)}"
        ) from error
    if not hasattr(module, attr):
        raise UserError(f"module '{module_name}' has no attribute '{attr}' (from {what} '{name}')")
    factory = getattr(module, attr)
    if not callable(factory):
        kind = type(factory).__name__
        raise UserError(f"{what} '{name}' is a {kind}, not a callable that returns {returns}")
    return factory


def _merge_arguments(
    name: str, factory: Callable[..., Any], kwargs: dict, defaults: dict
) -> dict[str, Any]:
    """kwargs checked against the factory's signature, plus the defaults it names and lacks."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: pass kwargs through
        return dict(kwargs)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    named = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if not takes_any:
        for key in kwargs:
            if key not in named:
                takes = ", ".join(named) if named else "no arguments"
                raise UserError(
                    f"model '{name}' does not take argument '{key}' (it takes: {takes})"
                )
    merged = dict(kwargs)
    for key, value in defaults.items():
        # Defaults come from the data, so a factory that does not name one simply does not
        # need it (an MLP has no use for in_channels); that is not worth a warning.
        if key in named and key not in merged:
            merged[key] = value
    return merged


def build_model(name: str, kwargs: dict | None = None, defaults: dict | None = None) -> nn.Module:
    """Build a zoo model or a user factory ("package.module:factory").

    ``kwargs`` are the user's arguments and must all be accepted by the factory. ``defaults``
    (from ``DataBundle.model_defaults()``) fill only the parameters the factory names and the
    user did not give. Every failure is a one-line UserError.
    """
    factory = resolve_factory(name)
    arguments = _merge_arguments(name, factory, dict(kwargs or {}), dict(defaults or {}))
    try:
        model = factory(**arguments)
    except (ValueError, TypeError) as error:  # a factory's own check of its arguments
        raise UserError(f"model '{name}' could not be built: {one_line(error)}") from error
    except (Exception, SystemExit) as error:  # a defect in the user's code: name it, and where
        raise UserError(
            f"model '{name}' could not be built by its factory: {user_code_failure(error)}"
        ) from error
    if not isinstance(model, nn.Module):
        kind = type(model).__name__
        raise UserError(f"model '{name}' returned {a_or_an(kind)}, not a torch.nn.Module")
    return model


def raised_at(error: BaseException) -> str:
    """' (nets.py, line 12)': the innermost frame of the user's own code (not torch's, nor the
    standard library's, nor ours) that the error passed through: the line to look at."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = user_frame(error) or frames[-1]
    return f" ({os.path.basename(frame.filename)}, line {frame.lineno})"


def user_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's own code the error passed through; None when it
    passed through none (it is then torch's, Python's or dlscale's own)."""
    frames = traceback.extract_tb(error.__traceback__)
    paths = sysconfig.get_paths()
    libraries = tuple(
        os.path.realpath(folder) + os.sep
        for folder in {paths["stdlib"], paths["purelib"], paths["platlib"], _OWN_FOLDER}
    )
    own = [
        f
        for f in frames
        if not f.filename.startswith("<")  # <frozen importlib._bootstrap>, <string>
        and not os.path.realpath(f.filename).startswith(libraries)
    ]
    return own[-1] if own else None


def user_code_failure(error: BaseException) -> str:
    """How user code failed, in one line: "KeyError: 'x' (nets.py, line 12)"."""
    if isinstance(error, SystemExit):  # uncaught, it would end dlscale without a word
        return f"it called sys.exit({error.code!r})"
    return f"{type(error).__name__}: {one_line(error)}{raised_at(error)}"


def check_model(name: str, kwargs: dict | None = None) -> None:
    """Resolve the factory and check the user's kwargs against it, building nothing."""
    _merge_arguments(name, resolve_factory(name), dict(kwargs or {}), {})


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter values; a tensor shared by two modules (tied weights) counts once."""
    # Module.parameters() already yields each Parameter object once, however many modules hold it.
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def parameter_count_meta(name: str, kwargs: dict | None = None) -> int:
    """Parameter count of a model built on the meta device, so even VGG-16 allocates nothing."""
    with torch.device("meta"):
        model = build_model(name, kwargs)
    return count_parameters(model)
