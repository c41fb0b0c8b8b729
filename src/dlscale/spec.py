"""The job spec: a YAML file validated by pydantic into one tree, with clear one-line errors.

Every section is a strict pydantic model (unknown keys are rejected). Sections that come in kinds
(`data`, `strategy`) are unions discriminated by their `name` key: a new kind is one new class
added to its union.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dlscale.errors import UserError
from dlscale.units import parse_bytes

Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]


class Strict(BaseModel):
    """Base of every spec section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def _resolve_path(value: Any, info: ValidationInfo) -> Path | None:
    """Paths in a spec are relative to the spec file's folder; the file must exist."""
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    base = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path.resolve()


# ----------------------------------------------------------------------------- model


class ModelSpec(Strict):
    """A zoo name (`lenet`, `resnet18`, ...) or `package.module:factory`, with factory kwargs."""

    name: str = Field(min_length=1)
    kwargs: dict[str, Any] = Field(default_factory=dict)


# ------------------------------------------------------------------------------ data


class FoldSpec(Strict):
    """Cross-validation: train on all but fold `index` of `folds` stratified folds of the
    training data, validate on fold `index` (the data's own validation part is left out)."""

    folds: Annotated[int, Field(ge=2)]
    index: NonNegativeInt

    @model_validator(mode="after")
    def _index_in_range(self) -> FoldSpec:
        if self.index >= self.folds:
            raise ValueError(f"index {self.index} does not exist: folds are 0..{self.folds - 1}")
        return self


class DataSection(Strict):
    """What every data kind shares: the seed of its split (and generation), an optional fold."""

    # Seed of generated data and of the train/validation split; default: the spec's seed. The
    # members of an ensemble differ in `seed` but keep this one, so they share one validation set.
    seed: NonNegativeInt | None = None
    fold: FoldSpec | None = None


class DigitsData(DataSection):
    """scikit-learn's bundled 8×8 digits (1,797 images), optionally resized (28 for LeNet)."""

    name: Literal["digits"]
    image_size: Annotated[int, Field(ge=8, le=224)] = 8
    val_fraction: Fraction = 0.2


class SyntheticData(DataSection):
    """Seeded generated data of any shape: images/features (`kind: image`) or token sequences."""

    name: Literal["synthetic"]
    kind: Literal["image", "tokens"] = "image"
    shape: list[PositiveInt] = Field(default_factory=lambda: [1, 28, 28], min_length=1)
    num_classes: Annotated[int, Field(ge=2)] = 10
    num_samples: PositiveInt = 1024
    seq_len: PositiveInt = 64
    vocab_size: Annotated[int, Field(ge=2)] = 256
    task: Literal["classification", "language_modeling"] = "classification"
    val_fraction: Fraction = 0.2


class IdxData(DataSection):
    """MNIST / Fashion-MNIST IDX files (`*-idx3-ubyte` images, `*-idx1-ubyte` labels, `.gz` ok)."""

    name: Literal["idx"]
    images: Path
    labels: Path
    val_images: Path | None = None
    val_labels: Path | None = None
    val_fraction: Fraction = 0.2

    _paths = field_validator("images", "labels", "val_images", "val_labels", mode="before")(
        _resolve_path
    )

    @model_validator(mode="after")
    def _val_pair(self) -> IdxData:
        if (self.val_images is None) != (self.val_labels is None):
            raise ValueError("give both val_images and val_labels, or neither")
        return self


class Cifar10Data(DataSection):
    """CIFAR-10 binary batches (`data_batch_1.bin` ... `test_batch.bin`, 3,073 bytes a record)."""

    name: Literal["cifar10"]
    train_files: list[Path] = Field(min_length=1)
    val_files: list[Path] = Field(default_factory=list)
    val_fraction: Fraction = 0.2

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _paths(cls, value: Any, info: ValidationInfo) -> list[Path]:
        if not isinstance(value, list):
            raise ValueError("expected a list of file paths")
        return [_resolve_path(v, info) for v in value]


class NpzData(DataSection):
    """A NumPy `.npz` with arrays `x` (samples first) and `y` (integer labels)."""

    name: Literal["npz"]
    path: Path
    val_path: Path | None = None
    val_fraction: Fraction = 0.2

    _paths = field_validator("path", "val_path", mode="before")(_resolve_path)


DataSpec = Annotated[
    DigitsData | SyntheticData | IdxData | Cifar10Data | NpzData, Field(discriminator="name")
]
DATA_KINDS = ("digits", "synthetic", "idx", "cifar10", "npz")

# ------------------------------------------------------------------- training knobs


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
    """torch DataLoader settings: worker processes, pinned host memory, batches prefetched."""

    workers: NonNegativeInt = 0
    pin_memory: bool = False
    prefetch: PositiveInt | None = None


class CheckpointSpec(Strict):
    """Checkpoints are written at every epoch end, at the end, and every `every_steps` steps."""

    every_steps: PositiveInt | None = None
    keep_last: PositiveInt = 2


class SingleStrategy(Strict):
    """One process, one device."""

    name: Literal["single"] = "single"

    @property
    def processes(self) -> int:
        """Processes (each wanting a core) the strategy runs."""
        return 1


class DdpStrategy(Strict):
    """Synchronous data parallel: N workers, a shard of every global batch each, allreduce."""

    name: Literal["ddp"]
    workers: PositiveInt = 2
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: NCCL on GPUs, gloo on CPUs
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None  # rendezvous; None: a free one
    timeout_s: PositiveFloat = 60.0  # a collective waiting longer than this fails the job

    @property
    def processes(self) -> int:
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
    # How parameters and gradients travel: `shm` maps buffers that servers and workers share
    # (one host only), `gloo` sends them over torch.distributed; `auto` takes shm when every
    # process runs on one host and /dev/shm has room (the faster of the two measured here).
    data_plane: Literal["auto", "shm", "gloo"] = "auto"

    @property
    def processes(self) -> int:
        return self.workers + self.servers

    @model_validator(mode="after")
    def _straggler_exists(self) -> PsStrategy:
        if self.straggler is not None and self.straggler.worker >= self.workers:
            raise ValueError(
                f"straggler.worker {self.straggler.worker} does not exist: workers are "
                f"0..{self.workers - 1}"
            )
        return self


Bytes = Annotated[PositiveInt, BeforeValidator(parse_bytes)]  # 2048, "512MiB", "1.5GB"


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


StrategySpec = Annotated[
    SingleStrategy | DdpStrategy | PsStrategy | PipelineStrategy | HybridStrategy,
    Field(discriminator="name"),
]

# ----------------------------------------------------------------------------- sweep


class Distribution(Strict):
    """One searched parameter: `log_uniform: [lo, hi]`, `uniform: [lo, hi]`, `int: [lo, hi]`
    (both ends included) or `choice: [a, b, ...]`; exactly one of them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    log_uniform: tuple[PositiveFloat, PositiveFloat] | None = None
    uniform: tuple[float, float] | None = None
    int_range: tuple[int, int] | None = Field(default=None, alias="int")
    choice: list[str | int | float | bool | None] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
        given = [key for key in ("log_uniform", "uniform", "int_range", "choice")
                 if getattr(self, key) is not None]  # fmt: skip
        if len(given) != 1:
            raise ValueError("give exactly one of log_uniform, uniform, int, choice")
        bounds = self.log_uniform or self.uniform or self.int_range
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"the range [{bounds[0]}, {bounds[1]}] is empty: low < high needed")
        return self

    @property
    def kind(self) -> str:
        return next(key for key in ("log_uniform", "uniform", "int_range", "choice")
                    if getattr(self, key) is not None)  # fmt: skip


class SearchSpec(Strict):
    """A sampled search: `trials` configurations drawn from `space` (field path → distribution)."""

    trials: PositiveInt
    space: dict[str, Distribution] = Field(min_length=1)


class EarlyStoppingSpec(Strict):
    """Stop runs whose validation metric trails the others at the same epoch (Optuna pruners):
    `median` stops a run below the median of finished runs after `warmup_epochs`; `asha`
    (asynchronous successive halving) keeps the best 1/`reduction_factor` at each rung."""

    rule: Literal["median", "asha"] = "median"
    warmup_epochs: PositiveInt = 1  # median: epochs every run trains before it can be stopped
    min_runs: PositiveInt = 3  # median: finished runs needed before any run is stopped
    min_epochs: PositiveInt = 1  # asha: epochs before the first rung
    reduction_factor: Annotated[int, Field(ge=2)] = 3  # asha


class SweepSpec(Strict):
    """`dlscale sweep`: many trainings of this spec. `grid` (field path → values; every
    combination), or `random` / `tpe` (Optuna samplers over `space`); `kfold` scores each
    configuration on K folds, `ensemble` trains M seeds and scores their averaged predictions."""

    grid: dict[str, list[Any]] | None = None
    random: SearchSpec | None = None
    tpe: SearchSpec | None = None
    kfold: Annotated[int, Field(ge=2)] | None = None
    ensemble: Annotated[int, Field(ge=2)] | None = None
    metric: Literal["val_accuracy", "val_loss"] = "val_accuracy"
    early_stopping: EarlyStoppingSpec | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> SweepSpec:
        searches = [key for key in ("grid", "random", "tpe") if getattr(self, key) is not None]
        if len(searches) > 1:
            raise ValueError(f"give one of grid, random, tpe (got {' and '.join(searches)})")
        if self.kfold is not None and self.ensemble is not None:
            raise ValueError("give kfold or ensemble, not both")
        for path, values in (self.grid or {}).items():
            if not values:
                raise ValueError(f"grid.{path}: give at least one value")
        for path in self.paths:
            if path.split(".")[0] in ("sweep", "name"):
                raise ValueError(f"'{path}' cannot be swept")
        return self

    @property
    def search(self) -> SearchSpec | None:
        return self.random or self.tpe

    @property
    def paths(self) -> list[str]:
        """The swept field paths, in the order given."""
        if self.grid is not None:
            return list(self.grid)
        return list(self.search.space) if self.search is not None else []

    @property
    def maximize(self) -> bool:
        return self.metric == "val_accuracy"

    @property
    def trials(self) -> int:
        """How many configurations the sweep trains (1: the spec itself, by kfold or ensemble)."""
        if self.grid is not None:
            return math.prod(len(values) for values in self.grid.values())
        return self.search.trials if self.search is not None else 1


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class Spec(Strict):
    """One training job."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=80)]
    model: ModelSpec
    data: DataSpec
    batch_size: PositiveInt
    epochs: PositiveInt | None = None
    steps: PositiveInt | None = None
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = "auto"
    seed: NonNegativeInt = 0
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

    def warnings(self) -> list[str]:
        """Settings the user gave that will have no effect (each deserves a warning)."""
        found = []
        opt = self.optimizer
        if "momentum" in opt.model_fields_set and opt.name != "momentum":
            found.append(f"optimizer.momentum is ignored by optimizer '{opt.name}'")
        if "betas" in opt.model_fields_set and opt.name not in ("adam", "adamw"):
            found.append(f"optimizer.betas is ignored by optimizer '{opt.name}'")
        strategy = self.strategy
        if isinstance(strategy, PsStrategy):
            unused = {
                "averaging": ("n_fetch", "n_push", "staleness_lr", "max_staleness"),
                "async": ("local_steps", "n_fetch", "n_push"),
                "downpour": ("local_steps",),
            }[strategy.mode]
            found += [
                f"strategy.{key} is ignored by ps mode '{strategy.mode}'"
                for key in unused
                if key in strategy.model_fields_set
            ]
            if strategy.mode != "averaging" and opt.name not in ("sgd", "adagrad", "momentum"):
                found.append(
                    f"ps mode '{strategy.mode}' applies optimizer '{opt.name}' on the server, "
                    "across every worker's gradients; sgd or adagrad are the classic choices"
                )
        if (
            isinstance(strategy, PipelineStrategy)
            and strategy.schedule == "naive"
            and "microbatches" in strategy.model_fields_set
        ):
            found.append("strategy.microbatches is ignored by schedule 'naive' (whole batches)")
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
            isinstance(data, IdxData | NpzData | Cifar10Data)
            and "val_fraction" in data.model_fields_set
        ):
            has_val = getattr(data, "val_images", None) or getattr(data, "val_path", None)
            if has_val or getattr(data, "val_files", None):
                found.append("data.val_fraction is ignored: validation files are given")
        return found

    def spec_hash(self) -> str:
        """Stable short hash of the resolved spec: the identity of a run for checkpoints."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------- loading


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; every problem becomes a one-line UserError."""
    raw = load_raw(path)
    return parse_spec(raw, base_dir=Path(path).resolve().parent, source=str(path))


def load_raw(path: str | Path) -> Any:
    """The spec file's YAML as parsed, before validation (a sweep derives its trials from it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"spec file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot parse"
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read spec: {exc}") from None
    return raw


def parse_spec(raw: Any, base_dir: Path | None = None, source: str = "spec") -> Spec:
    """Validate an already-parsed mapping (from YAML, JSON or code)."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping of spec fields at the top level")
    try:
        return Spec.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise UserError(f"{source}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """First error as 'field.path: reason', plus a count of the others."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    field, owner = _field_path(first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = ", ".join(owner.model_fields) if owner is not None else ""
        text = f"unknown field '{field}'" + (f" (allowed here: {allowed})" if allowed else "")
    elif kind == "missing":
        text = f"{field}: required field is missing"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        ctx = first.get("ctx", {})
        if "tag" in ctx:
            choices = ctx.get("expected_tags", "").replace("'", "")
            text = f"unknown {field} name '{ctx['tag']}' (choose from: {choices})"
        else:
            text = f"{field}.name is missing; it picks the kind of {field}"
    else:
        message = first["msg"].removeprefix("Value error, ")
        shown = _short_input(first.get("input")) if kind != "value_error" else ""
        got = f" (got {shown})" if shown else ""
        text = f"{field}: {message}{got}" if field else f"{message}{got}"
    more = len(errors) - 1
    return text + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def _field_path(loc: tuple) -> tuple[str, type[BaseModel] | None]:
    """Dotted field path from a pydantic loc, minus union tags; and the model owning the leaf."""
    parts: list[str] = []
    model: Any = Spec
    owner: type[BaseModel] | None = Spec
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
            continue
        if model is None:
            parts.append(str(item))
            continue
        if isinstance(model, type) and issubclass(model, BaseModel) and item in model.model_fields:
            owner = model
            parts.append(str(item))
            model = _section_class(model.model_fields[item].annotation)
        elif isinstance(model, list):  # a discriminated union: this item is the tag
            model = next((m for m in model if _tag(m) == item), None)
        else:
            owner = model if isinstance(model, type) else owner
            parts.append(str(item))
            model = None
    return ".".join(parts), owner


def _section_class(annotation: Any) -> Any:
    """The spec-section class(es) behind a field annotation, if it is one."""
    args = getattr(annotation, "__args__", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if args:
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) > 1:
            return models
        if models:
            return models[0]
        for arg in args:  # Annotated[...] nests the union one level down
            found = _section_class(arg)
            if found is not None:
                return found
    return None


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("name")
    args = getattr(field.annotation, "__args__", ()) if field else ()
    return args[0] if args else None


def _short_input(value: Any) -> str:
    if isinstance(value, dict | list):
        return ""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
