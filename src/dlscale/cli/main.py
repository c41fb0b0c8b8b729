"""`dlscale`: the command-line front door. Each command is a thin shell over dlscale.api."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from dlscale import __version__, api
from dlscale.api import bench, experiments
from dlscale.cli.bench import app as bench_app
from dlscale.cli.data import app as data_app
from dlscale.cli.errors import stderr, user_errors
from dlscale.cli.hardware import app as hardware_app
from dlscale.cli.help import FlagHelpGroup
from dlscale.cli.pipes import guard_streams, stdout_closed
from dlscale.cli.predict import predict as predict_command
from dlscale.cli.profile import estimate as estimate_command
from dlscale.cli.profile import profile as profile_command
from dlscale.cli.progress import RichReporter
from dlscale.cli.remote import app as remote_app
from dlscale.cli.serve import app as serve_app
from dlscale.cli.serve_model import serve_model_command
from dlscale.cli.sweep import sweep as sweep_command
from dlscale.signals import stop_on_sigterm
from dlscale.tables import output_console

app = typer.Typer(
    name="dlscale",
    cls=FlagHelpGroup,
    help="Deep learning from a laptop CPU to a GPU cluster: profile, predict, train in parallel.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(hardware_app, name="hardware")
app.add_typer(bench_app, name="bench")
app.add_typer(data_app, name="data")
app.add_typer(serve_app, name="serve")
app.add_typer(remote_app, name="remote")
console = output_console()


def _version(value: bool) -> None:
    if value:
        console.print(f"dlscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """dlscale: does it fit, how long will it take, and train it in parallel."""


@app.command()
@user_errors
def train(
    spec: Path = typer.Argument(..., help="Job spec (YAML)."),
    out: Path | None = typer.Option(
        None, "--out", help="Run folder (default runs/<name>-<timestamp>)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the last checkpoint (of --out, or the newest run)."
    ),
    cluster: str = typer.Option(
        "local", "--cluster", help="Where parallel workers run: local processes, or ray."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Ray cluster: auto, or the head's HOST:PORT."
    ),
) -> None:
    """Train a spec: progress bar, summary table, DIR/run.json and checkpoints."""
    reporter = RichReporter(console)
    try:
        record = api.train(
            spec, out_dir=out, resume=resume, reporter=reporter, cluster=cluster, address=address
        )
    finally:
        reporter.close()
    if stdout_closed():  # the summary went nowhere: say on stderr where the result is
        stderr.print(f"training finished: {record.run_dir}/run.json")


@app.command()
@user_errors
def validate(
    spec: Path = typer.Argument(..., help="Job spec (YAML)."),
    as_json: bool = typer.Option(False, "--json", help="Print the resolved spec as JSON."),
) -> None:
    """Check a spec without running it (exit 2 and one line naming the problem if it is bad)."""
    parsed, warnings = api.validate(spec)
    if as_json:
        print(json.dumps(parsed.model_dump(mode="json"), indent=2))
    else:
        console.print(
            f"{spec}: valid ({parsed.name}: {parsed.model.name} on {parsed.data.name}, "
            f"strategy {parsed.strategy.name}, spec hash {parsed.spec_hash()})"
        )
    for message in warnings:
        Console(stderr=True).print(f"[bold yellow]warning:[/] {message}")


@app.command()
@user_errors
def models(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the model zoo with parameter counts (counted on the meta device)."""
    rows = api.models()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="dlscale model zoo")
    table.add_column("name", style="bold")
    table.add_column("parameters", justify="right")
    table.add_column("input (one sample)")
    table.add_column("what it is")
    for row in rows:
        shape = "×".join(str(d) for d in row["example_input_shape"])
        table.add_row(
            row["name"],
            f"{row['parameters']:,}",
            f"{row['input_kind']} {shape}",
            row["summary"],
        )
    console.print(table)
    console.print(
        "Counted at each factory's defaults (1000 classes for the ImageNet models). Use any of "
        "these as model.name in a spec, or your own model as 'package.module:factory'."
    )


@app.command()
@user_errors
def scale(
    spec: Path = typer.Argument(..., help="Job spec (YAML); its model, data and batch per worker."),
    workers: str = typer.Option("1,2,4", "--workers", help="Worker counts to run."),
    steps: int | None = typer.Option(
        None,
        "--steps",
        help="Training steps per run (default 50; with --lr-scaling or "
        "--target-accuracy, the spec's whole length).",
    ),
    lr_scaling: str | None = typer.Option(
        None,
        "--lr-scaling",
        help="none | linear | sqrt: grow the learning rate with the "
        "global batch; trains every count to the end and reports its accuracy.",
    ),
    target_accuracy: float | None = typer.Option(
        None,
        "--target-accuracy",
        help="Validation accuracy to reach, e.g. 0.95: epochs, time "
        "and samples to it for every count (trains every count to the end).",
    ),
    cluster: str = typer.Option("local", "--cluster", help="local processes, or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address."),
    out: Path | None = typer.Option(None, "--out", help="Output folder."),
    as_json: bool = typer.Option(False, "--json", help="Print scale.json's document."),
) -> None:
    """Train a spec with 1, 2, 4, ... data-parallel workers: throughput and scaling efficiency,
    and with --lr-scaling / --target-accuracy how the growing global batch converges."""
    from dlscale.cli.options import parse_int_list
    from dlscale.cli.scale_view import convergence_table, scale_table

    experiments.check_scale_options(lr_scaling, target_accuracy)
    bench.check_out_dir(out, "scale")  # its scale.json and .png would be replaced at the end
    folder = bench.output_dir("scale", out)
    say = Console(stderr=True, highlight=False) if as_json else console

    def show(row: dict) -> None:
        accuracy = row.get("final_val_accuracy")
        reached = f", {100 * accuracy:.1f}% validation accuracy" if accuracy is not None else ""
        say.print(
            f"{row['workers']} worker(s): {row['samples_per_s']:,.0f} samples/s "
            f"(global batch {row['global_batch_size']}){reached}"
        )

    result = experiments.scale(
        spec,
        parse_int_list(workers, "--workers", once=True),
        folder,
        steps,
        cluster,
        address,
        show,
        lr_scaling,
        target_accuracy,
    )
    json_path, png_path = bench.write_outputs("scale", result, folder)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        say.print(f"wrote {json_path} and {png_path}")
        return
    console.print(scale_table(result, cluster))
    if result.convergence:
        console.print(convergence_table(result))
    console.print(f"wrote {json_path} and {png_path}")


@app.command()
@user_errors
def compare(
    spec: Path = typer.Argument(..., help="Job spec (YAML); its model, data, batch per worker."),
    strategies: str = typer.Option(
        "ddp,averaging,async,downpour",
        "--strategies",
        help="Strategies to run: single, ddp, the ps modes averaging, async, downpour, and "
        "pipeline, hybrid, tensor.",
    ),
    workers: int = typer.Option(2, "--workers", help="Workers for every parallel strategy."),
    epochs: int | None = typer.Option(
        None, "--epochs", help="Epochs per run (default: the spec's own length)."
    ),
    cluster: str = typer.Option("local", "--cluster", help="local processes, or ray."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address."),
    out: Path | None = typer.Option(
        None, "--out", help="Output folder (default runs/bench-compare-<timestamp>)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Train a spec with each strategy at the same worker count: accuracy against wall time."""
    from dlscale.cli.progress import percent

    names = experiments.parse_strategies(strategies)
    bench.check_out_dir(out, "compare")  # its compare.json and .png would be replaced at the end
    # Created by the first run, so a bad spec or option leaves no empty folder behind.
    folder = out if out is not None else bench.new_output_dir("compare")
    say = Console(stderr=True, highlight=False) if as_json else console

    def show(row: dict) -> None:
        say.print(
            f"{row['strategy']} ({row['workers']} worker(s)): {percent(row['val_accuracy'])} "
            f"validation accuracy in {row['total_s']:.1f} s ({row['samples_per_s']:,.0f} samples/s)"
        )

    result = experiments.compare(spec, names, workers, folder, epochs, cluster, address, show)
    json_path, png_path = bench.write_outputs("compare", result, folder)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        say.print(f"wrote {json_path} and {png_path}")
        return
    table = Table(title=f"{result.model}: strategies compared, {workers} workers ({cluster})")
    table.add_column("strategy", style="bold")
    for column in ("workers", "global batch", "steps", "accuracy", "wall", "samples/s"):
        table.add_column(column, justify="right")
    table.add_column("time to target", justify="right")
    for row in result.rows:
        reached = row.time_to_target_s
        to_target = "not reached"
        if reached is not None:
            to_target = f"{reached:.1f} s (epoch {row.epochs_to_target})"
        table.add_row(
            row.strategy,
            str(row.workers),
            "-" if row.global_batch is None else str(row.global_batch),
            f"{row.steps:,}",
            percent(row.val_accuracy),
            f"{row.total_s:.1f} s",
            f"{row.samples_per_s:,.0f}",
            to_target,
        )
    console.print(table)
    console.print(
        f"target accuracy {percent(result.target_accuracy)} = {result.target_rule} "
        f"({percent(result.best_val_accuracy)}); time to target: seconds from a run's start "
        "to its first epoch end at or above it; wall: the whole run, process start-up included"
        + (f"; fastest: {result.fastest_to_target}" if result.fastest_to_target else "")
    )
    note = experiments.batch_note(result)
    if note:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"wrote {json_path} and {png_path}")


app.command(name="profile")(profile_command)
app.command(name="estimate")(estimate_command)
app.command(name="sweep")(sweep_command)
app.command(name="predict")(predict_command)
app.command(name="serve-model")(serve_model_command)


def main() -> None:
    api.exit_quickly()  # about 1 s sooner back at the prompt, once torch was imported
    stop_on_sigterm()  # `kill PID` stops a run as Ctrl-C does (signals.py)
    guard_streams()  # `| head -1` does not stop a run (cli/pipes.py)
    app()


if __name__ == "__main__":
    main()
