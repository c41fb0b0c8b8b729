"""A sweep's trials and their runs, as data; and the search a sweep draws its trials from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.errors import one_line
from dlscale.jobspec import Spec
from dlscale.sweep import results as res
from dlscale.sweep.search import GridSearch, OptunaSearch
from dlscale.sweep.space import RunUnit, grid_points


@dataclass
class Run:
    key: str  # "t003/fold-1"
    unit: RunUnit
    raw: dict
    dir: Path
    status: str = "pending"  # pending | running | completed | failed | pruned | skipped
    result: dict = field(default_factory=dict)
    error: str | None = None
    curve: list[dict] = field(default_factory=list)
    step: int = 0
    total_steps: int | None = None

    @property
    def finished(self) -> bool:
        return self.status in res.FINAL

    def record(self) -> dict:
        return {
            "name": self.unit.name,
            "status": self.status,
            "run_dir": str(self.dir),
            "error": self.error,
            "val_accuracy": self.result.get("val_accuracy"),
            "val_loss": self.result.get("val_loss"),
            "wall_s": self.result.get("wall_s"),
            "steps": self.result.get("steps"),
            "node": self.result.get("node"),
            "host": self.result.get("host"),
            "global_batch_size": self.result.get("global_batch_size"),
            "setup_s": self.result.get("setup_s"),
            # Where and when it ran: its pool slot and that slot's clock (seconds since epoch).
            "slot": self.result.get("slot"),
            "pid": self.result.get("pid"),
            "began_at": self.result.get("began_at"),
            "ended_at": self.result.get("ended_at"),
            "curve": self.curve,
        }

    def progress(self) -> float:
        if self.status == "completed":
            return 1.0
        return self.step / self.total_steps if self.total_steps else 0.0


@dataclass
class Trial:
    id: str  # "t003"
    number: int
    params: dict[str, Any]
    raw: dict  # the configuration's spec (no sweep section, no fold)
    runs: list[Run]
    summary: dict | None = None

    @property
    def status(self) -> str:
        return (
            self.summary["status"]
            if self.summary
            else res.trial_status([run.status for run in self.runs])
        )

    def row(self) -> dict:
        """The trial as results.json shows it."""
        summary = self.summary or {}
        running = [run for run in self.runs if run.status == "running"]
        return {
            "id": self.id,
            "number": self.number,
            "params": self.params,
            "status": self.status,
            "metric": summary.get("metric"),
            "metric_std": summary.get("metric_std"),
            "values": summary.get("values", []),
            "ensemble": summary.get("ensemble"),
            "stopped_at": summary.get("stopped_at"),
            "wall_s": summary.get("wall_s", 0.0),
            "global_batch_size": next(
                (
                    r.result.get("global_batch_size")
                    for r in self.runs
                    if r.result.get("global_batch_size")
                ),
                None,
            ),
            "setup_s": sum(r.result.get("setup_s") or 0.0 for r in self.runs),
            "error": summary.get("error"),
            "progress": sum(run.progress() for run in self.runs) / len(self.runs),
            "runs_done": sum(run.finished for run in self.runs),
            "running": [run.unit.name for run in running],
            "runs": [run.record() for run in self.runs],
        }


def search_kind(sweep) -> str:
    for kind in ("grid", "random", "tpe"):
        if getattr(sweep, kind) is not None:
            return kind
    return "none"


def make_search(spec: Spec):
    sweep = spec.sweep
    if sweep.grid is not None:
        return GridSearch(grid_points(sweep.grid))
    if sweep.search is not None:
        return OptunaSearch(search_kind(sweep), sweep.search, sweep.maximize, spec.seed)
    return GridSearch([{}])  # no search: the spec itself, scored by kfold or ensemble


def evaluation(sweep) -> dict:
    """How each configuration is scored: one holdout run, k folds, or an ensemble."""
    if sweep.kfold:
        return {"kind": "kfold", "folds": sweep.kfold}
    if sweep.ensemble:
        return {"kind": "ensemble", "members": sweep.ensemble}
    return {"kind": "holdout"}


def summarize(sweep, trial: Trial) -> dict:
    """The trial's score; one that cannot be computed (an ensemble member's predictions
    missing or unreadable) fails this trial, not the sweep."""
    runs = [run.record() for run in trial.runs]
    try:
        return res.summarize(sweep, runs)
    except (OSError, RuntimeError, KeyError) as exc:
        wall = sum(run.get("wall_s") or 0.0 for run in runs)
        return {
            "status": "failed",
            "metric": None,
            "metric_std": None,
            "values": [],
            "wall_s": wall,
            "error": f"scoring failed: {one_line(exc)}",
        }
