"""Sweep spaces as pure functions: field paths, grid points, the runs of a configuration, and
the spec each run trains. Specs here are raw mappings (as parsed from YAML); the caller
validates what comes out, so a bad path or value is the spec's own one-line error."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import UserError
from dlscale.jobspec import Spec, SweepSpec


def set_path(raw: dict, path: str, value: Any) -> dict:
    """A copy of `raw` with the field at dotted `path` set to `value` (missing levels created)."""
    out = copy.deepcopy(raw)
    node = out
    parts = path.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise UserError(f"sweep: '{path}' goes through '{where}', which is not a section")
        node = child
    node[parts[-1]] = value
    return out


def get_path(raw: dict, path: str, default: Any = None) -> Any:
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination, the last path varying fastest (as nested loops in the order given)."""
    paths = list(grid)
    return [dict(zip(paths, values, strict=True)) for values in itertools.product(*grid.values())]


@dataclass(frozen=True)
class RunUnit:
    """One training of a configuration: the whole of it, one of its folds, or one member."""

    kind: str  # "train" | "fold" | "member"
    index: int = 0
    count: int = 1  # folds, or members

    @property
    def name(self) -> str:
        return "train" if self.kind == "train" else f"{self.kind}-{self.index}"


def run_units(sweep: SweepSpec) -> list[RunUnit]:
    if sweep.kfold:
        return [RunUnit("fold", i, sweep.kfold) for i in range(sweep.kfold)]
    if sweep.ensemble:
        return [RunUnit("member", m, sweep.ensemble) for m in range(sweep.ensemble)]
    return [RunUnit("train")]


def config_raw(base: dict, params: dict[str, Any]) -> dict:
    """The spec of one configuration: the sweep's own spec, its section removed, params set."""
    raw = {key: value for key, value in base.items() if key != "sweep"}
    for path, value in params.items():
        raw = set_path(raw, path, value)
    return raw


def run_raw(config: dict, unit: RunUnit) -> dict:
    """The spec one run trains. A fold sets `data.fold`; a member `m` trains with seed + m but
    keeps the configuration's data seed, so every member is scored on the same validation set."""
    if unit.kind == "fold":
        return set_path(config, "data.fold", {"folds": unit.count, "index": unit.index})
    if unit.kind == "member":
        seed = int(config.get("seed", 0))
        raw = set_path(config, "seed", seed + unit.index)
        data_seed = get_path(config, "data.seed")
        return set_path(raw, "data.seed", seed if data_seed is None else data_seed)
    return copy.deepcopy(config)


def portable(raw: dict, spec: Spec) -> dict:
    """`raw` with the data section's file paths made absolute (as `spec` resolved them), so the
    written spec runs from any folder."""
    out = copy.deepcopy(raw)
    for field, value in spec.data:
        if isinstance(value, Path):
            out["data"][field] = str(value)
        elif isinstance(value, list) and value and all(isinstance(v, Path) for v in value):
            out["data"][field] = [str(v) for v in value]
    return out


def describe(params: dict[str, Any]) -> str:
    """'optimizer.lr=0.01 model.kwargs.hidden=64': how a configuration is named in messages."""
    return " ".join(f"{path}={show(value)}" for path, value in params.items()) or "(the spec)"


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def probe_points(sweep: SweepSpec) -> list[dict[str, Any]]:
    """The configurations checked before a sweep starts: every grid point; for a sampled
    search, each range's two ends and every choice (the other fields at their first)."""
    if sweep.grid is not None:
        return grid_points(sweep.grid)
    if sweep.search is None:
        return [{}]
    candidates = {}
    for path, dist in sweep.search.space.items():
        bounds = dist.log_uniform or dist.uniform or dist.int_range
        candidates[path] = list(bounds) if bounds is not None else list(dist.choice)
    first = {path: values[0] for path, values in candidates.items()}
    return [{**first, path: value} for path, values in candidates.items() for value in values]


def check_space(spec: Spec, base: dict, base_dir: Path | None, source: str) -> list[Spec]:
    """Validate the runs a sweep will train (see probe_points) before any starts; a bad path or
    value is one line naming the configuration, as are more folds than the data has samples.
    Returns the validated specs."""
    from dlscale.jobspec import parse_spec
    from dlscale.models import check_model
    from dlscale.sweep.folds import check_folds

    checked = []
    units = run_units(spec.sweep)
    for params in probe_points(spec.sweep):
        where = f"{source}: sweep trial {describe(params)}"
        run = parse_spec(run_raw(config_raw(base, params), units[0]), base_dir, where)
        try:
            check_model(run.model.name, run.model.kwargs)
        except UserError as exc:
            raise UserError(f"{where}: model: {exc}") from None
        checked.append(run)
        if len(units) > 1:  # the last member trains with the largest seed: still in range?
            last = units[-1]
            parse_spec(run_raw(config_raw(base, params), last), base_dir, f"{where}, {last.name}")
    check_folds(checked, source)
    return checked
