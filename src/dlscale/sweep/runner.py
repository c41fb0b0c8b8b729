"""The sweep runner: trials from a search, their runs on a launcher's task pool, and every
result on disk the moment it is known, so an interrupted sweep resumes where it stopped.

Layout of a sweep folder:
    sweep.json                   which spec this folder belongs to (its hash)
    trials/t003/trial.json       a trial's swept values, written before any of its runs starts
    trials/t003/fold-1/          a run folder (run.json, checkpoints), plus result.json once it
                                 ended: completed, failed (with the error), pruned or skipped
    results.json, results.csv    every trial so far; rewritten as each trial ends
    best.yaml                    the best trial as a ready-to-run spec
    *.png                        plots, drawn at the end
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError
from dlscale.jobspec import Spec, parse_spec
from dlscale.launch.base import Launcher, Resources, TaskDone
from dlscale.sweep import results as res
from dlscale.sweep.record import SweepResult
from dlscale.sweep.resume import open_folder, restore_run, saved_trials
from dlscale.sweep.search import EarlyStopping, GridSearch
from dlscale.sweep.space import config_raw, describe, portable, run_raw
from dlscale.sweep.space import run_units as units_of
from dlscale.sweep.trial import CURVE_KEYS, run_trial
from dlscale.sweep.trials import Run, Trial, evaluation, make_search, search_kind, summarize

POLL_S = 0.2
UPDATE_EVERY_S = 0.5  # the live table is redrawn at most this often


class SweepRunner:
    def __init__(
        self,
        spec: Spec,
        base_raw: dict,
        base_dir: Path,
        spec_path: str,
        out_dir: Path,
        launcher: Launcher,
        slots: int,
        resources: Resources,
        reporter,
        resume: bool = False,
    ):
        self.spec, self.sweep = spec, spec.sweep
        self.base_raw, self.base_dir, self.spec_path = base_raw, base_dir, spec_path
        self.out_dir = Path(out_dir)
        self.launcher, self.slots, self.resources = launcher, slots, resources
        self.reporter, self.resume = reporter, resume
        self.units = units_of(self.sweep)
        self.search = make_search(spec)
        self.stopper = (
            EarlyStopping(self.sweep.early_stopping, self.sweep.maximize)
            if self.sweep.early_stopping
            else None
        )
        self.trials: list[Trial] = []
        self.runs: dict[str, Run] = {}
        self.to_stop: set[str] = set()
        self.warned: set[str] = set()
        self.status = "running"
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.t_start = time.perf_counter()
        self.resumed = 0
        self.best_id: str | None = None

    # ------------------------------------------------------------------ the sweep

    def run(self) -> SweepResult:
        self._open_folder()
        self.reporter.start(self.describe())
        if isinstance(self.search, GridSearch):  # the whole grid is known: show it from the start
            while self._new_trial():
                pass
        pool = self.launcher.pool(self.slots, self.resources)
        try:
            self._loop(pool)
            self.status = "completed"
        except BaseException:
            self.status = "interrupted"
            raise
        finally:
            pool.close()
            result = self.write()
        from dlscale.sweep.plots import write_plots

        result["plots"] = [str(p) for p in write_plots(result, self.out_dir)]
        result["failure"] = res.failure_summary(result)  # None unless no trial completed
        # The last results.json is the typed result's own document, checked against its schema.
        record = SweepResult.model_validate(result)
        document = record.to_json()
        res.write_results(self.out_dir, document)
        self.reporter.finish(document)
        return record

    def _loop(self, pool) -> None:
        last_update = 0.0
        while True:
            self._fill(pool)
            if not pool.running:
                return
            for done in pool.wait(POLL_S, self._on_event):
                self._ended(done, pool)
            for key in sorted(self.to_stop):
                self._stop(key, pool)
            self.to_stop.clear()
            now = time.monotonic()
            if now - last_update >= UPDATE_EVERY_S:
                last_update = now
                self.reporter.update(self.snapshot())

    def _fill(self, pool) -> None:
        while len(pool.running) < self.slots:
            run = next((r for t in self.trials for r in t.runs if r.status == "pending"), None)
            if run is None:
                if not self._new_trial():
                    return
                continue
            run.status = "running"
            pool.submit(run.key, run_trial, self._job(run))

    def _job(self, run: Run) -> dict:
        return {
            "raw": run.raw,
            "base_dir": str(self.base_dir),
            "source": f"{self.spec_path}: trial {run.key}",
            "run_dir": str(run.dir),
            "sweep_dir": str(self.out_dir),  # held by this process: a trial locks only its own
            "predict": run.unit.kind == "member",
        }

    def _new_trial(self) -> bool:
        """Draw the next configuration from the search, if its budget has one left."""
        number = len(self.trials)
        params = self.search.next_params(number)
        if params is None:
            return False
        trial = self._trial(number, params)
        write_json_atomic(
            self.out_dir / "trials" / trial.id / "trial.json",
            {"id": trial.id, "number": number, "params": params},
        )
        self._validate(trial)
        return True

    def _trial(self, number: int, params: dict) -> Trial:
        trial_id = f"t{number:03d}"
        raw = config_raw(self.base_raw, params)
        runs = [
            Run(
                f"{trial_id}/{unit.name}",
                unit,
                run_raw(raw, unit),
                self.out_dir / "trials" / trial_id / unit.name,
            )
            for unit in self.units
        ]
        trial = Trial(trial_id, number, params, raw, runs)
        self.trials.append(trial)
        self.runs.update((run.key, run) for run in runs)
        return trial

    def _validate(self, trial: Trial) -> None:
        """A drawn configuration the spec rejects is a failed trial, not a stopped sweep."""
        try:
            for run in trial.runs:
                parse_spec(run.raw, self.base_dir, f"trial {trial.id} ({describe(trial.params)})")
        except UserError as exc:
            self._end_runs(trial, "failed", str(exc), None)
            self._close(trial)

    # ------------------------------------------------------------------ events

    def _on_event(self, key: str, kind: str, args: tuple) -> None:
        run = self.runs[key]
        if run.status != "running":  # late events of a stopped run (Ray's shared queue)
            return
        if kind == "start":
            run.step, run.total_steps = args[0]["start_step"], args[0]["total_steps"]
        elif kind == "step":
            run.step = args[0]
        elif kind == "epoch_end":
            record = args[0]
            run.step = record["step"]
            run.curve.append({k: record.get(k) for k in CURVE_KEYS})
            value = record.get(self.sweep.metric)
            stop = self.stopper and value is not None
            if stop and self.stopper.report(key, record["epoch"], value):
                self.to_stop.add(key)
        elif kind == "warn" and args[0] not in self.warned:
            self.warned.add(args[0])
            self.reporter.warn(f"{key}: {args[0]}")

    def _ended(self, done: TaskDone, pool) -> None:
        run = self.runs[done.key]
        if run.finished:
            return
        trial = self._trial_of(run)
        if done.ok:
            run.status, run.result = "completed", dict(done.value)
            run.curve = done.value["curve"]
        else:
            run.status, run.error = "failed", done.value
        if done.slot is not None:  # a local slot's: when it began and ended there
            run.result.update(slot=done.slot, began_at=done.began, ended_at=done.ended)
        self._save(run)
        if self.stopper:
            self.stopper.finish(run.key, run.status, run.result.get(self.sweep.metric))
        if run.status == "failed":
            self._end_runs(trial, "skipped", f"{run.unit.name} failed", pool)
        self._close(trial)

    def _stop(self, key: str, pool) -> None:
        """Early stopping: this run trails the others, and its trial ends with it."""
        run = self.runs[key]
        if run.status != "running":
            return
        pool.cancel(key)
        last = run.curve[-1] if run.curve else {}
        run.status = "pruned"
        run.result = {k: last.get(k) for k in ("val_accuracy", "val_loss")}
        run.error = f"stopped early after epoch {last.get('epoch')}"
        self._save(run)
        self.stopper.finish(key, "pruned", None)
        trial = self._trial_of(run)
        self._end_runs(trial, "pruned", f"{run.unit.name} was stopped early", pool)
        self._close(trial)

    def _end_runs(self, trial: Trial, status: str, why: str, pool) -> None:
        """End every unfinished run of a trial whose fate is known."""
        for run in trial.runs:
            if run.finished:
                continue
            if run.status == "running" and pool is not None:
                pool.cancel(run.key)
            run.status, run.error = status, why
            self._save(run)
            if self.stopper:
                self.stopper.finish(run.key, status, None)

    def _close(self, trial: Trial) -> None:
        """Once every run of a trial ended: score it, tell the search, write the results."""
        if trial.summary is not None or not all(run.finished for run in trial.runs):
            return
        trial.summary = summarize(self.sweep, trial)
        self.search.tell(trial.number, trial.summary["status"], trial.summary["metric"])
        row = trial.row()
        self.reporter.trial_done(row)
        self.write()

    def _trial_of(self, run: Run) -> Trial:
        return next(t for t in self.trials if run in t.runs)

    def _save(self, run: Run) -> None:
        write_json_atomic(run.dir / "result.json", run.record())

    # ------------------------------------------------------------------ folder

    def _open_folder(self) -> None:
        """A new sweep writes sweep.json; --resume reads back every trial and run it holds."""
        resumed, self.started_at = open_folder(
            self.out_dir, self.spec, self.spec_path, self.started_at, self.resume
        )
        if resumed:
            self._restore()

    def _restore(self) -> None:
        for number, (path, saved) in enumerate(saved_trials(self.out_dir)):
            if saved["number"] != number:
                raise UserError(f"{path}: trial {saved['number']} found where {number} belongs")
            trial = self._trial(number, saved["params"])
            for run in trial.runs:
                if restore_run(run):
                    self._restore_stopper(run)
            done = all(run.finished for run in trial.runs)
            if done:
                trial.summary = summarize(self.sweep, trial)
                self.resumed += 1
            status = trial.summary["status"] if done else None
            metric = trial.summary["metric"] if done else None
            if not self.search.restore(number, trial.params, status, metric):
                raise UserError(
                    f"{path}: trial {trial.id} ({describe(trial.params)}) is not one of this "
                    "sweep's; start a new sweep with another --out"
                )

    def _restore_stopper(self, run: Run) -> None:
        if self.stopper is None:
            return
        metric = self.sweep.metric
        curve = [(p["epoch"], p[metric]) for p in run.curve if p.get(metric) is not None]
        self.stopper.restore(run.status, curve, run.result.get(metric))

    # ------------------------------------------------------------------ results

    def describe(self) -> dict:
        return {
            "name": self.spec.name,
            "out_dir": str(self.out_dir),
            "search": search_kind(self.sweep),
            "trials": self.sweep.trials,
            "runs_per_trial": len(self.units),
            "evaluation": evaluation(self.sweep),
            "metric": self.sweep.metric,
            "params": self.sweep.paths,
            "slots": self.slots,
            "cpus_per_trial": self.resources.cpus,
            "cluster": self.launcher.name,
            "resumed_trials": self.resumed,
            "early_stopping": self.sweep.early_stopping.rule if self.sweep.early_stopping else None,
        }

    def snapshot(self) -> dict:
        trials = [trial.row() for trial in self.trials]
        counts = dict.fromkeys(("completed", "failed", "pruned", "running", "pending"), 0)
        for trial in trials:
            counts[trial["status"]] = counts.get(trial["status"], 0) + 1
        counts["pending"] += self.sweep.trials - len(trials)
        best = res.best_trial(trials, self.sweep.maximize)
        return {
            "schema": res.SCHEMA,
            **self.describe(),
            "spec_path": self.spec_path,
            "status": self.status,
            "started_at": self.started_at,
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - self.t_start,
            "maximize": self.sweep.maximize,
            "counts": counts,
            "slot_gaps_s": res.slot_gaps([run.record() for run in self.runs.values()]),
            "best": None
            if best is None
            else {
                "id": best["id"],
                "params": best["params"],
                "metric": best["metric"],
                "metric_std": best["metric_std"],
                "ensemble": best["ensemble"],
                "spec": str(self.out_dir / "best.yaml"),
            },
            "trials": trials,
        }

    def write(self) -> dict:
        """results.json and .csv as they stand; best.yaml whenever the best trial changes."""
        result = self.snapshot()
        best = result["best"]
        if best is not None and best["id"] != self.best_id:
            trial = next(t for t in self.trials if t.id == best["id"])
            validated = parse_spec(trial.raw, self.base_dir, f"trial {trial.id}")
            row = next(t for t in result["trials"] if t["id"] == best["id"])
            res.write_best_spec(
                self.out_dir / "best.yaml", portable(trial.raw, validated), row, result
            )
            self.best_id = best["id"]
        res.write_results(self.out_dir, result)
        return result


class NullSweepReporter:
    """Shows nothing: for library use and tests."""

    def start(self, info: dict) -> None:
        pass

    def update(self, result: dict) -> None:
        pass

    def trial_done(self, trial: dict) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def finish(self, result: dict) -> None:
        pass
