"""`dlscale sweep` against Ray Tune on the same grid and concurrency, measured side by side.

The grid is `examples/sweep-digits.yaml`: 6 configurations × 3 folds = 18 training runs of the
MLP on the 8×8 digits, 2 at a time, one core and one torch thread each. Both sides train every
run with dlscale's own training loop (the same spec, fold and seed), so only the orchestration
differs:

- dlscale: `dlscale sweep examples/sweep-digits.yaml --parallel 2`, a fresh process.
- Ray Tune: a fresh process that starts Ray (2 CPUs), runs `tune.Tuner` over a grid of the 18
  run specs (`max_concurrent_trials=2`, 1 CPU a trial), and ranks the configurations by their
  folds' mean validation accuracy.

Each side's wall time is the whole command's, start-up included. Rounds alternate the two
(the machine's load drifts); medians, spread and `uptime` are printed.

Ray Tune is not a dependency of dlscale: it lives in the benchmark's own environment,
`.venv-tune`, with torch pinned as the Makefile pins it. Make it once:

    python3 -m venv .venv-tune
    .venv-tune/bin/python -m pip install -c constraints.txt torch==2.13.0
    .venv-tune/bin/python -m pip install -c constraints.txt -e . 'ray[tune]'

then run (from the repository root):

    .venv/bin/python benchmarks/sweep_vs_tune.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sweep-digits.yaml"
TUNE_PYTHON = ROOT / ".venv-tune" / "bin" / "python"
DLSCALE = ROOT / ".venv" / "bin" / "dlscale"


def run_specs() -> list[tuple[dict, int, dict]]:
    """(the configuration's values, its fold, the run's spec) for every run of the grid."""
    from dlscale.jobspec import load_spec
    from dlscale.jobspec.load import load_raw
    from dlscale.sweep.space import config_raw, grid_points, run_raw, run_units

    raw = {k: v for k, v in load_raw(EXAMPLE).items() if k != "sweep"}
    sweep = load_spec(EXAMPLE).sweep
    runs = []
    for params in grid_points(sweep.grid):
        config = config_raw(raw, params)
        for index, unit in enumerate(run_units(sweep)):
            runs.append((params, index, run_raw(config, unit)))
    return runs


def tune_trial(config: dict) -> None:
    """One Ray Tune trial: a run of the grid, trained by dlscale's loop in this Ray worker."""
    import torch
    from ray import tune

    from dlscale.jobspec import parse_spec
    from dlscale.train.loop import Trainer

    torch.set_num_threads(1)
    spec = parse_spec(config["run"]["spec"], base_dir=ROOT)
    with tempfile.TemporaryDirectory() as scratch:
        record = Trainer(spec, Path(scratch)).run()
    tune.report({"val_accuracy": record["final"]["val_accuracy"]})


def tune_side() -> dict:
    """The grid under Ray Tune, 2 trials at a time: the best configuration and its accuracy."""
    import ray
    from ray import tune

    runs = [{"params": params, "fold": fold, "spec": spec} for params, fold, spec in run_specs()]
    with tempfile.TemporaryDirectory() as storage:
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        started = time.perf_counter()
        tuner = tune.Tuner(
            tune.with_resources(tune_trial, {"cpu": 1}),
            param_space={"run": tune.grid_search(runs)},
            # Tune at its best: actors reused across trials, as dlscale reuses its slots.
            tune_config=tune.TuneConfig(max_concurrent_trials=2, reuse_actors=True),
            run_config=tune.RunConfig(storage_path=storage, verbose=0),
        )
        results = tuner.fit()
        fitted = time.perf_counter()
        ray.shutdown()
    by_config: dict[str, list[float]] = {}
    for result in results:
        run = result.config["run"]
        by_config.setdefault(json.dumps(run["params"], sort_keys=True), []).append(
            result.metrics["val_accuracy"]
        )
    best = max(by_config, key=lambda key: statistics.mean(by_config[key]))
    return {
        "best": json.loads(best),
        "accuracy": statistics.mean(by_config[best]),
        "runs": sum(len(v) for v in by_config.values()),
        "init_s": started - start,
        "fit_s": fitted - started,
    }


def timed(command: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tune-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tune_side:
        print(json.dumps(tune_side()))
        return
    if not TUNE_PYTHON.is_file():
        raise SystemExit(
            f"no {TUNE_PYTHON}: make the benchmark's environment first (see the top of this file)"
        )
    env = {
        **os.environ,
        "DLSCALE_HOME": tempfile.mkdtemp(prefix="dlscale-bench-"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(ROOT),
    }
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(uptime())
    times: dict[str, list[float]] = {"ray tune": [], "dlscale": []}
    bests: dict[str, list[str]] = {"ray tune": [], "dlscale": []}
    for round_ in range(args.rounds):
        seconds, out = timed([str(TUNE_PYTHON), __file__, "--tune-side"], env)
        tune = json.loads(out.strip().splitlines()[-1])
        times["ray tune"].append(seconds)
        bests["ray tune"].append(
            f"{tune['best']} {tune['accuracy']:.1%} ({tune['runs']} runs; "
            f"ray.init {tune['init_s']:.1f} s, Tuner.fit "
            f"{tune['fit_s']:.1f} s)"
        )
        with tempfile.TemporaryDirectory() as out_dir:
            seconds, out = timed(
                [
                    str(DLSCALE),
                    "sweep",
                    str(EXAMPLE),
                    "--parallel",
                    "2",
                    "--out",
                    out_dir,
                    "--json",
                ],
                env,
            )
        result = json.loads(out)
        times["dlscale"].append(seconds)
        best = result["best"]
        gaps = result.get("slot_gaps_s") or {}
        bests["dlscale"].append(
            f"{best['params']} {best['metric']:.1%} (slot gap median "
            f"{gaps.get('median', 0) * 1e3:.0f} ms, max "
            f"{gaps.get('max', 0) * 1e3:.0f} ms)"
        )
        print(
            f"round {round_ + 1}: ray tune {times['ray tune'][-1]:.1f} s, dlscale "
            f"{times['dlscale'][-1]:.1f} s",
            flush=True,
        )
    for side, found in times.items():
        print(
            f"{side:<9} median {statistics.median(found):5.1f} s (min {min(found):.1f}, "
            f"max {max(found):.1f}); best: {bests[side][-1]}"
        )
    ratio = statistics.median(times["dlscale"]) / statistics.median(times["ray tune"])
    print(f"dlscale / ray tune wall time: {ratio:.2f} (goal ≤ 1.00)")
    print(uptime())


if __name__ == "__main__":
    sys.exit(main())
