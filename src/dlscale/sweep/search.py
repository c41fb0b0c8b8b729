"""Where the configurations come from, and which runs stop early.

The search algorithms are Optuna's (RandomSampler, TPESampler) and so are the early-stopping
rules (MedianPruner, SuccessiveHalvingPruner), driven through its ask-and-tell interface: the
sweep runs the trials itself, on its own launcher, and only asks Optuna what to try next and
whether a run should stop. A grid needs no library: it is every combination, in order.
"""

from __future__ import annotations

import warnings
from typing import Any

from dlscale.jobspec import Distribution, EarlyStoppingSpec, SearchSpec


class GridSearch:
    """The configurations are the grid's points, in order."""

    def __init__(self, points: list[dict[str, Any]]):
        self.points = points

    def next_params(self, number: int) -> dict[str, Any] | None:
        return self.points[number] if number < len(self.points) else None

    def restore(self, number: int, params: dict, status: str | None, value: float | None) -> bool:
        """Whether a configuration found on disk is this grid's point `number`."""
        return number < len(self.points) and self.points[number] == params

    def tell(self, number: int, status: str, value: float | None) -> None:
        pass


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def optuna_distribution(dist: Distribution):
    optuna = _optuna()
    kind = dist.kind
    if kind == "log_uniform":
        return optuna.distributions.FloatDistribution(*dist.log_uniform, log=True)
    if kind == "uniform":
        return optuna.distributions.FloatDistribution(*dist.uniform)
    if kind == "int_range":
        return optuna.distributions.IntDistribution(*dist.int_range)
    return optuna.distributions.CategoricalDistribution(dist.choice)


def _state(status: str):
    states = _optuna().trial.TrialState
    return {"completed": states.COMPLETE, "pruned": states.PRUNED}.get(status, states.FAIL)


def _end(study, trial, status: str, value: float | None) -> None:
    """Tell `study` how `trial` ended: its value if it completed, else its state."""
    if trial is None:
        return
    if status == "completed" and value is not None:
        study.tell(trial, value)
    else:
        study.tell(trial, state=_state(status))


def _add_past(study, status: str, value: float | None, **fields) -> None:
    """Record a trial that ended before an interruption, as if this study had run it."""
    trial = _optuna().trial.create_trial(
        value=value if status == "completed" else None, state=_state(status), **fields
    )
    study.add_trial(trial)


class OptunaSearch:
    """`random` or `tpe`: Optuna draws each configuration when a slot is free; each finished
    configuration's metric is told back. TPE runs with the constant liar, so configurations
    drawn while others still run are not drawn on top of them."""

    def __init__(self, kind: str, search: SearchSpec, maximize: bool, seed: int):
        optuna = _optuna()
        self.distributions = {path: optuna_distribution(d) for path, d in search.space.items()}
        self.trials_budget = search.trials
        if kind == "tpe":
            startup = min(10, max(2, search.trials // 3))  # random draws before TPE models
            sampler = optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=startup, constant_liar=True
            )
        else:
            sampler = optuna.samplers.RandomSampler(seed=seed)
        direction = "maximize" if maximize else "minimize"
        self.study = optuna.create_study(direction=direction, sampler=sampler)
        # Where a resumed sweep replays the interrupted one's draws (see `restore`).
        self.replay = optuna.create_study(direction=direction, sampler=sampler)
        self.trials: dict[int, Any] = {}

    def next_params(self, number: int) -> dict[str, Any] | None:
        if number >= self.trials_budget:
            return None
        trial = self.study.ask(self.distributions)
        self.trials[number] = trial
        return {path: trial.params[path] for path in self.distributions}

    def restore(self, number: int, params: dict, status: str | None, value: float | None) -> bool:
        """Tell Optuna about a configuration from an interrupted sweep: a finished one as a past
        trial, an unfinished one as the next trial it hands out (so it runs with those params).

        The seeded sampler draws once more for each, on a study of its own, as the interrupted
        sweep drew it: the trials drawn after the resume are those an uninterrupted sweep would
        have drawn next, not the seed's first ones again (a random sweep's exactly; TPE's past
        its random start models the restored trials)."""
        if set(params) != set(self.distributions):
            return False
        self.replay.ask(self.distributions)
        if status is None:
            self.study.enqueue_trial(params)
            self.trials[number] = self.study.ask(self.distributions)
            return True
        _add_past(self.study, status, value, params=params, distributions=self.distributions)
        return True

    def tell(self, number: int, status: str, value: float | None) -> None:
        _end(self.study, self.trials.pop(number, None), status, value)


class EarlyStopping:
    """Optuna's pruners over the runs' validation curves: each run is a trial of a study of
    its own, reporting its metric at every epoch end; the pruner says whether to stop it."""

    def __init__(self, spec: EarlyStoppingSpec, maximize: bool):
        optuna = _optuna()
        if spec.rule == "median":
            pruner = optuna.pruners.MedianPruner(
                n_startup_trials=spec.min_runs, n_warmup_steps=spec.warmup_epochs
            )
        else:
            pruner = optuna.pruners.SuccessiveHalvingPruner(
                min_resource=spec.min_epochs, reduction_factor=spec.reduction_factor
            )
        direction = "maximize" if maximize else "minimize"
        self.study = optuna.create_study(direction=direction, pruner=pruner)
        self.trials: dict[str, Any] = {}

    def report(self, key: str, epoch: int, value: float) -> bool:
        """Record a run's metric after `epoch`; True if the run should stop now."""
        trial = self.trials.get(key)
        if trial is None:
            trial = self.trials[key] = self.study.ask()
        trial.report(value, epoch)
        return trial.should_prune()

    def finish(self, key: str, status: str, value: float | None) -> None:
        _end(self.study, self.trials.pop(key, None), status, value)

    def restore(self, status: str, curve: list[tuple[int, float]], value: float | None) -> None:
        """A run finished before an interruption: its curve counts for the runs still to come."""
        _add_past(self.study, status, value, intermediate_values=dict(curve))
