"""`dlscale bench ...`: measure this machine, and the field's classic scaling experiments."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from dlscale.api import bench
from dlscale.cli import bench_formats
from dlscale.cli.bench_io import io_command
from dlscale.cli.bench_link import link_command
from dlscale.cli.errors import user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.cli.options import parse_int_list, parse_kwargs
from dlscale.cli.profile import shape_list
from dlscale.cli.progress import percent
from dlscale.errors import UserError
from dlscale.tables import output_console
from dlscale.units import binary_bytes
from dlscale.units import duration as seconds

app = typer.Typer(
    name="bench",
    cls=FlagHelpGroup,
    help="Measure this machine, and rerun the field's classic scaling experiments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = output_console()
app.command(name="precision")(bench_formats.precision)
app.command(name="sparsity")(bench_formats.sparsity)
app.command(name="levels")(bench_formats.levels)

OUT_HELP = (
    "Output folder for the JSON and PNG (default runs/bench-<name>-<timestamp>); one that "
    "holds this bench's results already is refused."
)


def giga(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value / 1e9:,.1f}{unit}"


def print_written(json_path: Path, png_path: Path) -> None:
    console.print(f"wrote {json_path} and {png_path}")


# ------------------------------------------------------------------------------ machine


@app.command()
@user_errors
def machine(
    quick: bool = typer.Option(
        False, "--quick", help="Fewer sizes, shorter timings: a few minutes instead of several."
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
    no_save: bool = typer.Option(
        False, "--no-save", help="Do not save the result as the 'local' hardware entry."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Save even an unreliable measurement, or over a saved 'local' entry of better "
        "quality.",
    ),
    device: str = typer.Option(
        "auto", "--device", help="auto (cuda if visible, else cpu) | cpu | cuda."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        help="Intra-op threads (default: torch's, one a core); the spec's `threads`, to predict "
        "runs that set it.",
    ),
) -> None:
    """Measure matmul FLOP/s, memory bandwidth, host link and per-op overhead; save as 'local'."""
    bench.check_out_dir(out, "machine")  # a bad --out is one line now, not after the bench
    bench.check_machine_options(device, threads)
    # 1–3 minutes with --quick on the 2-core development machine (2026-11-29), several without.
    took = "a few minutes with --quick" if quick else "several minutes; --quick takes fewer"
    console.print(f"measuring this machine ({took}) ...")
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as shown:  # at a terminal: a spinner and the time so far (nothing in a file or a pipe)
        shown.add_task("measuring", total=None)
        result = bench.bench_machine(quick=quick, device=device, threads=threads)
    problems = bench.calibration_problems(result)  # before the JSON is written: it is marked
    console.print(matmul_sweep_table(result))
    console.print(machine_table(result))
    json_path, png_path = bench.write_outputs("machine", result, out)
    print_written(json_path, png_path)
    for warning in result.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")
    spread = result["spread"]
    console.print(
        f"{spread['probes']} probes timed in rounds: median spread {spread['median']:.0%}, worst "
        f"{spread['worst']:.0%}; load average {result['load']['loadavg_1m_before']:.1f} on "
        f"{result['load']['cores']} cores when it started"
    )
    reason = None if force or no_save else bench.worse_than_saved(result)
    if no_save:
        console.print("not saved as hardware 'local' (--no-save)")
    elif problems and not force:
        saved = bench.saved_local_measured_at()
        kept = (
            f"the saved 'local' entry (measured {saved[:16]}) is kept"
            if saved
            else "predictions have no 'local' entry until a reliable measurement is saved"
        )
        console.print(
            f"[yellow]not saved as hardware 'local':[/] its readings are unreliable "
            f"({'; '.join(problems)}); they are kept in {json_path} only, and {kept}. Run "
            "'dlscale bench machine' again when the machine is idle ('--force' saves these, "
            "marked unreliable)"
        )
    elif reason:
        console.print(
            f"[yellow]not saved:[/] this measurement is worse than the saved 'local' entry "
            f"({reason}); the saved one is kept ('--force' saves this one anyway)"
        )
    else:
        marked = ", marked unreliable" if problems else ""
        console.print(f"saved as hardware 'local'{marked}: {bench.save_local_hardware(result)}")


def matmul_sweep_table(result: dict) -> Table:
    precisions = list(dict.fromkeys(row["precision"] for row in result["matmul"]))
    table = Table(title=f"matmul GFLOP/s, {result['name']} ({result['device']})")
    table.add_column("n", justify="right", style="bold")
    for precision in precisions:
        table.add_column(precision, justify="right")
    for size in sorted({row["size"] for row in result["matmul"]}):
        cells = {
            row["precision"]: row["flops_per_s"] for row in result["matmul"] if row["size"] == size
        }
        table.add_row(str(size), *(giga(cells.get(p)) for p in precisions))
    for precision, sizes in result["matmul_skipped_as_slow"].items():
        table.caption = f"{precision}: sizes {sizes} skipped (a smaller product took over 0.5 s)"
    return table


def machine_table(result: dict) -> Table:
    table = Table(title="this machine, measured")
    table.add_column("what", style="bold")
    table.add_column("measured", justify="right")
    for precision, flops in result["peak_flops"].items():
        table.add_row(f"peak matmul {precision}", giga(flops, " GFLOP/s"))
    bandwidth = result["bandwidth"]
    size = binary_bytes(bandwidth["tensor_bytes"])
    table.add_row(f"memory copy ({size} tensors)", giga(bandwidth["copy_bytes_per_s"], " GB/s"))
    table.add_row(f"memory triad ({size} tensors)", giga(bandwidth["triad_bytes_per_s"], " GB/s"))
    link = result["host_link"]
    if link:
        for memory in ("pinned", "pageable"):
            for direction, arrow in (("h2d", "host→device"), ("d2h", "device→host")):
                rate = link[f"{memory}_{direction}_bytes_per_s"]
                table.add_row(f"{arrow}, {memory}", giga(rate, " GB/s"))
    overhead = result["op_overhead_s"]
    table.add_row("per-op overhead: add of 1 element", seconds(overhead["add_s"]))
    table.add_row("per-op overhead: 8×8 matmul", seconds(overhead["mm_s"]))
    table.add_row("per-op overhead in a training step", seconds(result["training_op_overhead_s"]))
    loop = result.get("loop")
    if loop:
        table.add_row(
            "dlscale's loop per step, beyond the ops",
            f"{seconds(loop['loop_step_s'])} (a tiny model's step: "
            f"{seconds(loop['probe_step_s'])} in the loop, {seconds(loop['bare_step_s'])} bare)",
        )
    if loop and loop.get("ddp_step_s") is not None:
        table.add_row(
            "DDP per step, beyond the bare step",
            f"{seconds(loop['ddp_step_s'])} (the tiny model under DDP in a one-process group: "
            f"{seconds(loop['ddp_probe_step_s'])}, {seconds(loop['ddp_bare_step_s'])} bare)",
        )
    shares = ", ".join(
        f"{binary_bytes(size)} {share:.2f}×" for size, share in result["optimizer_efficiency"]
    )
    table.add_row("Adam update / stream bandwidth, by tensor working set", shares)
    cache = result["last_level_cache_bytes"]
    cache_text = binary_bytes(cache) if cache else "unknown"
    held = result.get("effective_cache_bytes")
    if cache and held is not None:
        cache_text += f" (this process holds {binary_bytes(held)})"
    table.add_row(
        "memory / last-level cache", f"{binary_bytes(result['memory_bytes'])} / {cache_text}"
    )
    table.add_row("torch, threads", f"{result['torch_version']}, {result['threads']}")
    table.add_row("bench time", f"{result['elapsed_s']:.1f} s")
    return table


# ------------------------------------------------------------------------------- matmul


@app.command()
@user_errors
def matmul(
    sizes: str | None = typer.Option(None, "--sizes", help="Matrix sizes, e.g. 64,128,256."),
    precision: str = typer.Option("fp32", "--precision", help="fp64 | fp32 | tf32 | bf16 | fp16."),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """CPU vs GPU matmul time and FLOP/s across sizes: where the accelerator starts to win."""
    bench.check_out_dir(out, "matmul")  # a bad --out is one line now, not after the bench
    size_list = parse_int_list(sizes, "--sizes", once=True) if sizes is not None else None
    result = bench.bench_matmul(size_list, precision)
    console.print(matmul_table(result))
    print_written(*bench.write_outputs("matmul", result, out))


def matmul_table(result: dict) -> Table:
    has_gpu = result["gpu_available"]
    versus = f"CPU vs {result['gpu']}" if has_gpu else "CPU"
    table = Table(title=f"{result['precision']} matmul (n×n @ n×n), {versus}")
    columns = ["n", "CPU time", "CPU GFLOP/s"]
    if has_gpu:
        columns += ["GPU time", "GPU GFLOP/s", "GPU + copies", "faster"]
    for name in columns:
        table.add_column(name, justify="right")
    for row in result["rows"]:
        cells = [str(row["size"]), seconds(row["cpu_time_s"]), giga(row["cpu_flops_per_s"])]
        if has_gpu:
            cells += [
                seconds(row["gpu_time_s"]),
                giga(row["gpu_flops_per_s"]),
                seconds(row["gpu_with_transfer_time_s"]),
                faster(row),
            ]
        table.add_row(*cells)
    notes = [result["note"]] if result["note"] else []
    if has_gpu:
        with_copies = from_size(result["gpu_wins_with_transfer_from_size"])
        notes.append(
            f"GPU faster {from_size(result['gpu_wins_from_size'])}; counting the copies of both "
            f"operands there and the result back, {with_copies}"
        )
    table.caption = "; ".join(notes)
    return table


def from_size(size: int | None) -> str:
    return f"from n = {size}" if size is not None else "at none of these sizes"


def faster(row: dict) -> str:
    if row.get("skipped"):
        return "not timed (memory)"
    if row["cpu_time_s"] is None:
        return "GPU (CPU not timed)"
    if row["gpu_with_transfer_time_s"] < row["cpu_time_s"]:
        return "GPU, even with copies"
    return "GPU, without copies" if row["gpu_time_s"] < row["cpu_time_s"] else "CPU"


# ------------------------------------------------------------------------------- loader


@app.command()
@user_errors
def loader(
    spec: Path | None = typer.Option(
        None, "--spec", help="Job spec to train (default: synthetic 3×32×32 images, an MLP)."
    ),
    workers: str = typer.Option("0,1,2", "--workers", help="DataLoader worker counts, e.g. 0,1,2."),
    steps: int = typer.Option(
        bench.default_loader_steps(), "--steps", help="Training steps per setting."
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Training throughput vs DataLoader workers and pin_memory, with per-sample loading."""
    bench.check_out_dir(out, "loader")  # a bad --out is one line now, not after the bench
    worker_counts = parse_int_list(workers, "--workers", minimum=0, once=True)
    result = bench.bench_loader(spec, worker_counts, steps)
    console.print(loader_table(result))
    print_written(*bench.write_outputs("loader", result, out))


def loader_table(result: dict) -> Table:
    title = f"{result['spec']}: {result['model']}, batch {result['batch_size']}"
    table = Table(title=f"{title} on {result['device']}")
    table.add_column("loading", no_wrap=True)
    for name in ("workers", "pin", "samples/s", "step", "data", "h2d", "compute"):
        table.add_column(name, justify="right")
    for row in result["rows"]:
        table.add_row(
            row["loading"],
            str(row["workers"]),
            "yes" if row["pin_memory"] else "no",
            f"{row['samples_per_s']:,.0f}",
            seconds(row["step_time_s"]) + _loader_spread(row),
            percent(row["data_wait_share"]),
            percent(row["h2d_share"]),
            percent(row["compute_share"]),
        )
    notes = [
        "in-memory: whole batches gathered from tensors; per-sample: each sample cropped, "
        "resized, flipped, jittered and normalised on its own",
        "data, h2d, compute: shares of the step spent waiting for the batch, copying it to the "
        "device, and in forward, backward and update",
        f"steady state (the first {result['warmup_steps_excluded']} steps left out)",
    ]
    if any(row.get("noisy") for row in result["rows"]):
        notes.append(
            "noisy: its steps varied by more than 25% (something else ran): rerun on an idle "
            "machine before comparing the rows"
        )
    table.caption = "; ".join([*notes, *([result["note"]] if result["note"] else [])])
    return table


def _loader_spread(row: dict) -> str:
    """' ±12%' (90th over 10th percentile of its steps), ' … noisy' past 25%; nothing for a
    result saved before the spread was kept."""
    if "step_spread" not in row:
        return ""
    return f" ±{row['step_spread']:.0%}" + (" noisy" if row.get("noisy") else "")


# ----------------------------------------------------------------------------------- io

app.command(name="io")(io_command)
app.command(name="link")(link_command)


# -------------------------------------------------------------------------------- width


@app.command()
@user_errors
def width(
    widths: str = typer.Option(
        "128,256,512,1024,2048,4096,8192",
        "--widths",
        help="Hidden widths w: the MLP has two hidden layers of w units.",
    ),
    batch: int = typer.Option(64, "--batch", help="Batch size of each training step."),
    dataset_size: int = typer.Option(
        bench.default_dataset_size(),
        "--dataset-size",
        help="Samples in an epoch, for the '1,000 epochs would take' column (default: MNIST's).",
    ),
    threads: int | None = typer.Option(
        None, "--threads", help="Intra-op threads (default: torch's, one a core)."
    ),
    memory_limit: str | None = typer.Option(
        None,
        "--memory-limit",
        help="Time each width on the CPU in a cgroup of this much memory (e.g. 1GiB): the "
        "memory wall.",
    ),
    swap: str | None = typer.Option(
        None,
        "--swap",
        help="Swap the cgroup may use past --memory-limit (default twice the limit); a swap "
        "file is added for the run if the machine has less free.",
    ),
    swap_dir: Path | None = typer.Option(
        None, "--swap-dir", help="Folder for that swap file (default $DLSCALE_HOME)."
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """An MLP's training-step time as its width grows, against each cache and RAM (with
    --memory-limit, past it into swap), and what 1,000 epochs would take."""
    bench.check_out_dir(out, "width")  # a bad --out is one line now, not after the bench
    if batch < 1:
        raise UserError(f"--batch: must be a positive integer (got {batch})")
    result = bench.bench_width(
        parse_int_list(widths, "--widths", once=True),
        batch,
        dataset_size,
        threads,
        memory_limit,
        swap,
        swap_dir,
    )
    for warning in result.get("warnings", []):
        console.print(f"warning: {escape(warning)}", soft_wrap=True)
    console.print(width_table(result))
    print_written(*bench.write_outputs("width", result, out))


def width_table(result: dict) -> Table:
    title = (
        f"mlp(hidden=[w, w]) training steps, batch {result['batch_size']}, {result['device']}, "
        f"{result['threads']} thread(s)"
    )
    table = Table(title=escape(title))
    columns = ("w", "parameters", "working set", "fits in", "step (±spread)", "per param")
    for name in (*columns, "GFLOP/s", "1,000 epochs", "note"):
        table.add_column(name, justify="left" if name in ("fits in", "note") else "right")
    for row in result["rows"]:
        per_param = row["time_per_parameter_s"]
        step = seconds(row["step_time_s"])
        if row["step_spread"] is not None:
            step += f" ±{row['step_spread']:.0%}"
        noisy = bench.is_noisy(row["step_spread"])
        table.add_row(
            str(row["width"]),
            f"{row['parameters']:,}",
            binary_bytes(row["memory_estimate_bytes"]),
            row["level"],
            step,
            "-" if per_param is None else f"{per_param * 1e9:.2f} ns",
            giga(row["flops_per_s"]),
            seconds(row["thousand_epochs_s"]),
            row["skipped"] or ("noisy" if noisy else ""),
        )
    notes = width_notes(result)
    if any(bench.is_noisy(row["step_spread"]) for row in result["rows"]):
        notes.append(
            "noisy: its steps spread over 25% (something else ran): its time and GFLOP/s are "
            "not the width's; rerun on an idle machine"
        )
    table.caption = "; ".join(notes)
    return table


def width_notes(result: dict) -> list[str]:
    """The caption: what the working set is, each level's size and the width that leaves it."""
    crossed = result["working_set_exceeds_from_width"]
    levels = []
    for level in result["levels"]:
        first = crossed[level["name"]]
        leaves = f"exceeded from w = {first}" if first is not None else "never exceeded"
        levels.append(f"{level['name']} {binary_bytes(level['bytes'])} ({leaves})")
    notes = [
        "working set: weights, gradients, Adam's two moments (16 B a parameter) and activations",
        ", ".join(levels),
        f"1,000 epochs of {result['dataset_size']:,} samples",
    ]
    limit = result["memory_limit_bytes"]
    if limit:
        notes.append(
            f"RAM here: a cgroup of {binary_bytes(limit)} less the measuring process's own "
            f"{binary_bytes(result['process_baseline_bytes'])}, with "
            f"{binary_bytes(result['swap_bytes'])} of swap past it"
        )
    else:
        notes.append("RAM here: the free memory (widths over half of it are skipped)")
    return notes


@app.command()
@user_errors
def batch(
    model: str = typer.Option("lenet", "--model", help="A zoo model (or package.module:factory)."),
    batches: str = typer.Option(
        ",".join(str(b) for b in bench.default_batches()), "--batches", help="Batch sizes to try."
    ),
    kwargs: str | None = typer.Option(None, "--kwargs", help="Model kwargs as JSON."),
    steps: int = typer.Option(5, "--steps", help="Timed steps per batch size."),
    memory_fraction: float = typer.Option(
        0.5, "--memory-fraction", help="Share of free memory a batch may be predicted to use."
    ),
    input_shape: str | None = typer.Option(
        None, "--input-shape", help="One sample's shape, e.g. 3,32,32 (a model outside the zoo)."
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Throughput vs batch size until memory runs out, with the roofline's curve beside it."""
    bench.check_out_dir(out, "batch")  # a bad --out is one line now, not after the bench
    if steps < 1:
        raise UserError(f"--steps: must be a positive integer (got {steps})")
    model_kwargs = parse_kwargs(kwargs)
    shape = None
    if input_shape is not None:  # 3,32,32 or 3x32x32, as profile takes it
        shape = parse_int_list(shape_list(input_shape), "--input-shape")
    result = bench.bench_batch(
        model,
        parse_int_list(batches, "--batches", once=True),
        model_kwargs,
        steps,
        memory_fraction,
        shape,
    )
    console.print(batch_table(result))
    print_written(*bench.write_outputs("batch", result, out))


def batch_table(result: dict) -> Table:
    title = f"{result['model']}: training throughput vs batch size, {result['device']}"
    table = Table(title=escape(title))
    for name in (
        "batch",
        "memory (predicted)",
        "measured step",
        "samples/s",
        "predicted step",
        "predicted samples/s",
        "status",
    ):
        table.add_column(name, justify="left" if name == "status" else "right")
    for row in result["rows"]:
        table.add_row(
            str(row["batch_size"]),
            binary_bytes(row["predicted_memory_bytes"]),
            seconds(row["measured_step_s"]),
            f"{row['measured_samples_per_s']:,.0f}" if row["measured_step_s"] else "-",
            seconds(row["predicted_step_s"]),
            f"{row['predicted_samples_per_s']:,.0f}" if row["predicted_step_s"] else "-",
            row["status"],
        )
    budget = binary_bytes(result["memory_budget_bytes"])
    note = "" if result["predicted_on"] else "; no prediction: run 'dlscale bench machine' first"
    if result.get("calibration"):
        note += f"; predicted on {bench.calibration_line(result['calibration'])}"
    table.caption = f"memory budget {budget} (a share of free memory){note}"
    return table
