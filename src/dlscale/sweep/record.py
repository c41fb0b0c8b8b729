"""A sweep's results (results.json, schema dlscale.sweep/1), typed: what `api.sweep` returns.

`SweepResult` is the schema of the document the runner builds from its trials (sweep/runner.py,
sweep/trials.py) and writes as results.json; `SweepResult.model_validate` checks any results.json
against it and `to_json()` gives the document back, key for key. A trial's run is `RunResult`,
which is also what its result.json holds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SWEEP_SCHEMA = "dlscale.sweep/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HoldoutEvaluation(_Strict):
    kind: Literal["holdout"]


class KFoldEvaluation(_Strict):
    kind: Literal["kfold"]
    folds: int


class EnsembleEvaluation(_Strict):
    kind: Literal["ensemble"]
    members: int


Evaluation = Annotated[
    HoldoutEvaluation | KFoldEvaluation | EnsembleEvaluation, Field(discriminator="kind")
]


class CurvePoint(_Strict):
    """A run's figures at the end of one epoch."""

    epoch: int
    step: int
    val_accuracy: float | None
    val_loss: float | None
    train_loss: float | None
    elapsed_s: float


class StoppedAt(_Strict):
    """Where early stopping ended a trial: the run it stopped and that run's last epoch."""

    run: str
    epoch: int
    step: int
    val_accuracy: float | None
    val_loss: float | None
    train_loss: float | None
    elapsed_s: float


class EnsembleScore(_Strict):
    """The members' averaged class probabilities, scored; each member's own metric."""

    val_accuracy: float
    val_loss: float
    members: list[float]


class RunResult(_Strict):
    """One run of a trial (a fold, an ensemble member, or the one holdout run); None where it
    did not get that far."""

    name: str
    status: Literal["pending", "running", "completed", "failed", "pruned", "skipped"]
    run_dir: str
    error: str | None
    val_accuracy: float | None
    val_loss: float | None
    wall_s: float | None
    steps: int | None
    node: str | None
    host: str | None
    global_batch_size: int | None
    setup_s: float | None
    # Where and when it ran: its pool slot and that slot's clock (seconds since the epoch).
    slot: int | None
    pid: int | None
    began_at: float | None
    ended_at: float | None
    curve: list[CurvePoint]


class TrialResult(_Strict):
    """One configuration: its swept values, its score over its runs, and the runs."""

    id: str
    number: int
    params: dict[str, Any]
    status: Literal["pending", "running", "completed", "failed", "pruned"]
    metric: float | None
    metric_std: float | None  # over k folds; None for one run or an ensemble
    values: list[float]  # each completed run's metric
    ensemble: EnsembleScore | None
    stopped_at: StoppedAt | None
    wall_s: float
    global_batch_size: int | None
    setup_s: float
    error: str | None
    progress: float  # fraction of its runs' steps done
    runs_done: int
    running: list[str]
    runs: list[RunResult]


class Counts(_Strict):
    """Trials by status; `pending` counts the ones the search has yet to draw."""

    completed: int
    failed: int
    pruned: int
    running: int
    pending: int


class SlotGaps(_Strict):
    """Seconds between one run's end and the next one's start in the same pool slot."""

    median: float
    max: float
    count: int


class Best(_Strict):
    id: str
    params: dict[str, Any]
    metric: float
    metric_std: float | None
    ensemble: EnsembleScore | None
    spec: str  # best.yaml: the best trial as a spec to train


class SweepResult(_Strict):
    """A sweep's results, in results.json's key order."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: str = Field(SWEEP_SCHEMA, alias="schema")
    name: str
    out_dir: str
    search: Literal["grid", "random", "tpe", "none"]
    trials: list[TrialResult]
    runs_per_trial: int
    evaluation: Evaluation
    metric: Literal["val_accuracy", "val_loss"]
    params: list[str]  # the swept fields' paths
    slots: int
    cpus_per_trial: float
    cluster: str
    resumed_trials: int
    early_stopping: str | None  # its rule
    spec_path: str
    status: Literal["running", "completed", "interrupted"]
    started_at: str
    updated_at: str
    wall_s: float
    maximize: bool
    counts: Counts
    slot_gaps_s: SlotGaps | None
    best: Best | None
    # Once the sweep ended (a results.json written while it runs, or after it was interrupted,
    # has neither): its plots' paths, and one line when no trial completed.
    plots: list[str] | None = None
    failure: str | None = None

    def to_json(self) -> dict:
        absent = {key for key in ("plots", "failure") if key not in self.model_fields_set}
        return self.model_dump(mode="json", by_alias=True, exclude=absent)
