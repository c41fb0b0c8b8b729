"""The `strategy` section: how gradients and weights move; a union discriminated by `name`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from dlscale.jobspec.base import Bytes, Strict

# Processes beat once a second (launch.heartbeat): a shorter wait would name healthy ones.
HeartbeatWarnS = Annotated[float, Field(ge=2.0)]


class SingleStrategy(Strict):
    """One process, one device."""

    name: Literal["single"] = "single"

    @property
    def processes(self) -> int:
        """Processes (each wanting a core) the strategy runs."""
        return 1

    @property
    def trainers(self) -> int:
        """Processes that run the training loop, each on one GPU when the spec runs on CUDA."""
        return 1


class DdpStrategy(Strict):
    """Synchronous data parallel: N workers, a shard of every global batch each, allreduce."""

    name: Literal["ddp"]
    workers: PositiveInt = 2
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: NCCL on GPUs, gloo on CPUs
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None  # rendezvous; None: a free one
    timeout_s: PositiveFloat = 60.0  # a collective waiting longer than this fails the job
    heartbeat_warn_s: HeartbeatWarnS = 5.0  # a worker silent this long is named (stopped?)

    @property
    def processes(self) -> int:
        return self.workers

    @property
    def trainers(self) -> int:
        return self.workers


class StragglerSpec(Strict):
    """For experiments: one worker runs `factor` times slower (it sleeps after each step)."""

    worker: NonNegativeInt = 0
    factor: Annotated[float, Field(ge=1.0)] = 2.0


class PsStrategy(Strict):
    """Parameter servers: `servers` processes hold the parameters (sharded by size), `workers`
    train on their shards of the data. `averaging`: synchronous parameter averaging every
    `local_steps`; `async`: every gradient applied at once; `downpour`: fetch every `n_fetch`
    steps, push accumulated gradients every `n_push`. The server applies gradients with the
    spec's optimizer (sgd or adagrad, as in Downpour); averaging workers step it locally."""

    name: Literal["ps"]
    mode: Literal["averaging", "async", "downpour"] = "async"
    workers: PositiveInt = 2
    servers: PositiveInt = 1
    local_steps: PositiveInt = 1  # averaging: local steps between averages
    n_fetch: PositiveInt = 1  # downpour: fetch parameters every n_fetch steps
    n_push: PositiveInt = 1  # downpour: push accumulated gradients every n_push steps
    staleness_lr: bool = False  # async/downpour: scale each update's lr by 1 / (1 + staleness)
    max_staleness: NonNegativeInt | None = None  # stale-synchronous bound on the clock gap
    straggler: StragglerSpec | None = None
    checkpoint_every_s: PositiveFloat = 30.0  # each server writes its shard this often
    heartbeat_timeout_s: PositiveFloat = 10.0  # a silent worker is declared dead after this
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    timeout_s: PositiveFloat = 120.0  # any single wait longer than this fails the job
    heartbeat_warn_s: HeartbeatWarnS = 5.0  # a process silent this long is named (stopped?)
    # How parameters and gradients travel: `shm` maps buffers that servers and workers share
    # (one host only), `gloo` sends them over torch.distributed; `auto` takes shm when every
    # process runs on one host and /dev/shm has room (the faster of the two measured here).
    data_plane: Literal["auto", "shm", "gloo"] = "auto"

    @property
    def processes(self) -> int:
        return self.workers + self.servers

    @property
    def trainers(self) -> int:
        """The workers; servers hold their shards in host memory and need no GPU."""
        return self.workers

    @model_validator(mode="after")
    def _straggler_exists(self) -> PsStrategy:
        if self.straggler is not None and self.straggler.worker >= self.workers:
            raise ValueError(
                f"straggler.worker {self.straggler.worker} does not exist: workers are "
                f"0..{self.workers - 1}"
            )
        return self


class PipelineStrategy(Strict):
    """Model parallelism: the model's layers split into `stages` contiguous stages, one process
    each; activations flow forward and gradients back. `naive` runs whole batches (one stage busy
    at a time); `gpipe` and `1f1b` cut each batch into `microbatches` (torch.distributed.pipelining
    schedules). `split`: `auto` balances the profiler's per-layer cost, or the names of the modules
    that begin stages 2..S."""

    name: Literal["pipeline"]
    stages: PositiveInt = 2
    microbatches: PositiveInt = 4
    schedule: Literal["naive", "gpipe", "1f1b"] = "gpipe"
    split: Literal["auto"] | list[str] = "auto"
    max_memory_per_worker: Bytes | None = None  # a stage predicted to need more is refused
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    timeout_s: PositiveFloat = 120.0
    heartbeat_warn_s: HeartbeatWarnS = 5.0  # a stage silent this long is named (stopped?)

    @model_validator(mode="after")
    def _split_names_every_boundary(self) -> PipelineStrategy:
        if isinstance(self.split, list) and len(self.split) != self.stages - 1:
            raise ValueError(
                f"split lists the modules that begin stages 2..{self.stages}, so "
                f"{self.stages - 1} for {self.stages} stages; got {len(self.split)}"
            )
        return self

    @property
    def replicas(self) -> int:
        return 1

    @property
    def processes(self) -> int:
        return self.stages * self.replicas

    @property
    def trainers(self) -> int:
        return self.processes

    @property
    def microbatches_run(self) -> int:
        """Microbatches per step: `naive` runs each batch whole."""
        return 1 if self.schedule == "naive" else self.microbatches


class HybridStrategy(PipelineStrategy):
    """Data parallel × pipeline: `data_parallel` replicas of an S-stage pipeline (D × S
    processes), each on its share of every global batch, gradients averaged across replicas."""

    name: Literal["hybrid"]  # type: ignore[assignment]
    data_parallel: PositiveInt = 2

    @property
    def replicas(self) -> int:
        return self.data_parallel


# How one Linear or Conv2d is split (profiler/tensor_plan.py says what each moves).
TensorStyle = Literal[
    "colwise", "colwise_gather", "rowwise", "grouped", "grouped_gather", "replicate"
]


class TensorStrategy(Strict):
    """Tensor parallel: single layers split across `degree` devices (torch's DeviceMesh,
    ColwiseParallel and RowwiseParallel), `data_parallel` replicas of that group (a 2-D mesh:
    degree × data_parallel processes), each replica on its share of every global batch.
    `plan`: `auto` pairs Linear layers column-then-row (Megatron) and splits convolutions by
    output channels, or {module: style} names the split layers (the rest are replicated)."""

    name: Literal["tensor"]
    degree: PositiveInt = 2
    data_parallel: PositiveInt = 1
    plan: Literal["auto"] | dict[str, TensorStyle] = "auto"
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: NCCL on GPUs, gloo on CPUs
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    timeout_s: PositiveFloat = 120.0
    heartbeat_warn_s: HeartbeatWarnS = 5.0

    @property
    def processes(self) -> int:
        return self.degree * self.data_parallel

    @property
    def trainers(self) -> int:
        return self.processes


StrategySpec = Annotated[
    SingleStrategy | DdpStrategy | PsStrategy | PipelineStrategy | HybridStrategy | TensorStrategy,
    Field(discriminator="name"),
]
