"""The verbs every front door calls: validate, train, sweep, estimate; the catalogues (models,
hardware, links, device_links); a job's record (weights_digest, data_fingerprint, environment).

The other verbs have a module each: profiling.py (profile), experiments.py (scale, compare),
bench.py (the benches and the `local` hardware entry), data.py (convert, stage). capacity.py
(will it fit, before anything starts) and rundir.py (the folder a run holds) serve the verbs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlscale.api.capacity import check_one_process, check_run, check_trials, local_problems
from dlscale.api.rundir import train_in_folder
from dlscale.errors import UserError
from dlscale.hardware import Hardware, load_catalogue, lookup
from dlscale.hardware.mig import slices as mig_slices
from dlscale.jobspec import Spec, load_spec
from dlscale.models import ZOO, check_model, parameter_count_meta
from dlscale.signals import say_on_stop
from dlscale.strategies import CHECKS, STRATEGIES
from dlscale.train import provenance
from dlscale.train.ownership import claim, claim_new
from dlscale.train.record import RunRecord
from dlscale.train.reporter import Reporter
from dlscale.train.run_folder import latest_sweep_dir

if TYPE_CHECKING:  # return types only: the verbs import these modules when they run, so that a
    # command that needs none of them starts without them
    from dlscale.hardware.links import Link
    from dlscale.profiler.estimate import Estimate
    from dlscale.sweep.record import SweepResult


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
) -> RunRecord:
    """Train a spec with its strategy; returns the run record, typed, whose `to_json()` is
    what run.json holds.

    `cluster` picks where workers run: `local` processes (the default) or a `ray` cluster at
    `address` (`auto`, or HOST:PORT of its head). Stopped (Ctrl-C, SIGTERM: KeyboardInterrupt),
    the exception's `hint` says what to do next: `--resume` where checkpoints were saved, what
    to remove where none were, "" where the run had not begun.
    """
    try:
        return _train(spec, out_dir, resume, reporter, cluster, address)
    except KeyboardInterrupt as stop:  # before the run began: train_in_folder says the rest
        if getattr(stop, "hint", None) is None:
            again = f"continue later with --resume{f' --out {out_dir}' if out_dir else ''}"
            say_on_stop(stop, again if resume else "")  # a new run had saved nothing yet
        raise


def _train(spec, out_dir, resume: bool, reporter, cluster: str, address) -> RunRecord:
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
    # The record comes back as run.json's document (from a worker process, for most
    # strategies): checked against its schema here, once for every strategy.
    return RunRecord.model_validate(
        train_in_folder(spec.name, out_dir, resume, reporter, start, early)
    )


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
    names: list[str] | None = None,
    extra_files: list[Path] | None = None,
    with_mig: bool = False,
) -> list[Hardware]:
    """Every catalogued device (shipped, user files, `extra_files`), or just the named ones
    (a MIG slice by PARENT:PROFILE); `with_mig`: each GPU followed by its MIG slices."""
    catalogue = load_catalogue(extra_files)
    found = list(catalogue.values()) if names is None else [lookup(catalogue, n) for n in names]
    if not with_mig:
        return found
    return [each for device in found for each in (device, *mig_slices(device))]


def links(extra_files: list[Path] | None = None) -> list[Link]:
    """Every catalogued link between devices: shipped, then the [[link]] tables of the user's
    hardware files ($DLSCALE_HOME/hardware/*.toml), then `extra_files`."""
    from dlscale.hardware.links import load_links

    return list(load_links(extra_files).values())


def device_links(
    names: list[str] | None = None,
    extra_files: list[Path] | None = None,
    with_mig: bool = False,
) -> list[tuple[Hardware, str | None]]:
    """Each device (all, or the named ones) with the name of the link its copies talk over by
    default (its interconnect, else its PCIe host link), or None where its entry has neither."""
    from dlscale.hardware.links import device_link, load_links

    found = load_links(extra_files)
    rows = []
    for device in hardware(names, extra_files, with_mig):
        linked = device.interconnect_link or device.interconnect or device.host_link
        linked = linked or device.measured.get("link")
        rows.append((device, device_link(device, None, found).name if linked else None))
    return rows


def estimate(spec_path: str | Path, steps: int = 20, warmup: int = 5) -> Estimate:
    """Time a few real steps of a spec; extrapolate; compare with the roofline on `local`."""
    from dlscale.hardware.catalogue import get_hardware, local_entry_path
    from dlscale.profiler.estimate import estimate as run_estimate

    check_one_process(load_spec(spec_path))  # it trains a few steps here, whatever the strategy

    local = get_hardware("local") if local_entry_path().is_file() else None
    return run_estimate(spec_path, local, steps=steps, warmup=warmup)


def sweep(
    spec_path: str | Path,
    out_dir: str | Path | None = None,
    parallel: int | None = None,
    resume: bool = False,
    reporter=None,
    cluster: str = "local",
    address: str | None = None,
) -> SweepResult:
    """Train the trials of a spec's `sweep:` section, `parallel` at a time; the sweep's results,
    typed (their `to_json()` is DIR/results.json), with the best trial written as
    DIR/best.yaml."""
    from dlscale.jobspec import load_raw, parse_spec
    from dlscale.launch import check_cluster, make_launcher
    from dlscale.sweep.runner import NullSweepReporter, SweepRunner
    from dlscale.sweep.slots import trial_slots
    from dlscale.sweep.space import check_space

    check_cluster(cluster, address)
    base_dir = Path(spec_path).resolve().parent
    raw = load_raw(spec_path)  # read once: the trials derive from the very text validated here
    spec = parse_spec(raw, base_dir, str(spec_path))
    if spec.sweep is None:
        raise UserError(
            f"{spec_path}: no sweep section to run; add `sweep:` with grid, random or tpe, "
            "and/or kfold or ensemble (see docs/sweep.md)"
        )
    if parallel is not None and parallel < 1:
        raise UserError(f"--parallel must be at least 1 (got {parallel})")
    checked = check_space(spec, raw, base_dir, str(spec_path))
    check_trials(checked, cluster)
    launcher = make_launcher(cluster, address)
    slots, resources, warning = trial_slots(spec, checked, parallel, launcher)
    if reporter is not None and warning is not None:
        reporter.warn(warning)
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


def weights_digest(run_dir: str | Path) -> str | None:
    """The digest of the model weights in a run's latest checkpoint (None: it saved none), for
    a job's record."""
    return provenance.weights_digest(run_dir)


def data_fingerprint(spec_path: str | Path) -> dict:
    """The digest of the data a spec trains on, with how it was taken, for a job's record."""
    return provenance.data_fingerprint(spec_path)


def environment() -> dict:
    """The software a job ran on (Python, platform, dlscale, torch and its dependencies)."""
    return provenance.environment()


# The verbs of this module; the other verbs are in profiling, experiments, bench and data (each
# imported by its module path: docs/api.md).
__all__ = [
    "data_fingerprint",
    "device_links",
    "environment",
    "estimate",
    "exit_quickly",
    "hardware",
    "links",
    "models",
    "show_value",
    "sweep",
    "train",
    "validate",
    "weights_digest",
]
