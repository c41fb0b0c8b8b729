"""The profile verbs: trace one training step on the meta device, predict it on devices, and show
it as tables, JSON and plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlscale.profiler import ProfileResult
from dlscale.profiler.request import INTEGER_PRECISIONS, ProfileRequest, ScalingRequest

DEFAULT_PROFILE_HARDWARE = ("v100-sxm2-16gb", "a100-40gb", "h100-sxm")


def profile_hardware(names: Sequence[str] | None, files: Sequence[Path] = ()) -> list:
    """The devices to predict on: named ones, `all`, or by default `local` (if measured) + a few."""
    from dlscale.hardware.catalogue import load_catalogue, local_entry_path, lookup

    catalogue = load_catalogue(list(files))
    if names is not None and list(names) == ["all"]:
        return list(catalogue.values())
    if not names:
        names = (["local"] if local_entry_path().is_file() else []) + [
            n for n in DEFAULT_PROFILE_HARDWARE if n in catalogue
        ]
    return [lookup(catalogue, name) for name in names]


def profile(request: ProfileRequest, scaling: ScalingRequest = ScalingRequest()) -> ProfileResult:
    """Trace one training step of `request.target` on the meta device and predict it on its
    hardware; with `scaling.devices` (counts), also on that many of each device, strategy by
    strategy."""
    from dlscale import profiler
    from dlscale.hardware.links import load_links
    from dlscale.profiler.scaling_report import scaling_links, scaling_reports
    from dlscale.profiler.target import resolve

    input_shape = list(request.input_shape) if request.input_shape is not None else None
    precision = request.precision
    quantized = precision in INTEGER_PRECISIONS
    workload = resolve(
        request.target,
        request.batch_size,
        input_shape,
        "fp32" if quantized else precision,  # int8/int4: the fp32 trace, counted at 1 or ½ byte
        request.optimizer,
        request.tokens,
        request.model_kwargs,
        request.dataset_size,
        request.inputs,
    )
    hardware = profile_hardware(request.hardware, request.hardware_files)
    if scaling.devices:  # a device count with no link for any device: said before the trace
        scaling_links(hardware, scaling, load_links(list(request.hardware_files)))
    result = profiler.profile(workload, hardware)
    if request.inference:
        from dlscale.profiler.inference import check_quantized, predict_inference

        wanted = precision or workload.precision
        if wanted in INTEGER_PRECISIONS:
            check_quantized(result.trace, wanted)
        result.inference = [
            predict_inference(result.trace, report.hardware, wanted) for report in result.reports
        ]
    if request.dataflow is not None:
        from dlscale.profiler.systolic_report import parse_dataflows, systolic_reports

        devices_asked = [report.hardware for report in result.reports]
        result.systolic = systolic_reports(
            result.trace, devices_asked, parse_dataflows(request.dataflow), workload.model_name
        )
    if scaling.devices:
        result.scaling = scaling_reports(result, scaling, request.hardware_files)
    return result


def profile_report(result, console) -> None:
    """A profile as tables, on a rich console."""
    from dlscale.profiler.report import render

    render(result, console)


def profile_json(result) -> dict:
    """A profile as JSON (schema dlscale.profile/1)."""
    from dlscale.profiler.report import to_json

    return to_json(result)


def profile_plot_folder(folder: Path, scaling: bool = False) -> None:
    """One line now, before the profile, if `folder` cannot take the plots (it is a file, or
    holds a file of a plot's name no profile wrote); `scaling`: --devices was given."""
    from dlscale.profiler.plots import check_plot_folder, plot_names

    check_plot_folder(Path(folder), plot_names(devices=True, scaling=scaling))


def profile_plots(result, folder: Path) -> list[Path]:
    """The profile's roofline and per-layer plots, written to `folder`."""
    from dlscale.profiler.plots import write_plots

    return write_plots(result, folder)
