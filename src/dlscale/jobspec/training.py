"""The training knobs: model, optimizer, loader and checkpoint sections."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from dlscale.jobspec.base import Strict


class ModelSpec(Strict):
    """A zoo name (`lenet`, `resnet18`, ...) or `package.module:factory`, with factory kwargs."""

    name: str = Field(min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # `dlscale profile` only: `package.module:function` returning the forward's example inputs
    # at a batch size (a tensor, args, kwargs or (args, kwargs)), for models that take several.
    inputs: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class OptimizerSpec(Strict):
    """`sgd` (plain), `momentum` (SGD with momentum), `adam`, `adamw`, `adagrad`."""

    name: Literal["sgd", "momentum", "adam", "adamw", "adagrad"] = "adam"
    lr: PositiveFloat = 1e-3
    weight_decay: NonNegativeFloat = 0.0
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (
        0.9,
        0.999,
    )


class LoaderSpec(Strict):
    """torch DataLoader settings: worker processes, pinned host memory, batches prefetched.
    `pin_memory` unset: pinned on a CUDA device (a pageable batch crosses at a fraction of the
    link's rate), nothing to pin elsewhere."""

    workers: NonNegativeInt = 0
    pin_memory: bool | None = None
    prefetch: PositiveInt | None = None

    def pinned_on(self, device_type: str) -> bool:
        """Whether a trainer on `device_type` pins its batches: on CUDA unless the spec says
        not to (a pageable batch crossed at 5.8–9.1 GB/s on an H100 against 53 GB/s pinned,
        docs/performance.md); there is nothing to pin for elsewhere."""
        return device_type == "cuda" and self.pin_memory is not False


class CheckpointSpec(Strict):
    """Checkpoints are written at every epoch end, at the end, and every `every_steps` steps."""

    every_steps: PositiveInt | None = None
    keep_last: PositiveInt = 2
