"""The profile verbs: trace one training step on the meta device, predict it on devices, and show
it as tables, JSON and plots."""

from __future__ import annotations

from pathlib import Path

from dlscale.errors import UserError

DEFAULT_PROFILE_HARDWARE = ("v100-sxm2-16gb", "a100-40gb", "h100-sxm")


def profile_hardware(names: list[str] | None, files: list[Path] | None = None) -> list:
    """The devices to predict on: named ones, `all`, or by default `local` (if measured) + a few."""
    from dlscale.hardware.catalogue import load_catalogue, local_entry_path, lookup

    catalogue = load_catalogue(files)
    if names == ["all"]:
        return list(catalogue.values())
    if not names:
        names = (["local"] if local_entry_path().is_file() else []) + [
            n for n in DEFAULT_PROFILE_HARDWARE if n in catalogue
        ]
    return [lookup(catalogue, name) for name in names]


def profile(
    target: str,
    batch_size: int | None = None,
    input_shape: list[int] | None = None,
    precision: str | None = None,
    optimizer: str | None = None,
    hardware: list[str] | None = None,
    hardware_files: list[Path] | None = None,
    tokens: bool = False,
    model_kwargs: dict | None = None,
    dataset_size: int | None = None,
    devices: list[int] | None = None,
    interconnect: str | None = None,
    nodes: int = 1,
    network: str | None = None,
    strategies: list[str] | None = None,
    epochs: int | None = None,
    deadline: str | None = None,
    inputs: str | None = None,
    dataflow: str | None = None,
    inference: bool = False,
):
    """Trace one training step of `target` on the meta device and predict it on `hardware`;
    with `devices` (counts), also on that many of each device, strategy by strategy."""
    from dlscale import profiler
    from dlscale.profiler.scaling import STRATEGIES
    from dlscale.profiler.scaling_report import parse_duration, scaling_reports
    from dlscale.profiler.target import resolve

    if not devices and (interconnect or network or deadline or strategies or nodes != 1):
        raise UserError(
            "--interconnect, --nodes, --network, --strategies and --deadline need "
            "--devices, e.g. --devices 1,2,4,8"
        )
    if epochs is not None and epochs <= 0:
        raise UserError(f"--epochs must be a positive number (got {epochs})")
    deadline_s = parse_duration(deadline) if deadline is not None else None
    if precision == "int8" and not inference:
        raise UserError("--precision int8 is for inference (no int8 training): add --inference")
    workload = resolve(
        target,
        batch_size,
        input_shape,
        "fp32" if precision == "int8" else precision,  # int8: the fp32 trace, counted at 1 byte
        optimizer,
        tokens,
        model_kwargs,
        dataset_size,
        inputs,
    )
    result = profiler.profile(workload, profile_hardware(hardware, hardware_files))
    if inference:
        from dlscale.profiler.inference import check_int8, predict_inference

        wanted = precision or workload.precision
        if wanted == "int8":
            check_int8(result.trace)
        result.inference = [
            predict_inference(result.trace, report.hardware, wanted) for report in result.reports
        ]
    if dataflow is not None:
        from dlscale.profiler.systolic_report import parse_dataflows, systolic_reports

        devices_asked = [report.hardware for report in result.reports]
        result.systolic = systolic_reports(workload, devices_asked, parse_dataflows(dataflow))
    if devices:
        spec_epochs = workload.epochs
        epochs_from = "--epochs" if epochs else "spec" if spec_epochs else "default"
        result.scaling = scaling_reports(
            result.trace,
            [report.hardware for report in result.reports],
            devices,
            interconnect=interconnect,
            nodes=nodes,
            network=network,
            strategies=tuple(strategies or STRATEGIES),
            dataset_size=workload.dataset_size,
            epochs=epochs or spec_epochs or 1,
            epochs_from=epochs_from,
            deadline_s=deadline_s,
            link_files=hardware_files,
            tensor_plans=_tensor_plans(workload, result.trace),
        )
    return result


def _tensor_plans(workload, trace):
    """The auto tensor-parallel plan per degree (none for a model given --inputs: its plan
    is drawn from one tensor input)."""
    from dlscale.profiler.tensor_plan import plans_for

    if workload.inputs is not None:
        return None
    return plans_for(workload.build, workload.sample, trace.params, workload.precision)


def profile_report(result, console) -> None:
    """A profile as tables, on a rich console."""
    from dlscale.profiler.report import render

    render(result, console)


def profile_json(result) -> dict:
    """A profile as JSON (schema dlscale.profile/1)."""
    from dlscale.profiler.report import to_json

    return to_json(result)


def profile_plot_folder(folder: Path) -> None:
    """One line now, before the profile, if `folder` cannot take the plots (it is a file)."""
    from dlscale.profiler.plots import check_plot_folder

    check_plot_folder(Path(folder))


def profile_plots(result, folder: Path) -> list[Path]:
    """The profile's roofline and per-layer plots, written to `folder`."""
    from dlscale.profiler.plots import write_plots

    return write_plots(result, folder)
