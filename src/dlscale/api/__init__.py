"""The verbs every front door calls: validate, train, models, hardware."""

from __future__ import annotations

import time
from pathlib import Path

from dlscale.api.bench import (
    DEFAULT_BATCHES,
    DEFAULT_LOADER_STEPS,
    bench_batch,
    bench_io,
    bench_levels,
    bench_link,
    bench_loader,
    bench_machine,
    bench_matmul,
    bench_precision,
    bench_sparsity,
    bench_width,
    calibration_line,
    calibration_problems,
    check_link_cluster,
    check_out_dir,
    hardware_calibration,
    link_name,
    output_dir,
    save_link,
    save_local_hardware,
    saved_local_measured_at,
    worse_than_saved,
    write_outputs,
)
from dlscale.api.capacity import check_one_process, check_run, check_trials, local_problems
from dlscale.api.data import convert_data, stage_data
from dlscale.api.jobs import data_digest, data_fingerprint, environment, weights_digest
from dlscale.api.profiling import (
    profile,
    profile_json,
    profile_plot_folder,
    profile_plots,
    profile_report,
)
from dlscale.api.rundir import train_in_folder
from dlscale.api.scale import check_scale_options, scale
from dlscale.errors import UserError
from dlscale.hardware import PRECISIONS, Hardware, load_catalogue, lookup
from dlscale.jobspec import Spec, load_spec
from dlscale.models import ZOO, check_model, parameter_count_meta
from dlscale.profiler.request import ProfileRequest, ScalingRequest
from dlscale.strategies import CHECKS, STRATEGIES
from dlscale.train import checkpoint as ckpt
from dlscale.train.files import DEFAULT_RUNS_DIR, new_run_dir
from dlscale.train.ownership import claim, claim_new
from dlscale.train.reporter import Reporter

__all__ = [
    "DEFAULT_BATCHES",
    "DEFAULT_LOADER_STEPS",
    "PRECISIONS",
    "Hardware",
    "ProfileRequest",
    "ScalingRequest",
    "bench_batch",
    "bench_io",
    "bench_levels",
    "bench_link",
    "bench_loader",
    "bench_machine",
    "bench_matmul",
    "bench_precision",
    "bench_sparsity",
    "bench_width",
    "calibration_line",
    "calibration_problems",
    "check_link_cluster",
    "check_out_dir",
    "check_scale_options",
    "compare",
    "convert_data",
    "data_digest",
    "data_fingerprint",
    "device_links",
    "environment",
    "estimate",
    "hardware",
    "hardware_calibration",
    "link_name",
    "links",
    "models",
    "new_run_dir",
    "output_dir",
    "parse_strategies",
    "profile",
    "profile_json",
    "profile_plot_folder",
    "profile_plots",
    "profile_report",
    "save_link",
    "save_local_hardware",
    "saved_local_measured_at",
    "scale",
    "show_value",
    "stage_data",
    "sweep",
    "train",
    "validate",
    "weights_digest",
    "worse_than_saved",
    "write_outputs",
]


def validate(spec_path: str | Path) -> tuple[Spec, list[str]]:
    """Parse and check a spec (and the trials of its sweep) without running it; returns it with
    its warnings."""
    spec = load_spec(spec_path)
    try:
        check_model(spec.model.name, spec.model.kwargs)
    except UserError as exc:
        raise UserError(f"{spec_path}: model: {exc}") from None
    from dlscale.train.preflight import preflight

    preflight(
        spec, CHECKS.get(spec.strategy.name)
    )  # the data read, and the model given one sample on the meta device
    if spec.sweep is not None:
        from dlscale.jobspec import load_raw
        from dlscale.sweep.space import check_space

        check_space(spec, load_raw(spec_path), Path(spec_path).resolve().parent, str(spec_path))
    return spec, spec.warnings() + local_problems(spec)


def train(
    spec: Spec | str | Path,
    out_dir: str | Path | None = None,
    resume: bool = False,
    reporter: Reporter | None = None,
    cluster: str = "local",
    address: str | None = None,
) -> dict:
    """Train a spec with its strategy; returns the run record also written to run.json.

    `cluster` picks where workers run: `local` processes (the default) or a `ray` cluster at
    `address` (`auto`, or HOST:PORT of its head).
    """
    from dlscale.launch import check_cluster

    check_cluster(cluster, address)
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    from dlscale.train.device import check_precision, resolve_device

    # Before any process starts: a device this machine lacks, fp16 without a GPU.
    check_precision(spec.precision, resolve_device(spec.device))
    if cluster != "local" and spec.strategy.in_process:
        raise UserError(
            f"--cluster {cluster} places parallel workers; strategy '{spec.strategy.name}' runs "
            "in this process"
        )
    from dlscale.launch import make_launcher
    from dlscale.launch.start import warm_up

    if cluster == "local" and not spec.strategy.in_process:
        warm_up()  # the workers' fork server imports torch while the checks below run
    early = check_run(spec, cluster, reporter)  # memory, cores, load: before any folder

    def start(run_dir: Path, resume_from: Path | None, said: list[str]) -> dict:
        launcher = make_launcher(cluster, address)
        run = STRATEGIES[spec.strategy.name]
        return run(spec, run_dir, resume_from, reporter, launcher, said)

    # The folder is this process's from here to the end (a second run into it is refused).
    return train_in_folder(spec.name, out_dir, resume, reporter, start, early)


def exit_quickly() -> None:
    """This process (the `dlscale` command) ends without Python's last garbage collection."""
    import dlscale.launch.quick_exit  # noqa: F401  (its import arranges it)


def models() -> list[dict]:
    """The zoo: name, summary, parameter count at its listing arguments (counted on meta)."""
    rows = []
    for name, entry in ZOO.items():
        rows.append(
            {
                "name": name,
                "summary": entry.summary,
                "parameters": parameter_count_meta(name, entry.listing_kwargs),
                "input_kind": entry.input_kind,
                "example_input_shape": list(entry.example_input_shape),
                "listing_kwargs": dict(entry.listing_kwargs),
            }
        )
    return rows


def show_value(value) -> str:
    """A swept value as a sweep shows it."""
    from dlscale.sweep.space import show

    return show(value)


def hardware(
    names: list[str] | None = None, extra_files: list[Path] | None = None
) -> list[Hardware]:
    """Every catalogued device (shipped, user files, `extra_files`), or just the named ones."""
    catalogue = load_catalogue(extra_files)
    if names is None:
        return list(catalogue.values())
    return [lookup(catalogue, name) for name in names]


def links(extra_files: list[Path] | None = None) -> list:
    """Every catalogued link between devices: shipped, then the [[link]] tables of the user's
    hardware files ($DLSCALE_HOME/hardware/*.toml), then `extra_files`."""
    from dlscale.hardware.links import load_links

    return list(load_links(extra_files).values())


def device_links(
    names: list[str] | None = None, extra_files: list[Path] | None = None
) -> list[tuple[Hardware, str | None]]:
    """Each device (all, or the named ones) with the name of the link its copies talk over by
    default (its interconnect, else its PCIe host link), or None where its entry has neither."""
    from dlscale.hardware.links import device_link, load_links

    found = load_links(extra_files)
    rows = []
    for device in hardware(names, extra_files):
        linked = device.interconnect_link or device.interconnect or device.host_link
        linked = linked or device.measured.get("link")
        rows.append((device, device_link(device, None, found).name if linked else None))
    return rows


def estimate(spec_path: str | Path, steps: int = 20, warmup: int = 5):
    """Time a few real steps of a spec; extrapolate; compare with the roofline on `local`."""
    from dlscale.hardware.catalogue import get_hardware, local_entry_path
    from dlscale.profiler.estimate import estimate as run_estimate

    check_one_process(load_spec(spec_path))  # it trains a few steps here, whatever the strategy

    local = get_hardware("local") if local_entry_path().is_file() else None
    return run_estimate(spec_path, local, steps=steps, warmup=warmup)


def parse_strategies(text: str) -> list[str]:
    """`--strategies ddp,async`: checked names, in order, each once."""
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
) -> dict:
    """Train a spec with each strategy at the same worker count; accuracy against wall time."""
    from dlscale.bench.compare import compare_result, compare_row, compare_spec
    from dlscale.launch import check_cluster

    check_cluster(cluster, address)
    if not strategies:
        raise UserError("--strategies takes strategy names, e.g. ddp,async")
    spec = load_spec(spec_path)
    names = list(dict.fromkeys(strategies))
    # Every problem is found before the first run starts, not after an hour of training.
    specs = {name: compare_spec(spec, name, workers, epochs) for name in names}
    check_trials(list(specs.values()), cluster, "a run")
    in_process = [name for name, run in specs.items() if run.strategy.in_process]
    if cluster != "local" and in_process:
        raise UserError(
            f"--cluster {cluster} places parallel workers; strategy '{in_process[0]}' runs in "
            "this process"
        )
    rows = []
    with claim(out):  # one compare or scale into a folder at a time
        for name in names:
            if ckpt.list_checkpoints(Path(out) / name):
                raise UserError(
                    f"{Path(out) / name} already holds checkpoints of a run: choose another --out"
                )
        for name, run_spec in specs.items():
            run_dir = Path(out) / name
            started = time.perf_counter()
            record = train(run_spec, run_dir, cluster=cluster, address=address)
            rows.append(compare_row(name, record, str(run_dir), time.perf_counter() - started))
            if on_run is not None:
                on_run(rows[-1])
    return compare_result(spec, str(spec_path), rows, workers, epochs, cluster)


def sweep(
    spec_path: str | Path,
    out_dir: str | Path | None = None,
    parallel: int | None = None,
    resume: bool = False,
    reporter=None,
    cluster: str = "local",
    address: str | None = None,
) -> dict:
    """Train the trials of a spec's `sweep:` section, `parallel` at a time; the sweep's results
    (also in DIR/results.json), with the best trial written as DIR/best.yaml."""
    from dlscale.jobspec import load_raw, parse_spec
    from dlscale.launch import check_cluster, make_launcher
    from dlscale.launch.base import Resources
    from dlscale.sweep.runner import NullSweepReporter, SweepRunner
    from dlscale.sweep.space import check_space

    check_cluster(cluster, address)
    base_dir = Path(spec_path).resolve().parent
    raw = load_raw(spec_path)  # read once: the trials derive from the very text validated here
    spec = parse_spec(raw, base_dir, str(spec_path))
    if spec.sweep is None:
        raise UserError(
            f"{spec_path}: no sweep section to run; add `sweep:` with grid, random or tpe, "
            "and/or kfold or ensemble (see the README)"
        )
    if parallel is not None and parallel < 1:
        raise UserError(f"--parallel must be at least 1 (got {parallel})")
    checked = check_space(spec, raw, base_dir, str(spec_path))
    check_trials(checked, cluster)
    processes = max(run.strategy.processes for run in checked)
    gpus = float(max(_gpus_of(run) for run in checked))
    resources = Resources(cpus=float(processes), gpus=gpus)
    launcher = make_launcher(cluster, address)
    capacity = launcher.capacity(resources)
    if capacity < 1:
        need = f"{processes} core(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")
        raise UserError(f"one trial needs {need}; {launcher.name} does not have that many free")
    from dlscale.sweep.space import run_units

    total_runs = spec.sweep.trials * len(run_units(spec.sweep))
    slots = min(parallel or capacity, capacity, total_runs)
    if reporter is not None and parallel is not None and parallel > capacity:
        reporter.warn(
            f"--parallel {parallel}: {capacity} trial(s) of {processes} process(es) fit "
            f"({launcher.name}); running {capacity} at a time"
        )
    if resume and out_dir is None:
        out_dir = latest_sweep_dir(spec.name)
    owned = claim(Path(out_dir)) if out_dir else claim_new(f"sweep-{spec.name}")
    with owned as out:  # the sweep's folder is this process's until it ends
        runner = SweepRunner(
            spec,
            raw,
            base_dir,
            str(spec_path),
            out,
            launcher,
            slots,
            resources,
            reporter or NullSweepReporter(),
            resume,
        )
        return runner.run()


def _gpus_of(spec: Spec) -> int:
    """GPUs one run of `spec` takes: one per trainer process when it runs on CUDA (a parameter
    server holds its shard in host memory)."""
    from dlscale.train.device import resolve_device

    return spec.strategy.trainers if resolve_device(spec.device).type == "cuda" else 0


def latest_sweep_dir(name: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """The newest runs/sweep-<name>-* folder: what a bare `sweep --resume` continues."""
    import re

    own = re.compile(rf"^sweep-{re.escape(name)}-\d{{8}}-\d{{6}}(-\d+)?$")  # not sweep-{name}-x-...
    candidates = [
        p
        for p in root.glob(f"sweep-{name}-*")
        if own.match(p.name) and (p / "sweep.json").is_file()
    ]
    if not candidates:
        raise UserError(
            f"nothing to resume: no sweep of '{name}' under {root}/ (pass --out DIR to name it)"
        )
    return max(candidates, key=lambda p: (p / "sweep.json").stat().st_mtime)
