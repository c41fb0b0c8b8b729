"""What to profile and how to scale it: the profile verb's two requests, each checked once, when
it is made (before a model is traced)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale import units
from dlscale.errors import UserError, once_each

# The strategies the scaling model predicts (profiler/scaling.py), in the order it shows them.
STRATEGIES = ("ddp", "pipeline", "ps", "hybrid", "tensor")
PROFILE_PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4")
INTEGER_PRECISIONS = ("int8", "int4")  # inference only: quantized weights and activations
PROFILE_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


MAX_BATCH = 2**63 - 1  # torch's sizes are int64


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile: a model and its samples, the devices to predict it on, and the views
    beside one training step. None takes the spec's value, or the zoo's default."""

    target: str  # a zoo model, package.module:factory, or a spec file
    batch_size: int | None = None
    input_shape: tuple[int, ...] | None = None  # one sample's shape
    precision: str | None = None  # fp32 | bf16 | fp16 | int8 | int4 (integers: inference only)
    optimizer: str | None = None
    tokens: bool = False  # samples are int64 token ids
    model_kwargs: dict | None = None
    dataset_size: int | None = None  # training samples per epoch
    inputs: str | None = None  # package.module:function(batch) returning the forward's inputs
    hardware: tuple[str, ...] | None = None  # catalogue names, ("all",), or None: the defaults
    hardware_files: tuple[Path, ...] = ()  # extra catalogue files, which may hold links too
    inference: bool = False  # also predict the forward pass alone
    dataflow: str | None = None  # systolic dataflows: ws | is | os | all, or a list of them

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size > MAX_BATCH:
            raise UserError(
                f"--batch {self.batch_size} is more samples than a tensor dimension holds "
                f"(at most {MAX_BATCH:,})"
            )
        if self.precision is not None and self.precision not in PROFILE_PRECISIONS:
            raise UserError(
                f"--precision must be fp32, bf16, fp16, int8 or int4 (got '{self.precision}')"
            )
        if self.optimizer is not None and self.optimizer not in PROFILE_OPTIMIZERS:
            raise UserError(
                f"--optimizer must be sgd, momentum, adam or adamw (got '{self.optimizer}')"
            )
        if self.hardware is not None:
            if not self.hardware:
                raise UserError("--hardware: no device named (leave it out for the defaults)")
            once_each("--hardware", list(self.hardware))
        if self.precision in INTEGER_PRECISIONS and not self.inference:
            raise UserError(
                f"--precision {self.precision} is for inference (no {self.precision} training): "
                "add --inference"
            )


PIPELINE_SCHEDULES = ("gpipe", "1f1b", "2bw")


@dataclass(frozen=True)
class ScalingRequest:
    """How to scale the profiled step: on how many of each device, over which links, with which
    strategies, for how long a run. No device counts: one device only, and nothing else set."""

    devices: tuple[int, ...] = ()  # counts of each device to predict on
    interconnect: str | None = None  # the link within a node; None: the device's own
    nodes: int = 1  # machines the devices are spread over
    network: str | None = None  # the link between nodes
    strategies: tuple[str, ...] | None = None  # None: every one of STRATEGIES
    epochs: int | None = None  # of the whole run; None: the spec's, or one
    deadline: str | None = None  # pick the cheapest count finishing within it: 2h, 30m
    ps_servers: int = 1  # parameter servers of the ps strategy
    sync_batchnorm: bool = False  # ddp with torch's SyncBatchNorm (its collectives counted)
    pipeline_schedule: str = "gpipe"  # of the pipeline and hybrid points: gpipe, 1f1b or 2bw

    def __post_init__(self) -> None:
        asked = self.interconnect or self.network or self.deadline or self.strategies is not None
        asked = asked or self.epochs is not None or self.pipeline_schedule != "gpipe"
        if not self.devices and (asked or self.nodes != 1 or self.sync_batchnorm):
            raise UserError(
                "--interconnect, --nodes, --network, --strategies, --deadline, --epochs, "
                "--pipeline-schedule and --sync-batchnorm need --devices, e.g. --devices 1,2,4,8"
            )
        if self.epochs is not None and self.epochs <= 0:
            raise UserError(f"--epochs must be a positive number (got {self.epochs})")
        if self.deadline is not None:
            parse_duration(self.deadline)  # one that is no duration: refused now, not after a trace
        if not self.devices:
            return
        devices = list(self.devices)  # shown as the messages always showed them: [2, 4]
        if min(devices) < 1:
            raise UserError(f"--devices must be positive counts, e.g. 1,2,4,8 (got {devices})")
        once_each("--devices", devices)
        if self.nodes < 1:
            raise UserError(f"--nodes must be at least 1 (got {self.nodes})")
        if any(count % self.nodes for count in devices):
            raise UserError(
                f"--nodes {self.nodes} must divide every device count in --devices {devices}"
            )
        if self.strategies is not None:
            if not self.strategies:
                raise UserError("--strategies: no strategy named (leave it out for all of them)")
            once_each("--strategies", list(self.strategies))
        if self.network is not None and self.nodes == 1:
            raise UserError(
                "--network is the link between nodes: it needs --nodes above 1 (within one "
                "node the devices talk over --interconnect)"
            )
        unknown = [s for s in self.strategy_names if s not in STRATEGIES]
        if unknown:
            raise UserError(
                f"--strategies: unknown '{unknown[0]}'; choose from {', '.join(STRATEGIES)}"
            )
        if self.nodes > 1 and self.network is None:
            raise UserError("--nodes above 1 needs --network, e.g. ib-hdr or eth-100g")
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise UserError(
                f"--pipeline-schedule: unknown '{self.pipeline_schedule}'; choose from "
                f"{', '.join(PIPELINE_SCHEDULES)}"
            )

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies to predict: those asked for, or every one."""
        return self.strategies or STRATEGIES

    @property
    def deadline_s(self) -> float | None:
        return None if self.deadline is None else parse_duration(self.deadline)


def parse_duration(text: str) -> float:
    """--deadline's '90s', '30m', '2h', '1.5d' -> seconds."""
    try:
        return units.parse_duration(text)
    except ValueError:
        raise UserError(
            f"--deadline must be a positive duration such as 90s, 30m, 2h or 1.5d (got '{text}')"
        ) from None
