"""The typed records `scale` and `compare` return: each the JSON document it also writes
(scale.json, schema dlscale.bench.scale/1; compare.json, dlscale.bench.compare/1) as
dataclasses, with `to_json()` giving that document and `from_json()` reading one back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class Convergence:
    """How one count's run converged (with --lr-scaling or --target-accuracy): its learning
    rate, final accuracy and epochs, the first epoch end at or above the target (None where
    never), and its curve of validation accuracy against samples seen."""

    lr: float
    final_val_accuracy: float | None
    epochs: int
    epochs_to_target: int | None
    time_to_target_s: float | None
    samples_to_target: int | None
    curve: list[dict]  # {samples, val_accuracy, epoch, elapsed_s} per epoch end


@dataclass(frozen=True)
class ScaleRow:
    """One worker count's run: throughput, efficiency T(N) / (N/N₀ · T(N₀)) against the
    smallest count, and the prediction beside it where this machine was measured."""

    workers: int
    global_batch_size: int
    samples_per_s: float
    per_worker_samples_per_s: float
    allreduce_share: float  # of the step (a tensor run's: its collectives' share)
    val_accuracy: float | None
    run_dir: str
    efficiency: float
    predicted_samples_per_s: float | None = None
    predicted_efficiency: float | None = None
    predicted_over_measured: float | None = None
    convergence: Convergence | None = None

    def to_json(self) -> dict:
        document = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "convergence"}
        if self.convergence is not None:  # the JSON keeps a row flat
            document.update(asdict(self.convergence))
        return document

    @classmethod
    def from_json(cls, document: dict) -> ScaleRow:
        converged = "lr" in document
        own = {f.name for f in fields(cls)} - {"convergence"}
        convergence = (
            Convergence(**{f.name: document[f.name] for f in fields(Convergence)})
            if converged
            else None
        )
        return cls(**{k: v for k, v in document.items() if k in own}, convergence=convergence)


@dataclass(frozen=True)
class ScaleResult:
    """`experiments.scale`: the spec trained at each worker count (tensor degree, for a tensor
    spec), one row per count, smallest first."""

    schema: str
    spec: str
    model: str
    strategy: str  # ddp, or tensor for a tensor spec
    per_worker_batch_size: int
    steps: int | None  # None: each count trained the spec's whole length
    cluster: str
    baseline_workers: int
    threads_per_worker: int
    note: str
    rows: list[ScaleRow]
    lr_scaling: str | None
    target_accuracy: float | None
    convergence: bool  # whether the rows carry how each count converged
    predicted_on: str | None  # "local" where this machine was measured, else None
    calibration: dict | None
    link: str | None

    def to_json(self) -> dict:
        document = {f.name: getattr(self, f.name) for f in fields(self)}
        document["rows"] = [row.to_json() for row in self.rows]
        return document

    @classmethod
    def from_json(cls, document: dict) -> ScaleResult:
        values = {f.name: document[f.name] for f in fields(cls)}
        values["rows"] = [ScaleRow.from_json(row) for row in document["rows"]]
        return cls(**values)


@dataclass(frozen=True)
class CompareRow:
    """One strategy's run: its accuracy (the curve's last point), its times, and when it
    reached the target (None where it never did)."""

    strategy: str
    workers: int  # the processes that trained (a pipeline's stages, a tensor group)
    val_accuracy: float | None
    val_loss: float | None
    wall_s: float  # the run record's own
    total_s: float  # measured around the whole run: start-up, training, last evaluation
    samples_per_s: float
    steps: int
    run_dir: str
    ps: dict | None  # the parameter servers' mode, updates_per_s and mean_staleness
    time_to_target_s: float | None
    epochs_to_target: int | None
    global_batch: int | None = None  # samples a step, over every worker (compare.json of old: none)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, document: dict) -> CompareRow:
        given = {f.name: document[f.name] for f in fields(cls) if f.name in document}
        return cls(**given)


@dataclass(frozen=True)
class CompareResult:
    """`experiments.compare`: the spec trained with each strategy at one worker count."""

    schema: str
    spec: str
    model: str
    data: str
    per_worker_batch_size: int
    workers: int
    epochs: int | None
    steps: int | None
    cluster: str
    strategies: list[str]
    best_val_accuracy: float | None
    target_fraction: float
    target_rule: str
    target_accuracy: float | None
    fastest_to_target: str | None
    rows: list[CompareRow]
    curves: dict[str, list[dict]]  # strategy -> its epoch ends (for the plot)

    def to_json(self) -> dict:
        document = {f.name: getattr(self, f.name) for f in fields(self)}
        document["rows"] = [row.to_json() for row in self.rows]
        return document

    @classmethod
    def from_json(cls, document: dict) -> CompareResult:
        values = {f.name: document[f.name] for f in fields(cls)}
        values["rows"] = [CompareRow.from_json(row) for row in document["rows"]]
        return cls(**values)
