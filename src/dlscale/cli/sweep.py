"""`dlscale sweep`: the live trial table while a sweep runs, then the best trial and its files."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from dlscale import api
from dlscale.cli.errors import user_errors
from dlscale.errors import UserError
from dlscale.tables import output_console

MAX_ROWS = 24  # a longer sweep shows its running trials and the best finished ones
STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "pruned": "yellow",
    "running": "cyan",
    "pending": "dim",
}


def score(trial: dict, metric: str) -> str:
    """'97.2% ± 0.8' for accuracies, '0.1234 ± 0.0100' for losses; '-' when there is none."""
    value, std = trial["metric"], trial["metric_std"]
    if value is None:
        stopped = trial.get("stopped_at")
        if stopped and stopped.get(metric) is not None:
            return f"({_fmt(stopped[metric], metric)} at epoch {stopped['epoch']})"
        return "-"
    text = _fmt(value, metric)
    if std is not None:
        text += f" ± {_fmt(std, metric, sign=False)}"
    members = (trial.get("ensemble") or {}).get("members")
    if members:
        text += f" (members {_fmt(min(members), metric)}–{_fmt(max(members), metric)})"
    return text


def _fmt(value: float, metric: str, sign: bool = True) -> str:
    if metric == "val_accuracy":
        return f"{100 * value:.1f}%" if sign else f"{100 * value:.1f}"
    return f"{value:.4f}"


def status_text(trial: dict, runs_per_trial: int) -> str:
    status = trial["status"]
    if status == "running":
        text = f"running {100 * trial['progress']:.0f}%"
        if runs_per_trial > 1:
            text += f" ({trial['runs_done']}/{runs_per_trial} runs)"
        return text
    return status


def shown_trials(result: dict) -> list[dict]:
    trials = result["trials"]
    if len(trials) <= MAX_ROWS:
        return trials
    running = [t for t in trials if t["status"] == "running"]
    done = [t for t in trials if t["metric"] is not None]
    done.sort(key=lambda t: t["metric"], reverse=result["maximize"])
    keep = {t["id"] for t in running + done[: max(5, MAX_ROWS - len(running))]}
    return [t for t in trials if t["id"] in keep]


def trial_table(result: dict) -> Table:
    metric = result["metric"]
    runs = result["runs_per_trial"]
    counts = result["counts"]
    title = (
        f"{result['name']}: {result['search']} sweep · {counts['completed']} done, "
        f"{counts['running']} running, {counts['pending']} to go"
        + (f", {counts['failed']} failed" if counts["failed"] else "")
        + (f", {counts['pruned']} stopped early" if counts["pruned"] else "")
    )
    table = Table(title=title, title_justify="left")
    table.add_column("trial", style="bold")
    for path in result["params"]:
        table.add_column(path, justify="right")
    table.add_column("status")
    how = {"kfold": f" (mean ± std, {runs} folds)", "ensemble": f" (ensemble of {runs})"}
    table.add_column(
        metric.replace("_", " ") + how.get(result["evaluation"]["kind"], ""), justify="right"
    )
    table.add_column("time", justify="right")
    best = (result["best"] or {}).get("id")
    for trial in shown_trials(result):
        style = STATUS_STYLE.get(trial["status"], "")
        marker = " ★" if trial["id"] == best else ""
        table.add_row(
            trial["id"] + marker,
            *(api.show_value(trial["params"].get(p)) for p in result["params"]),
            f"[{style}]{escape(status_text(trial, runs))}[/]",
            score(trial, metric),
            f"{trial['wall_s']:.1f} s" if trial["wall_s"] else "",
        )
    hidden = len(result["trials"]) - len(shown_trials(result))
    if hidden:
        table.caption = f"{hidden} more trial(s) in results.csv"
    return table


class RichSweepReporter:
    """The live table on a terminal; a line per finished trial either way (logs, pipes)."""

    def __init__(self, console: Console):
        self.console = console
        self.live: Live | None = None
        self.metric = "val_accuracy"

    def start(self, info: dict) -> None:
        self.metric = info["metric"]
        evaluation = info["evaluation"]
        each = {
            "kfold": f" × {evaluation.get('folds')} folds",
            "ensemble": f" × {evaluation.get('members')} members",
        }
        resumed = (
            f"; resuming, {info['resumed_trials']} trial(s) already done"
            if (info["resumed_trials"])
            else ""
        )
        stopping = f"; early stopping: {info['early_stopping']}" if info["early_stopping"] else ""
        self.console.print(
            f"[bold]{info['name']}[/]: {info['search']} sweep of {info['trials']} trial(s)"
            f"{each.get(evaluation['kind'], '')}, {info['slots']} at a time on {info['cluster']} "
            f"({info['cpus_per_trial']:g} process(es) each){stopping}{resumed}; "
            f"{escape(info['out_dir'])}"
        )
        self.live = Live(console=self.console, refresh_per_second=2, transient=True)
        self.live.start()

    def update(self, result: dict) -> None:
        if self.live is not None:
            self.live.update(trial_table(result))

    def trial_done(self, trial: dict) -> None:
        params = " ".join(f"{p}={api.show_value(v)}" for p, v in trial["params"].items())
        line = f"{trial['id']} {escape(params)}: {trial['status']}"
        if trial["metric"] is not None:
            line += f", {self.metric.replace('_', ' ')} {score(trial, self.metric)}"
        if trial["error"]:
            line += f" ([red]{escape(trial['error'])}[/])"
        line += f" in {trial['wall_s']:.1f} s"
        target = self.live.console if self.live else self.console
        target.print(line)

    def warn(self, message: str) -> None:
        target = self.live.console if self.live else self.console
        target.print(f"[bold yellow]warning:[/] {escape(message)}")

    def finish(self, result: dict) -> None:
        self.close()
        self.console.print(trial_table(result))
        best = result["best"]
        if best is None:
            if not result.get("failure"):  # a failure has an error line of its own, last
                self.console.print("[bold red]no trial completed[/]: see the errors above")
        else:
            params = " ".join(f"{p}={api.show_value(v)}" for p, v in best["params"].items())
            self.console.print(
                f"best: {best['id']} {escape(params)} → {score(best, self.metric)}"
                f"; ready to run: dlscale train {escape(best['spec'])}"
            )
        files = ["results.json", "results.csv", *(Path(p).name for p in result["plots"])]
        self.console.print(f"wrote {escape(result['out_dir'])}/{{{', '.join(files)}}}")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


@user_errors
def sweep(
    spec: Path = typer.Argument(..., help="Job spec (YAML) with a sweep: section."),
    parallel: int | None = typer.Option(
        None, "--parallel", help="Trials at once (default: as many as the free cores/GPUs hold)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Sweep folder (default runs/sweep-<name>-<timestamp>)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an interrupted sweep (of --out, or the newest one)."
    ),
    cluster: str = typer.Option("local", "--cluster", help="local processes, or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
) -> None:
    """Train many configurations of a spec: grid, random or TPE search, k-fold, ensembles."""
    console = output_console(stderr=as_json)
    reporter = RichSweepReporter(console)
    try:
        result = api.sweep(spec, out, parallel, resume, reporter, cluster, address)
    finally:
        reporter.close()
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    if result.failure:  # trials ran, and every one failed: exit 1 (bad input is 2)
        raise UserError(result.failure, exit_code=1)
