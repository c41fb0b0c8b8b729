"""The `strategy` section: how gradients and weights move, and the facts the rest of dlscale asks
of each kind (processes, replicas, stages, how it scales); a union discriminated by `name`."""

from __future__ import annotations

from abc import abstractmethod
from typing import Annotated, Literal, get_args

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from dlscale.errors import UserError
from dlscale.jobspec.base import Bytes, Strict

# Processes beat once a second (launch.heartbeat): a shorter wait would name healthy ones.
HeartbeatWarnS = Annotated[float, Field(ge=2.0)]
PsMode = Literal["averaging", "async", "downpour"]
# The settings each ps mode ignores: the spec warns when they are given, and `compare` does
# not carry them into that mode.
IGNORED_BY_MODE: dict[str, tuple[str, ...]] = {
    "averaging": ("n_fetch", "n_push", "staleness_lr", "max_staleness"),
    "async": ("local_steps", "n_fetch", "n_push"),
    "downpour": ("local_steps",),
}


class StrategySection(Strict):
    """What the rest of dlscale asks a strategy, so that no caller switches on its kind. The
    counts without a default must be stated (a section that forgets one cannot be made); the
    rest default to what most strategies are. Each kind also answers `stages`: the pipeline
    stages one model state is split over, a GPU holding 1/stages of it (a field of the pipeline
    kinds, so not declared here: a field may not shadow its parent's property)."""

    name: str

    @property
    @abstractmethod
    def processes(self) -> int:
        """Processes the strategy runs, each wanting a core."""

    @property
    def trainers(self) -> int:
        """Processes that run the training loop: each on one GPU when the spec runs on CUDA,
        each with its own DataLoader workers."""
        return self.processes

    @property
    @abstractmethod
    def replicas(self) -> int:
        """Data-parallel replicas: the shares every global batch is cut into (a pipeline's
        stages and a tensor group's shards share one; a ps job's servers train nothing)."""

    @property
    def model_states(self) -> int:
        """Whole model states (weights, gradients, optimizer state) its processes hold in this
        machine's memory when it trains on the CPU: one per replica."""
        return self.replicas

    @property
    def in_process(self) -> bool:
        """Trains in the calling process: no worker to start, none to place on a cluster."""
        return False

    def scaled(self, workers: int) -> StrategySection:
        """What `dlscale scale` runs at `workers` workers: ddp, unless the strategy grows itself."""
        return DdpStrategy(name="ddp").model_copy(update={"workers": workers})

    @abstractmethod
    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        """This strategy's section for a `dlscale compare` run at `workers` workers, keeping the
        user's `current` settings where they are of its kind."""

    @classmethod
    def variants(cls) -> dict[str, StrategySection]:
        """The names `dlscale compare` runs it by, each with its section's defaults."""
        name = get_args(cls.model_fields["name"].annotation)[0]
        return {name: cls(name=name)}

    def warnings(self, optimizer: str) -> list[str]:
        """Settings given that will have no effect, and choices worth a word, with the spec's
        `optimizer`."""
        return []

    def check_precision(self, precision: str) -> None:
        """A ValueError for a precision the strategy cannot train in."""

    def check_device(self, device: str) -> None:
        """A ValueError for the spec's device (auto, cpu, cuda, cuda:N, mps) where the strategy
        cannot train on it whatever the machine (`auto` is the run's to resolve)."""

    def check_accumulate(self) -> None:
        """A ValueError if the strategy cannot accumulate gradients over micro-batches (the
        spec's `accumulate` above 1)."""


def sync_batchnorm_refusal(device: str) -> str:
    """The one line that refuses `sync_batchnorm` off CUDA."""
    return (
        f"strategy.sync_batchnorm needs CUDA GPUs (device is {device}): torch's SyncBatchNorm "
        "has no CPU implementation; set it false, or train on device cuda"
    )


def check_backend_device(backend: str, device: str) -> None:
    """NCCL connects GPUs only: asked for on another device, one line at validate time."""
    if backend == "nccl" and not device.startswith(("auto", "cuda")):
        raise ValueError(
            f"strategy.backend nccl connects CUDA GPUs only (device is {device}): use gloo, or "
            "auto (gloo on CPUs, NCCL on GPUs)"
        )


def _settings(current: StrategySection) -> dict:
    """The settings the user gave a section (not its defaults)."""
    return current.model_dump(mode="json", exclude_unset=True)


class SingleStrategy(StrategySection):
    """One process, one device."""

    name: Literal["single"] = "single"

    @property
    def processes(self) -> int:
        return 1

    @property
    def replicas(self) -> int:
        return 1

    @property
    def in_process(self) -> bool:
        return True

    @property
    def stages(self) -> int:
        return 1

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        return {"name": "single"}


class DdpStrategy(StrategySection):
    """Synchronous data parallel: N workers, a shard of every global batch each, allreduce."""

    name: Literal["ddp"]
    workers: PositiveInt = 2
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: NCCL on GPUs, gloo on CPUs
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None  # rendezvous; None: a free one
    timeout_s: PositiveFloat = 60.0  # a collective waiting longer than this fails the job
    heartbeat_warn_s: HeartbeatWarnS = 5.0  # a worker silent this long is named (stopped?)
    # BatchNorm statistics over the global batch: torch's SyncBatchNorm, which runs on GPUs only
    sync_batchnorm: bool = False

    @property
    def processes(self) -> int:
        return self.workers

    @property
    def replicas(self) -> int:
        return self.workers

    @property
    def stages(self) -> int:
        return 1

    def scaled(self, workers: int) -> StrategySection:
        return self.model_copy(update={"workers": workers})

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        kept = _settings(current) if isinstance(current, DdpStrategy) else {}
        return {**kept, "name": "ddp", "workers": workers}

    def check_device(self, device: str) -> None:
        # torch 2.13's SyncBatchNorm refuses CPU input and has no CPU kernels for its
        # statistics (aten::batch_norm_stats and the rest are CUDA's); DDP refuses it on a CPU
        # module too. `auto` and `cuda` are left for the run to resolve.
        if self.sync_batchnorm and not device.startswith(("auto", "cuda")):
            raise ValueError(sync_batchnorm_refusal(device))
        check_backend_device(self.backend, device)


class StragglerSpec(Strict):
    """For experiments: one worker runs `factor` times slower (it sleeps after each step)."""

    worker: NonNegativeInt = 0
    factor: Annotated[float, Field(ge=1.0)] = 2.0


class PsStrategy(StrategySection):
    """Parameter servers: `servers` processes hold the parameters (sharded by size), `workers`
    train on their shards of the data. `averaging`: synchronous parameter averaging every
    `local_steps`; `async`: every gradient applied at once; `downpour`: fetch every `n_fetch`
    steps, push accumulated gradients every `n_push`. The server applies gradients with the
    spec's optimizer (sgd or adagrad, as in Downpour); averaging workers step it locally."""

    name: Literal["ps"]
    mode: PsMode = "async"
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

    @property
    def replicas(self) -> int:
        return self.workers

    @property
    def model_states(self) -> int:
        """One per worker; the servers' shards together make one more."""
        return self.workers + 1

    @property
    def stages(self) -> int:
        return 1

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        kept = _settings(current) if isinstance(current, PsStrategy) else {}
        for key in IGNORED_BY_MODE[self.mode]:  # they would only warn
            kept.pop(key, None)
        return {**kept, "name": "ps", "mode": self.mode, "workers": workers}

    @classmethod
    def variants(cls) -> dict[str, StrategySection]:
        return {mode: cls(name="ps", mode=mode) for mode in get_args(PsMode)}

    def warnings(self, optimizer: str) -> list[str]:
        found = [
            f"strategy.{key} is ignored by ps mode '{self.mode}'"
            for key in IGNORED_BY_MODE[self.mode]
            if key in self.model_fields_set
        ]
        if self.mode != "averaging" and optimizer not in ("sgd", "adagrad", "momentum"):
            found.append(
                f"ps mode '{self.mode}' applies optimizer '{optimizer}' on the server, "
                "across every worker's gradients; sgd or adagrad are the classic choices"
            )
        return found

    def check_accumulate(self) -> None:
        # A ps worker pushes after every step; its own accumulation is downpour's n_push.
        raise ValueError(
            "accumulate is for strategies single, ddp and tensor: ps workers accumulate "
            "gradients with mode downpour's n_push (push every n_push steps)"
        )

    @model_validator(mode="after")
    def _straggler_exists(self) -> PsStrategy:
        if self.straggler is not None and self.straggler.worker >= self.workers:
            raise ValueError(
                f"straggler.worker {self.straggler.worker} does not exist: workers are "
                f"0..{self.workers - 1}"
            )
        return self


class PipelineStrategy(StrategySection):
    """Model parallelism: the model's layers split into `stages` contiguous stages, one process
    each; activations flow forward and gradients back. `naive` runs whole batches (one stage busy
    at a time); `gpipe` and `1f1b` cut each batch into `microbatches` (torch.distributed.pipelining
    schedules); `2bw` is PipeDream-2BW: 1F1B without a flush between steps, each batch's
    gradient applied one step late, two weight versions kept. `split`: `auto` balances the
    profiler's per-layer cost, or the names of the modules that begin stages 2..S."""

    name: Literal["pipeline"]
    stages: PositiveInt = 2
    microbatches: PositiveInt = 4
    schedule: Literal["naive", "gpipe", "1f1b", "2bw"] = "gpipe"
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
        # PipeDream-2BW keeps two weight versions only while a stage has no more microbatches
        # in flight than a batch holds (m >= d, Narayanan et al., ICML 2021, section 3.1).
        if self.schedule == "2bw" and self.microbatches < self.stages:
            raise ValueError(
                f"schedule 2bw needs microbatches >= stages ({self.microbatches} < {self.stages})"
            )
        return self

    @property
    def replicas(self) -> int:
        return 1

    @property
    def processes(self) -> int:
        return self.stages * self.replicas

    @property
    def microbatches_run(self) -> int:
        """Microbatches per step: `naive` runs each batch whole."""
        return 1 if self.schedule == "naive" else self.microbatches

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        """`workers` stages (a split kept only when it names that many)."""
        kept = _pipeline_settings(current, batch_size)
        if kept.get("split") not in (None, "auto") and len(kept["split"]) != workers - 1:
            kept.pop("split")  # a split for another stage count
        return {**kept, "name": "pipeline", "stages": workers}

    def check_accumulate(self) -> None:
        # The schedule already runs each batch as microbatches and steps once after them all.
        raise ValueError(
            f"accumulate is for strategies single, ddp and tensor: {self.name} already "
            "accumulates over strategy.microbatches; give batch_size K·B and microbatches K"
        )

    def warnings(self, optimizer: str) -> list[str]:
        if self.schedule == "naive" and "microbatches" in self.model_fields_set:
            return ["strategy.microbatches is ignored by schedule 'naive' (whole batches)"]
        return []

    def check_precision(self, precision: str) -> None:
        # fp16's loss scale changes from step to step, but 2bw's gradient is summed over two.
        if precision == "fp16" and self.schedule == "2bw":
            raise ValueError("schedule 2bw trains in fp32 or bf16 (no fp16 loss scaling); use bf16")


def _pipeline_settings(current: StrategySection, batch_size: int) -> dict:
    """A compared pipeline's or hybrid's settings: the user's pipeline settings (either kind's),
    microbatches the user's or the most of 4, 2, 1 that divides the batch."""
    kept = _settings(current) if isinstance(current, PipelineStrategy) else {}
    kept.pop("data_parallel", None)
    kept.setdefault("microbatches", next(m for m in (4, 2, 1) if batch_size % m == 0))
    return kept


class HybridStrategy(PipelineStrategy):
    """Data parallel × pipeline: `data_parallel` replicas of an S-stage pipeline (D × S
    processes), each on its share of every global batch, gradients averaged across replicas."""

    name: Literal["hybrid"]  # type: ignore[assignment]
    data_parallel: PositiveInt = 2

    @property
    def replicas(self) -> int:
        return self.data_parallel

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        """`workers` // stages replicas of the user's stages (or 2)."""
        kept = _pipeline_settings(current, batch_size)
        stages = kept.get("stages", 2)
        if workers < stages or workers % stages:
            raise UserError(
                f"--workers {workers}: hybrid runs replicas of a {stages}-stage pipeline, so "
                f"give a multiple of {stages}"
            )
        return {**kept, "name": "hybrid", "stages": stages, "data_parallel": workers // stages}


# How one Linear or Conv2d is split (profiler/tensor_plan.py says what each moves).
TensorStyle = Literal[
    "colwise", "colwise_gather", "rowwise", "grouped", "grouped_gather", "replicate"
]


class TensorStrategy(StrategySection):
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

    @field_validator("plan", mode="before")
    @classmethod
    def _plan_named(cls, value):
        """One line naming the wrong style or value (pydantic's union error named neither)."""
        styles = get_args(TensorStyle)
        if isinstance(value, dict):
            for module, style in value.items():
                if style not in styles:
                    raise ValueError(
                        f"{style!r} ({module}) is not a split style (choose from: "
                        f"{', '.join(styles)})"
                    )
        elif value != "auto":
            raise ValueError(f"'auto', or a mapping of module name: split style (got {value!r})")
        return value

    def check_device(self, device: str) -> None:
        check_backend_device(self.backend, device)

    @property
    def processes(self) -> int:
        return self.degree * self.data_parallel

    @property
    def replicas(self) -> int:
        return self.data_parallel

    @property
    def model_states(self) -> int:
        """One per process: each builds the whole model before its layers are split."""
        return self.processes

    @property
    def stages(self) -> int:
        return 1

    def scaled(self, workers: int) -> StrategySection:
        """The degree grows: the same batch split over more devices (strong scaling)."""
        return self.model_copy(update={"degree": workers})

    def compared(self, workers: int, current: StrategySection, batch_size: int) -> dict:
        kept = _settings(current) if isinstance(current, TensorStrategy) else {}
        replicas = kept.get("data_parallel", 1)
        if workers % replicas:
            raise UserError(
                f"--workers {workers}: the spec's tensor strategy has "
                f"{replicas} data-parallel replicas; give a multiple of {replicas}"
            )
        return {**kept, "name": "tensor", "degree": workers // replicas}

    def check_precision(self, precision: str) -> None:
        # GradScaler unscales every gradient of a device and type in one foreach kernel, which
        # cannot take a split layer's (DTensor) gradients beside the whole layers' (torch 2.13;
        # seen on an H200).
        if precision == "fp16":
            raise ValueError(
                "strategy tensor trains in fp32 or bf16: fp16's loss scaling cannot "
                "unscale split and whole layers' gradients together; use bf16"
            )


StrategySpec = Annotated[
    SingleStrategy | DdpStrategy | PsStrategy | PipelineStrategy | HybridStrategy | TensorStrategy,
    Field(discriminator="name"),
]
# Every kind of section, in the union's order (`compare` lists them so).
STRATEGY_KINDS: tuple[type[StrategySection], ...] = get_args(get_args(StrategySpec)[0])
