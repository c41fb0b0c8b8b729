"""One training job: the whole spec tree, the settings it ignores, and its identity hash."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from dlscale.jobspec.base import Seed, Strict
from dlscale.jobspec.data import (
    Cifar10Data,
    DataSpec,
    IdxData,
    NpzData,
    StoredData,
    SyntheticData,
)
from dlscale.jobspec.strategy import SingleStrategy, StrategySpec
from dlscale.jobspec.sweep import SweepSpec
from dlscale.jobspec.training import CheckpointSpec, LoaderSpec, ModelSpec, OptimizerSpec

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class Spec(Strict):
    """One training job."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=80)]
    model: ModelSpec
    data: DataSpec
    batch_size: PositiveInt
    # Gradient accumulation: each optimizer step runs `accumulate` micro-batches of batch_size
    # (per worker), so its effective batch is accumulate × batch_size × replicas; steps,
    # epochs' step counts and checkpoint.every_steps count optimizer steps.
    accumulate: PositiveInt = 1
    epochs: PositiveInt | None = None
    steps: PositiveInt | None = None
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = "auto"
    # torch's intra-op threads in each process; None: the cores shared out among the processes
    threads: PositiveInt | None = None
    # On a CPU, the training process keeps the memory it frees for the next step instead of
    # handing large blocks back to the kernel (train/allocator.py): faster, at a resident size
    # that stays at its peak. false: give them back.
    keep_freed_memory: bool = True
    seed: Seed = 0
    loader: LoaderSpec = Field(default_factory=LoaderSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    strategy: StrategySpec = Field(default_factory=SingleStrategy)
    sweep: SweepSpec | None = None  # read by `dlscale sweep`; `train` ignores it

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"'{value}' is not one of auto, cpu, cuda, cuda:N, mps")
        return value

    @model_validator(mode="after")
    def _length(self) -> Spec:
        if self.epochs is not None and self.steps is not None:
            raise ValueError("give epochs or steps, not both")
        if self.epochs is None and self.steps is None:
            self.epochs = 1
        return self

    @model_validator(mode="after")
    def _strategy_precision(self) -> Spec:
        self.strategy.check_precision(self.precision)
        return self

    @model_validator(mode="after")
    def _strategy_device(self) -> Spec:
        self.strategy.check_device(self.device)
        return self

    @model_validator(mode="after")
    def _strategy_accumulate(self) -> Spec:
        if self.accumulate > 1:
            self.strategy.check_accumulate()
        return self

    def warnings(self) -> list[str]:
        """Settings the user gave that will have no effect (each deserves a warning)."""
        found = []
        opt = self.optimizer
        if "momentum" in opt.model_fields_set and opt.name != "momentum":
            found.append(f"optimizer.momentum is ignored by optimizer '{opt.name}'")
        if "betas" in opt.model_fields_set and opt.name not in ("adam", "adamw"):
            found.append(f"optimizer.betas is ignored by optimizer '{opt.name}'")
        found += self.strategy.warnings(opt.name)
        if self.sweep is not None:
            found.append(
                "the sweep section is read by `dlscale sweep`; `train` runs the spec as is"
            )
        if self.loader.prefetch is not None and self.loader.workers == 0:
            found.append("loader.prefetch is ignored with loader.workers: 0")
        data = self.data
        if isinstance(data, SyntheticData):
            given = data.model_fields_set
            unused = ("seq_len", "vocab_size") if data.kind == "image" else ("shape",)
            found += [
                f"data.{key} is ignored with data.kind: {data.kind}"
                for key in unused
                if key in given
            ]
        if (
            isinstance(data, IdxData | NpzData | Cifar10Data | StoredData)
            and "val_fraction" in data.model_fields_set
        ):
            given = ("val_images", "val_path", "val_files", "val_urls", "val_split")
            if any(getattr(data, name, None) for name in given):
                found.append("data.val_fraction is ignored: validation files are given")
        return found

    def spec_hash(self) -> str:
        """Stable short hash of the resolved spec: the identity of a run for checkpoints."""
        canonical = json.dumps(self.hashed_fields(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def hashed_fields(self) -> dict:
        """The resolved spec as its hash sees it: the fields that name the job, not its speed."""
        # Threads set the speed, not the job (at most the last bits of float sums): a run may
        # resume on a machine with other cores. The heartbeat warning only says when a worker is
        # silent. Left out, they keep every earlier hash too.
        # Where data is staged is a copy's location, not the data: it may move between resumes.
        # A model's example inputs are for `dlscale profile` only: training never reads them.
        ignored = {
            "threads": True,
            "keep_freed_memory": True,  # like threads: the speed, not the job
            # Added later: a spec that does not accumulate keeps the hash it had before.
            **({"accumulate": True} if self.accumulate == 1 else {}),
            "strategy": {"heartbeat_warn_s"},
            "data": {"stage"},
            "model": {"inputs"},
        }
        resolved = self.model_dump(mode="json", exclude=ignored)
        # A setting added later is left out at its default (the step it changes is not taken),
        # so a run from before it keeps its hash and resumes.
        if resolved["strategy"].get("sync_batchnorm") is False:
            del resolved["strategy"]["sync_batchnorm"]
        # Pinning is unset by default now (pinned on CUDA): hashed as the old default, false.
        if resolved["loader"]["pin_memory"] is None:
            resolved["loader"]["pin_memory"] = False
        return resolved
