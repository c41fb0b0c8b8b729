"""A sweep's plots: the metric of every trial, the metric against each swept value, and the
spread over folds (k-fold) or members (ensemble). Drawn on bare Agg figures (no pyplot)."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dlscale.atomic import write_atomic
from dlscale.sweep.space import show

STATUS_COLOURS = {"completed": "tab:blue", "pruned": "tab:orange", "failed": "tab:red"}


def write_plots(result: dict, out_dir: Path) -> list[Path]:
    """trials.png, params.png (when values were swept), and kfold.png or ensemble.png."""
    plots = [("trials", plot_trials)]
    if result["params"]:
        plots.append(("params", plot_params))
    kind = result["evaluation"]["kind"]
    if kind in ("kfold", "ensemble"):
        plots.append((kind, plot_spread))
    written = []
    for name, draw in plots:
        figure = Figure(figsize=(9, 5.5), layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure, result)
        path = Path(out_dir) / f"{name}.png"
        write_atomic(path, lambda handle, f=figure: f.savefig(handle, format="png", dpi=110))
        written.append(path)
    return written


def _label(result: dict) -> str:
    return result["metric"].replace("_", " ")


def plot_trials(figure: Figure, result: dict) -> None:
    """Metric per trial in the order they were drawn, ± std over folds, the best so far."""
    axes = figure.add_subplot()
    metric = result["metric"]
    best_so_far, best = [], None
    pick = max if result["maximize"] else min
    for trial in result["trials"]:
        value = trial["metric"]
        if trial["status"] == "pruned" and trial.get("stopped_at"):
            value = trial["stopped_at"].get(metric)
        if value is None:
            continue
        colour = STATUS_COLOURS.get(trial["status"], "grey")
        axes.errorbar(
            trial["number"], value, yerr=trial["metric_std"] or 0, fmt="o", color=colour, capsize=3
        )
        if trial["status"] == "completed":
            best = value if best is None else pick(best, value)
            best_so_far.append((trial["number"], best))
    if best_so_far:
        xs, ys = zip(*best_so_far, strict=True)
        axes.step(xs, ys, where="post", color="tab:green", label="best so far")
    for status, colour in STATUS_COLOURS.items():
        if any(t["status"] == status for t in result["trials"]):
            axes.plot([], [], "o", color=colour, label=status)
    failed = sum(t["status"] == "failed" for t in result["trials"])
    axes.set_xlabel("trial" + (f" ({failed} failed, not shown)" if failed else ""))
    axes.set_ylabel(_label(result))
    axes.legend(fontsize=8)
    best_trial = result["best"]
    title = f"{result['name']}: {result['search']} sweep, {len(result['trials'])} trials"
    if best_trial:
        title += f"; best {best_trial['id']} {metric} {show(best_trial['metric'])}"
    axes.set_title(title, fontsize=10)


def plot_params(figure: Figure, result: dict) -> None:
    """One panel per swept field: the metric of each completed trial against its value."""
    params = result["params"]
    columns = min(3, len(params))
    rows = math.ceil(len(params) / columns)
    done = [t for t in result["trials"] if t["status"] == "completed"]
    for index, path in enumerate(params):
        axes = figure.add_subplot(rows, columns, index + 1)
        values = [t["params"][path] for t in done]
        metrics = [t["metric"] for t in done]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if numeric and values:
            axes.scatter(values, metrics)
            positive = [v for v in values if v > 0]
            if len(positive) == len(values) and max(values) / min(values) >= 20:
                axes.set_xscale("log")
        else:
            labels = list(dict.fromkeys(show(v) for v in values))
            axes.scatter([labels.index(show(v)) for v in values], metrics)
            axes.set_xticks(range(len(labels)), labels)
        axes.set_xlabel(path)
        axes.set_ylabel(_label(result))
    figure.suptitle(f"{result['name']}: {result['metric']} against each swept value", fontsize=10)


def plot_spread(figure: Figure, result: dict) -> None:
    """k-fold: a box of the fold scores per trial. Ensemble: the members' scores as a box, the
    averaged predictions' score as a star."""
    axes = figure.add_subplot()
    done = [t for t in result["trials"] if t["status"] == "completed" and t["values"]]
    kind = result["evaluation"]["kind"]
    if done:
        axes.boxplot([t["values"] for t in done], tick_labels=[t["id"] for t in done])
        if kind == "ensemble":
            metric = result["metric"]
            axes.plot(
                range(1, len(done) + 1),
                [t["ensemble"][metric] for t in done],
                "*",
                color="tab:red",
                markersize=12,
                label="ensemble (averaged predictions)",
            )
            axes.legend(fontsize=8)
    axes.set_xlabel("trial")
    axes.set_ylabel(_label(result))
    if kind == "kfold":
        title = f"{result['name']}: {result['evaluation']['folds']}-fold cross-validation"
    else:
        title = f"{result['name']}: ensembles of {result['evaluation']['members']} members"
    axes.set_title(title, fontsize=10)
