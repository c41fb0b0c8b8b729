"""What to profile: a zoo name, `package.module:factory` or a spec file, as a workload."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlscale.data import build_data
from dlscale.errors import UserError
from dlscale.jobspec import OptimizerSpec, load_spec
from dlscale.models import ZOO, build_model, check_model

DEFAULT_BATCH = 32
DEFAULT_OPTIMIZER = "adam"


@dataclass
class Workload:
    """A model builder and one sample, with the training settings a step is traced under."""

    label: str  # what the user asked for
    model_name: str
    build: Callable[[], nn.Module]
    sample: torch.Tensor  # one input, no batch dimension
    batch_size: int
    precision: str
    optimizer: OptimizerSpec
    dataset_size: int | None  # training samples per epoch, when known
    dataset_bytes: int | None
    data_from_disk: bool = False  # read while training (hf, webdataset, images), not held
    epochs: int | None = None  # the spec's epochs (its steps, in whole epochs), for run figures
    inputs: Callable[[int], Any] | None = None  # example inputs at a batch size (--inputs)
    inputs_label: str = ""
    accumulate: int = 1  # the spec's micro-batches per optimizer step (scaling predictions)
    sync_batchnorm: bool = False  # the spec's ddp runs torch's SyncBatchNorm (ddp points)
    pinned: bool = True  # batches in pinned host memory on a GPU: the loader's default there
    # The spec gives large freed blocks back to the kernel (keep_freed_memory: false): on a CPU
    # its large new tensors fault their pages in every step (Hardware.first_touch_seconds).
    fresh_pages: bool = False


def resolve(
    target: str,
    batch_size: int | None = None,
    input_shape: list[int] | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    tokens: bool = False,
    model_kwargs: dict | None = None,
    dataset_size: int | None = None,
    inputs: str | None = None,
) -> Workload:
    """Options given explicitly override what a spec file says."""
    if batch_size is not None and batch_size <= 0:
        raise UserError(f"--batch must be a positive number (got {batch_size})")
    if dataset_size is not None and dataset_size <= 0:
        raise UserError(f"--dataset-size must be a positive number (got {dataset_size})")
    if input_shape is not None and (not input_shape or min(input_shape) <= 0):
        raise UserError(f"--input-shape must be positive sizes, e.g. 1,28,28 (got {input_shape})")
    path = Path(target)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        # The spec decides its model's arguments and whether its samples are tokens.
        if model_kwargs:  # {} is what a caller without --kwargs may pass
            raise UserError(
                "--kwargs applies to a model named on the command line; a spec's model takes "
                "its model.kwargs: edit them in the spec"
            )
        if tokens:
            raise UserError(
                "--tokens applies to a model named on the command line; a spec's data says "
                "whether its samples are tokens"
            )
        workload = _from_spec(path, batch_size, input_shape, precision, optimizer, dataset_size)
        return _checked(_with_inputs(workload, inputs))
    if inputs is not None and input_shape is None and target not in ZOO:
        input_shape = [1]  # the forward's inputs come from --inputs; no sample shape is needed
    if input_shape is None:
        if target not in ZOO:
            check_model(target, model_kwargs)  # unknown names get the zoo listing
            raise UserError(f"'{target}' is not in the zoo: give --input-shape for its samples")
        input_shape = list(ZOO[target].example_input_shape)
        tokens = ZOO[target].input_kind == "tokens"
    sample = torch.zeros(input_shape, dtype=torch.long if tokens else torch.float32)
    defaults = _defaults_for(input_shape, tokens)
    kwargs = dict(model_kwargs or {})
    check_model(target, kwargs)
    workload = _checked(
        Workload(
            label=target,
            model_name=target,
            build=lambda: build_model(target, kwargs, defaults),
            sample=sample,
            batch_size=batch_size or DEFAULT_BATCH,
            precision=precision or "fp32",
            optimizer=OptimizerSpec(name=optimizer or DEFAULT_OPTIMIZER),
            dataset_size=dataset_size,
            # A zoo model's data is its example samples: the size a --dataset-size of them takes.
            dataset_bytes=dataset_size * sample.nbytes if dataset_size else None,
        )
    )
    return _with_inputs(workload, inputs)


def _with_inputs(workload: Workload, inputs: str | None) -> Workload:
    """The forward's example inputs from `package.module:function` (--inputs or the spec's)."""
    if inputs is not None:
        from dlscale.profiler.inputs import load_inputs

        workload.inputs, workload.inputs_label = load_inputs(inputs), inputs
    return workload


def _checked(workload: Workload) -> Workload:
    """An epoch of fewer samples than one optimizer step takes (a batch, or the spec's
    accumulate × batch) has no step: its time would read 0 s."""
    size, batch, accumulate = workload.dataset_size, workload.batch_size, workload.accumulate
    if size is not None and size < batch * accumulate:
        if accumulate > 1:
            raise UserError(
                f"{size} training samples per epoch are fewer than one step takes (accumulate "
                f"{accumulate} × batch {batch} = {batch * accumulate}): an epoch has no step to "
                "time; give a larger --dataset-size or a smaller --batch"
            )
        raise UserError(
            f"{size} training samples per epoch are fewer than one batch ({batch}): an epoch "
            "has no step to time; give a larger --dataset-size or a smaller --batch"
        )
    return workload


def _defaults_for(input_shape: list[int], tokens: bool) -> dict[str, int]:
    """Factory arguments the sample shape implies (as DataBundle.model_defaults does for data)."""
    if tokens:
        return {"context_length": input_shape[0]}
    return {"in_channels": input_shape[0], "input_size": math.prod(input_shape)}


def _from_spec(path, batch_size, input_shape, precision, optimizer, dataset_size) -> Workload:
    spec = load_spec(path)
    data = build_data(spec.data, spec.seed)
    if input_shape is not None and list(input_shape) != list(data.input_shape):
        raise UserError(
            f"--input-shape {input_shape} contradicts the spec's data {list(data.input_shape)}"
        )
    x = data.example(1)[0]
    defaults = data.model_defaults()
    name, kwargs = spec.model.name, dict(spec.model.kwargs)
    steps_per_epoch = max(1, data.num_train // (spec.batch_size * spec.accumulate))
    epochs = spec.epochs or (-(-spec.steps // steps_per_epoch) if spec.steps else None)
    workload = Workload(
        label=str(path),
        model_name=name,
        build=lambda: build_model(name, kwargs, defaults),
        sample=torch.zeros_like(x[0]),
        batch_size=batch_size or spec.batch_size,
        precision=precision or spec.precision,
        optimizer=spec.optimizer if optimizer is None else OptimizerSpec(name=optimizer),
        dataset_size=dataset_size or data.num_train,
        dataset_bytes=data.num_train * data.sample_bytes,
        data_from_disk=not data.in_memory,
        epochs=epochs,
        accumulate=spec.accumulate,
        # Only ddp has the field; the scaling prediction prices it as --sync-batchnorm does.
        sync_batchnorm=bool(getattr(spec.strategy, "sync_batchnorm", False)),
        pinned=spec.loader.pinned_on("cuda"),
        fresh_pages=not spec.keep_freed_memory,
    )
    if spec.model.inputs is not None:
        _with_inputs(workload, spec.model.inputs)
    return workload
