"""`dlscale profile`: per-layer costs, training memory and predictions, before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer
from rich.console import Console

from dlscale import api
from dlscale.api import bench, profiling
from dlscale.cli.errors import user_errors
from dlscale.cli.options import parse_int_list, parse_kwargs
from dlscale.tables import output_console

console = output_console()


def parse_names(text: str | None) -> tuple[str, ...] | None:
    return tuple(name.strip() for name in text.split(",") if name.strip()) if text else None


def shape_list(text: str) -> str:
    """`3x64x64` (or `3×64×64`) as `3,64,64`: an x between two numbers separates sizes; any
    other x is left for the parser to name ('x' is not an integer)."""
    return re.sub(r"(?<=\d)\s*[x×]\s*(?=\d)", ",", text)


@user_errors
def profile(
    target: str = typer.Argument(..., help="A zoo model, package.module:factory, or a spec file."),
    batch: int | None = typer.Option(None, "--batch", help="Batch size (default: spec's, or 32)."),
    input_shape: str | None = typer.Option(
        None, "--input-shape", help="One sample's shape, e.g. 1,28,28 (default: the zoo's)."
    ),
    tokens: bool = typer.Option(False, "--tokens", help="Samples are int64 token ids."),
    inputs: str | None = typer.Option(
        None,
        "--inputs",
        help="package.module:function(batch) returning the forward's inputs: a tensor, "
        "args, kwargs or (args, kwargs).",
    ),
    kwargs: str | None = typer.Option(
        None, "--kwargs", help="Model kwargs as JSON: '{\"hidden\": [64]}'"
    ),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="fp32 | bf16 | fp16 | int8 | int4 (int8, int4: with --inference).",
    ),
    inference: bool = typer.Option(
        False, "--inference", help="Also predict inference: the forward pass alone."
    ),
    optimizer: str | None = typer.Option(
        None, "--optimizer", help="sgd | momentum | adam | adamw."
    ),
    hardware: str | None = typer.Option(
        None, "--hardware", help="Devices to predict on: NAME[,NAME...] or 'all'."
    ),
    hardware_file: list[Path] | None = typer.Option(
        None,
        "--hardware-file",
        metavar="<path>",  # one file each time it is given (Typer would show <list[Path]>)
        help="Extra catalogue file(s) of your own devices.",
    ),
    dataset_size: int | None = typer.Option(
        None, "--dataset-size", help="Training samples per epoch, for epoch time."
    ),
    devices: str | None = typer.Option(
        None, "--devices", help="Predict on this many of each device: 1,2,4,8."
    ),
    interconnect: str | None = typer.Option(
        None, "--interconnect", help="nvlink | pcie | a link (dlscale hardware links)."
    ),
    nodes: int = typer.Option(1, "--nodes", help="Machines the devices are spread over."),
    network: str | None = typer.Option(
        None, "--network", help="The link between nodes, e.g. ib-hdr, eth-100g."
    ),
    strategies: str | None = typer.Option(
        None, "--strategies", help="ddp,pipeline,ps,hybrid,tensor (default: all)."
    ),
    sync_batchnorm: bool = typer.Option(
        False,
        "--sync-batchnorm",
        help="ddp points run torch's SyncBatchNorm: count its collectives (GPUs only).",
    ),
    pipeline_schedule: str = typer.Option(
        "gpipe",
        "--pipeline-schedule",
        help="The pipeline and hybrid points' schedule: gpipe, 1f1b or 2bw (no flush per step).",
    ),
    epochs: int | None = typer.Option(None, "--epochs", help="Epochs of the whole run."),
    deadline: str | None = typer.Option(
        None, "--deadline", help="Pick the cheapest device count finishing within: 2h, 30m."
    ),
    dataflow: str | None = typer.Option(
        None,
        "--dataflow",
        help="ws | is | os | all: map every matrix product of the step (linear and conv "
        "layers, transformers' Conv1D, attention) onto the systolic arrays of --hardware "
        "(TPUs, or your own array description).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    plot: Path | None = typer.Option(None, "--plot", help="Write PNG plots into this folder."),
) -> None:
    """Per-layer FLOPs, bytes and memory, and predicted step time on each device."""
    request = profiling.ProfileRequest(
        target,
        batch_size=batch,
        input_shape=(
            tuple(parse_int_list(shape_list(input_shape), "--input-shape")) if input_shape else None
        ),
        precision=precision,
        optimizer=optimizer,
        tokens=tokens,
        model_kwargs=parse_kwargs(kwargs),
        dataset_size=dataset_size,
        inputs=inputs,
        hardware=parse_names(hardware),
        hardware_files=tuple(hardware_file or ()),
        inference=inference,
        dataflow=dataflow,
    )
    scaling = profiling.ScalingRequest(
        devices=tuple(parse_int_list(devices, "--devices")) if devices else (),
        interconnect=interconnect,
        nodes=nodes,
        network=network,
        strategies=parse_names(strategies),
        pipeline_schedule=pipeline_schedule,
        epochs=epochs,
        deadline=deadline,
        sync_batchnorm=sync_batchnorm,
    )
    if plot is not None:
        profiling.profile_plot_folder(plot, scaling=bool(scaling.devices))
    result = profiling.profile(request, scaling)
    if as_json:
        print(json.dumps(profiling.profile_json(result), indent=2))
    else:
        profiling.profile_report(result, console)
    if plot is not None:
        written = profiling.profile_plots(result, plot)
        (Console(stderr=True) if as_json else console).print(
            "plots: " + ", ".join(str(p) for p in written)
        )


@user_errors
def estimate(
    spec: Path = typer.Argument(..., help="Job spec (YAML)."),
    steps: int = typer.Option(20, "--steps", help="Steps to time (after the warm-up)."),
    warmup: int = typer.Option(5, "--warmup", help="Steps run before timing starts."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run a few real steps, extrapolate the whole run, and show the roofline prediction beside."""
    from dataclasses import asdict

    from rich.table import Table

    from dlscale.units import duration

    result = api.estimate(spec, steps=steps, warmup=warmup)
    if as_json:
        print(json.dumps({**asdict(result), "ratio": result.ratio}, indent=2))
        return
    table = Table(title=f"{result.spec_name}: estimate", show_header=True, title_justify="left")
    table.add_column("")
    table.add_column("measured here", justify="right")
    table.add_column("roofline on 'local'", justify="right")
    predicted = result.predicted_step_s
    table.add_row(
        "step",
        f"{duration(result.step_s_median)} (p10 {duration(result.step_s_p10)}, "
        f"p90 {duration(result.step_s_p90)})",
        duration(predicted) if predicted else "-",
    )
    table.add_row(
        f"whole run ({result.total_steps:,} steps, {result.epochs} "
        f"epoch{'s' * (result.epochs != 1)})",
        duration(result.total_s),
        duration(result.predicted_total_s) if predicted else "-",
    )
    console.print(table)
    warmed = result.warmup_steps
    warmed = f"after {warmed} warm-up step{'s' * (warmed != 1)}" if warmed else "with no warm-up"
    past, total = "", result.total_steps
    if result.steps_measured > total:
        past = f" (more than the whole run's {total:,})"
    elif result.steps_measured + result.warmup_steps > total:
        past = f" (with the warm-up, more than the whole run's {total:,})"
    console.print(
        f"measured {result.steps_measured} steps {warmed}{past}; the whole run adds setup "
        f"({duration(result.setup_s)}) and one validation pass per epoch "
        f"({duration(result.eval_s)} each)."
    )
    if predicted:
        console.print(f"roofline / measured step time = {result.ratio:.2f}")
        if result.calibration:
            console.print(bench.calibration_line(result.calibration))
    else:
        console.print("no roofline prediction: run 'dlscale bench machine' to measure this machine")
