"""The `sweep` section: grid, random or TPE search, k-fold, ensembles, early stopping."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from dlscale.jobspec.base import Strict

MAX_RUNS = 10_000  # trainings in one sweep: trials × folds (or ensemble members)


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
        given = [
            key
            for key in ("log_uniform", "uniform", "int_range", "choice")
            if getattr(self, key) is not None
        ]
        if len(given) != 1:
            raise ValueError("give exactly one of log_uniform, uniform, int, choice")
        bounds = self.log_uniform or self.uniform or self.int_range
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"the range [{bounds[0]}, {bounds[1]}] is empty: low < high needed")
        return self

    @property
    def kind(self) -> str:
        return next(
            key
            for key in ("log_uniform", "uniform", "int_range", "choice")
            if getattr(self, key) is not None
        )


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
        self._check_size()
        return self

    def _check_size(self) -> None:
        """A sweep's every trial is written to disk and shown; millions would take days to
        train and gigabytes to record, so the count is refused before anything starts."""
        each = self.kfold or self.ensemble or 1
        runs = self.trials * each
        if runs <= MAX_RUNS:
            return
        count = f"{self.trials} trials"
        if self.grid is not None and len(self.grid) > 1:
            count = " × ".join(str(len(values)) for values in self.grid.values()) + f" = {count}"
        if each > 1:
            unit = "folds" if self.kfold else "members"
            count = (
                f"{count} × {each} {unit} = {runs} runs"
                if self.trials > 1
                else f"{runs} runs ({'kfold' if self.kfold else 'ensemble'}: {each})"
            )
        raise ValueError(
            f"{count}: a sweep trains at most {MAX_RUNS} runs (narrow the grid, sample it with "
            "random or tpe and fewer trials, or lower kfold/ensemble)"
        )

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
