"""The experiment verbs, `scale` and `compare`: one spec trained several ways (at each worker
count; with each strategy), one run after another in one held folder, measured side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from dlscale.api import train
from dlscale.api.capacity import check_global_batches, check_trials
from dlscale.api.rundir import refuse_a_previous_run
from dlscale.bench.experiment_records import CompareResult, ScaleResult
from dlscale.errors import UserError, once_each
from dlscale.jobspec import load_spec
from dlscale.signals import say_on_stop
from dlscale.train.ownership import claim

LR_SCALINGS = ("none", "linear", "sqrt")
THROUGHPUT_STEPS = 50  # a throughput-only run's default length


def scale(
    spec_path: str | Path,
    workers: list[int],
    out: Path,
    steps: int | None = None,
    cluster: str = "local",
    address: str | None = None,
    on_run=None,
    lr_scaling: str | None = None,
    target_accuracy: float | None = None,
) -> ScaleResult:
    """Train a spec with each data-parallel worker count (each tensor-parallel degree, for a
    tensor spec); throughput and scaling efficiency, over `steps` steps a run (default 50).
    With `lr_scaling` or `target_accuracy`, every count trains the spec's whole length (unless
    `steps` is given) and its convergence is reported: final accuracy, and the epochs, wall
    time and samples seen to reach the target. `on_run` is given each run's row as it ends (a
    dict, before the efficiencies and predictions that need every run)."""
    from dlscale.bench.scale import (
        convergence,
        local_cores,
        lr_factor,
        scale_result,
        scale_row,
        scaled_spec,
        scaled_strategy,
        threads_for,
    )
    from dlscale.launch import check_cluster
    from dlscale.launch.processes import available_cores

    check_cluster(cluster, address)
    if not workers or min(workers) < 1:
        raise UserError("--workers takes positive worker counts, e.g. 1,2,4")
    once_each("--workers", workers)  # it would run once: said, as the command's --workers does
    if steps is not None and steps < 1:
        raise UserError(f"--steps: must be a positive integer (got {steps})")
    check_scale_options(lr_scaling, target_accuracy)
    spec = load_spec(spec_path)
    converge = lr_scaling is not None or target_accuracy is not None
    if steps is None and not converge:
        steps = THROUGHPUT_STEPS
    if converge and scaled_strategy(spec) == "tensor" and lr_scaling not in (None, "none"):
        raise UserError(
            "--lr-scaling: a tensor-parallel degree does not change the global "
            "batch, so there is nothing to scale the learning rate for"
        )
    counts = sorted(set(workers))
    base = counts[0]
    specs = {
        n: scaled_spec(spec, n, steps, lr_factor(lr_scaling or "none", n, base)) for n in counts
    }
    check_trials(list(specs.values()), cluster, "a run")
    check_global_batches(list(specs.values()))
    # Like for like: each worker gets the same threads in every run (Ray gives each one core).
    threads = threads_for(workers, available_cores()) if cluster == "local" else 1

    def run(count: int, run_dir: Path) -> dict:
        with local_cores(count, threads):
            record = train(specs[count], run_dir, cluster=cluster, address=address).to_json()
        row = scale_row(count, record, str(run_dir))
        if converge:
            row.update(convergence(record, specs[count], target_accuracy))
        return row

    forks = not all(run.strategy.in_process for run in specs.values())
    runs = {f"workers-{count}": partial(run, count) for count in counts}
    rows = train_in_turn(out, runs, on_run, _before_timing(cluster, forks))
    result = scale_result(spec, str(spec_path), rows, steps, cluster, threads)
    result.update(lr_scaling=lr_scaling, target_accuracy=target_accuracy, convergence=converge)
    predicted = _with_scale_prediction(result, spec_path, workers, threads, cluster)
    return ScaleResult.from_json(predicted)


def batch_note(result: CompareResult) -> str | None:
    """A word where the compared strategies trained different global batches, else None."""
    from dlscale.bench.compare import batch_note as note

    return note([row.to_json() for row in result.rows])


def check_scale_options(lr_scaling: str | None, target_accuracy: float | None) -> None:
    """One line for a rule or target `scale` cannot take (before any folder is made)."""
    if lr_scaling is not None and lr_scaling not in LR_SCALINGS:
        raise UserError(
            f"--lr-scaling must be one of {', '.join(LR_SCALINGS)} (got '{lr_scaling}')"
        )
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise UserError(
            f"--target-accuracy is a fraction in (0, 1], e.g. 0.95 (got {target_accuracy})"
        )


def parse_strategies(text: str) -> list[str]:
    """`--strategies ddp,async`: checked names, in order (one given twice is refused)."""
    from dlscale.bench.compare import parse_strategies as parse

    return parse(text)


def compare(
    spec_path: str | Path,
    strategies: list[str],
    workers: int,
    out: Path,
    epochs: int | None = None,
    cluster: str = "local",
    address: str | None = None,
    on_run=None,
) -> CompareResult:
    """Train a spec with each strategy at the same worker count; accuracy against wall time.
    `on_run` is given each run's row as it ends (a dict, before the time to the target, which
    needs every run)."""
    from dlscale.bench.compare import compare_result, compare_row, compare_spec
    from dlscale.launch import check_cluster

    check_cluster(cluster, address)
    if not strategies:
        raise UserError("--strategies takes strategy names, e.g. ddp,async")
    spec = load_spec(spec_path)
    once_each("--strategies", strategies)  # it would run once: said, as --strategies does
    names = list(strategies)
    # Every problem is found before the first run starts, not after an hour of training.
    specs = {name: compare_spec(spec, name, workers, epochs) for name in names}
    check_trials(list(specs.values()), cluster, "a run")
    check_global_batches(list(specs.values()))
    in_process = [name for name, run in specs.items() if run.strategy.in_process]
    if cluster != "local" and in_process:
        raise UserError(
            f"--cluster {cluster} places parallel workers; strategy '{in_process[0]}' runs in "
            "this process"
        )

    def run(name: str, run_dir: Path) -> dict:
        started = time.perf_counter()
        record = train(specs[name], run_dir, cluster=cluster, address=address).to_json()
        return compare_row(name, record, str(run_dir), time.perf_counter() - started)

    ready = _before_timing(cluster, forks=len(in_process) < len(names))
    runs = {name: partial(run, name) for name in names}
    rows = train_in_turn(out, runs, on_run, ready)
    return CompareResult.from_json(
        compare_result(spec, str(spec_path), rows, workers, epochs, cluster)
    )


def train_in_turn(
    out: Path,
    runs: dict[str, Callable[[Path], dict]],
    on_run: Callable[[dict], None] | None,
    ready: Callable[[], None] | None = None,
) -> list[dict]:
    """Hold `out` (one scale or compare into a folder at a time), then each run in turn: the row
    `runs[name](out / name)` trains and measures, each given to `on_run` as soon as it is made;
    first, one line if any of those folders holds what an earlier run left, then `ready()`
    (what must be done before the first run is timed)."""
    rows = []
    with claim(out):
        for name in runs:  # before the first run trains, not when the second would start
            refuse_a_previous_run(Path(out) / name, resumable=False)
        if ready is not None:
            ready()
        for name, run in runs.items():
            try:
                rows.append(run(Path(out) / name))
            except KeyboardInterrupt as stop:  # what stays in `out` refuses a rerun there
                if (Path(out) / name).exists() or rows:
                    say_on_stop(stop, _interrupted_runs(out, list(runs)[: len(rows)], len(runs)))
                raise
            if on_run is not None:
                on_run(rows[-1])
    return rows


def _before_timing(cluster: str, forks: bool) -> Callable[[], None] | None:
    """What runs timed one after another pay once, before the first (else the first pays it
    alone): the fork server's imports for local workers, `import ray` for a Ray cluster."""
    if cluster == "local" and forks:
        from dlscale.launch.start import warmed_up

        return warmed_up
    if cluster == "ray":
        from dlscale.launch.ray_cluster import import_ray

        return import_ray
    return None


def _interrupted_runs(out: Path, finished: list[str], total: int) -> str:
    """What a scale or compare stopped part way tells its user: the runs that finished, where
    they stay, and that a rerun into that folder is refused (refuse_a_previous_run) until it is
    removed (a rerun without --out makes a new folder)."""
    again = "a rerun into that folder is refused until it is removed"
    if not finished:
        return f"before its first run ended, whose folder stays in {out} ({again})"
    return f"after {len(finished)} of {total} runs ({', '.join(finished)}), kept in {out} ({again})"


def _with_scale_prediction(result: dict, spec_path, workers, threads: int, cluster: str) -> dict:
    """Predicted beside measured, when this machine was measured: over the link between its
    processes for local runs, over the link `bench link` last saved for a cluster's."""
    from dlscale.bench.scale import add_predictions, predicted_rows
    from dlscale.hardware.catalogue import get_hardware, local_entry_path
    from dlscale.hardware.links import measured_link
    from dlscale.hardware.trust import calibration

    if not local_entry_path().is_file():
        return add_predictions(result, None, None)
    local = get_hardware("local")
    if cluster == "local":
        measured = local.measured.get("link")
        if not measured:  # an entry saved before the link probe: measure it now (a few seconds)
            from dlscale.bench.link import measure_link

            measured = measure_link(quick=True)
        link = measured_link(measured)
    else:
        link = saved_cluster_link()
        if link is None:  # no `bench link` yet: measured only
            return add_predictions(result, None, None)
    predicted = predicted_rows(str(spec_path), workers, threads, local, link, result["strategy"])
    return add_predictions(result, predicted, link.name, calibration(local))


def saved_cluster_link():
    """The link `dlscale bench link` saved last (its file's time), or None if it never ran."""
    from dlscale.hardware.links import MEASURED_BY, parse_links
    from dlscale.home import dlscale_home

    found = sorted((dlscale_home() / "hardware").glob("*.toml"), key=lambda p: p.stat().st_mtime)
    for path in reversed(found):
        for link in parse_links(path.read_text(encoding="utf-8"), str(path)):
            if link.notes.startswith(MEASURED_BY):
                return link
    return None
