"""What a sweep's runs add up to: each trial's score (mean ± std over folds, or its ensemble's
accuracy), the best trial, and the files a person or a script reads: results.json, results.csv,
best.yaml. Plots are drawn from the same results by sweep.plots."""

from __future__ import annotations

import csv
import io
import itertools
import statistics
from pathlib import Path
from typing import Any

import torch
import yaml

from dlscale.atomic import write_atomic, write_json_atomic
from dlscale.jobspec import SweepSpec
from dlscale.sweep.space import describe, show
from dlscale.sweep.trial import load_predictions

SCHEMA = "dlscale.sweep/1"
FINAL = ("completed", "failed", "pruned", "skipped")


def trial_status(statuses: list[str]) -> str:
    """A trial is as good as its worst run: one failure fails it, one stop stops it."""
    if any(s == "failed" for s in statuses):
        return "failed"
    if any(s == "pruned" for s in statuses):
        return "pruned"
    if all(s == "completed" for s in statuses):
        return "completed"
    if any(s in ("running", *FINAL) for s in statuses):
        return "running"
    return "pending"


def summarize(sweep: SweepSpec, runs: list[dict]) -> dict[str, Any]:
    """A finished trial's score from its runs' records (name, status, figures, run_dir)."""
    status = trial_status([run["status"] for run in runs])
    values = [run[sweep.metric] for run in runs if run["status"] == "completed"]
    summary: dict[str, Any] = {
        "status": status,
        "metric": None,
        "metric_std": None,
        "values": values,
        "wall_s": sum(run.get("wall_s") or 0.0 for run in runs),
        "error": next(
            (f"{r['name']}: {r['error']}" for r in runs if r["status"] == "failed"), None
        ),
    }
    if status == "pruned":
        stopped = next(run for run in runs if run["status"] == "pruned" and run.get("curve"))
        summary["stopped_at"] = {"run": stopped["name"], **stopped["curve"][-1]}
    if status != "completed":
        return summary
    if sweep.ensemble:
        summary["ensemble"] = ensemble_scores([Path(run["run_dir"]) for run in runs])
        summary["ensemble"]["members"] = values
        summary["metric"] = summary["ensemble"][sweep.metric]
    else:
        summary["metric"] = statistics.fmean(values)
        summary["metric_std"] = statistics.pstdev(values) if len(values) > 1 else None
    return summary


def ensemble_scores(run_dirs: list[Path]) -> dict[str, float]:
    """Accuracy and loss of the members' averaged class probabilities on their shared
    validation set."""
    probabilities, labels = zip(*(load_predictions(d) for d in run_dirs), strict=True)
    for other in labels[1:]:
        if not torch.equal(other, labels[0]):
            raise RuntimeError("ensemble members were scored on different validation sets")
    mean = torch.stack(probabilities).mean(dim=0)
    target = labels[0]
    picked = mean.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return {
        "val_accuracy": float((mean.argmax(dim=-1) == target).float().mean()),
        "val_loss": float(-picked.clamp_min(1e-12).log().mean()),
    }


def best_trial(trials: list[dict], maximize: bool) -> dict | None:
    scored = [t for t in trials if t["status"] == "completed" and t["metric"] is not None]
    if not scored:
        return None
    pick = max if maximize else min
    return pick(scored, key=lambda t: t["metric"])


def failure_summary(result: dict) -> str | None:
    """One line when a finished sweep has no completed trial (the CLI then exits 1): how its
    trials ended, and the first failure's error with how many trials share it."""
    trials = result["trials"]
    if not trials or any(t["status"] == "completed" for t in trials):
        return None
    ended = {status: sum(t["status"] == status for t in trials) for status in ("failed", "pruned")}
    how = f"{ended['failed']} of {len(trials)} trials failed"
    if ended["pruned"]:
        how += f", {ended['pruned']} stopped early"
    errors = [t["error"] for t in trials if t["status"] == "failed" and t["error"]]
    if not errors:
        return f"no trial completed: {how}"
    first = next(t for t in trials if t["error"] == errors[0])
    same = errors.count(errors[0]) - 1
    others = len(errors) - 1 - same
    more = [f"{same} more failed the same way"] if same else []
    more += [f"{others} failed otherwise (every error is in results.csv)"] if others else []
    return "; ".join([f"no trial completed: {how}", f"{first['id']}: {errors[0]}", *more])


def write_csv(path: Path, result: dict) -> None:
    """One row per trial: its swept values, status, score and time."""
    params = result["params"]
    columns = [
        "trial",
        *params,
        "status",
        result["metric"],
        f"{result['metric']}_std",
        "runs",
        "wall_s",
        "error",
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for trial in result["trials"]:
        writer.writerow(
            [
                trial["id"],
                *(trial["params"].get(p) for p in params),
                trial["status"],
                trial["metric"],
                trial["metric_std"],
                len(trial["runs"]),
                round(trial["wall_s"], 3),
                trial["error"] or "",
            ]
        )
    write_atomic(path, lambda handle: handle.write(buffer.getvalue().encode()))


def write_best_spec(path: Path, raw: dict, trial: dict, result: dict) -> None:
    """The best trial as a spec `dlscale train` runs as it is (its sweep section removed)."""
    score = f"{result['metric']} {show(trial['metric'])}"
    how = {
        "kfold": f" (mean of {len(trial['runs'])} folds; it trains here on all the training data)",
        "ensemble": f" (ensemble of {len(trial['runs'])} seeds from seed {raw.get('seed', 0)}; "
        "this spec trains one of them)",
    }.get(result["evaluation"]["kind"], "")
    header = (
        f"# Best of sweep '{result['name']}' ({result['out_dir']}): trial {trial['id']}, "
        f"{describe(trial['params'])}\n# {score}{how}\n"
    )
    text = header + yaml.safe_dump(raw, sort_keys=False)
    write_atomic(path, lambda handle: handle.write(text.encode()))


def write_results(out_dir: Path, result: dict) -> None:
    write_json_atomic(out_dir / "results.json", result)
    write_csv(out_dir / "results.csv", result)


def slot_gaps(runs: list[dict]) -> dict | None:
    """Seconds from one run's end to the next one's start in the same pool slot (what a slot
    spends between trials): their median and largest, or None where no slot ran two."""
    by_slot: dict[int, list[dict]] = {}
    for run in runs:
        if run.get("slot") is not None and run.get("began_at") is not None:
            by_slot.setdefault(run["slot"], []).append(run)
    gaps = []
    for ran in by_slot.values():
        ran.sort(key=lambda run: run["began_at"])
        gaps += [b["began_at"] - a["ended_at"] for a, b in itertools.pairwise(ran)]
    if not gaps:
        return None
    gaps.sort()
    return {"median": gaps[len(gaps) // 2], "max": gaps[-1], "count": len(gaps)}
