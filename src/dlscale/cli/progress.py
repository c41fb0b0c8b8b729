"""RichReporter: the live progress bar, epoch lines, warnings and the final summary table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from dlscale.cli.tensor_view import plan_table, tensor_rows
from dlscale.tables import output_console
from dlscale.units import binary_bytes, si


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def decimal(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


class RichReporter:
    """Shows a training run to a person at a terminal (and stays quiet when piped)."""

    def __init__(self, console: Console | None = None):
        self.console = console or output_console()
        self.progress: Progress | None = None
        self.task = None
        self.total_epochs = 1

    def start(self, plan: dict) -> None:
        self.total_epochs = plan["epochs"]
        resuming = plan.get("resumed") or plan["start_step"]  # step 0 too: a resume says where
        resumed = f", resuming at step {plan['start_step']}" if resuming else ""
        strategy = plan.get("strategy", "single")
        how = "" if strategy == "single" else f", {strategy} with {plan['workers']} workers"
        self.console.print(
            f"[bold]{plan['name']}[/]: {plan['model']} ({plan['parameters']:,} parameters) on "
            f"{plan['device']}, {plan['precision']}{how}; {plan['train_samples']:,} training / "
            f"{plan['val_samples']:,} validation samples; batch {plan['global_batch_size']}"
            f"{accumulated(plan)}, {run_length(plan)}{resumed}"
        )
        if "pipeline" in plan:
            self.console.print(split_table(plan["pipeline"]))
        if "tensor" in plan:
            self.console.print(plan_table(plan["tensor"]))
        self.progress = Progress(
            TextColumn("[bold blue]epoch {task.fields[epoch]}/{task.fields[epochs]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train",
            total=plan["total_steps"],
            completed=plan["start_step"],
            epoch=plan["start_step"] // plan["steps_per_epoch"] + 1,
            epochs=plan["epochs"],
            loss="-",
            rate="-",
        )

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None:
        self.progress.update(
            self.task, completed=step, epoch=epoch, loss=f"{loss:.4f}", rate=f"{samples_per_s:,.0f}"
        )

    def epoch_end(self, record: dict) -> None:
        self.progress.update(self.task, completed=record["step"])
        train_loss, val_loss = record["train_loss"], record["val_loss"]
        self.progress.console.print(
            f"epoch {record['epoch']:>3}/{self.total_epochs}  step {record['step']:>6}  "
            f"loss {decimal(train_loss)}  val loss {decimal(val_loss)}  "
            f"val acc {percent(record['val_accuracy'])}"
        )

    def warn(self, message: str) -> None:
        target = self.progress.console if self.progress else self.console
        target.print(f"[bold yellow]warning:[/] {escape(message)}")

    def finish(self, record: dict) -> None:
        self.close()
        self.console.print(summary_table(record))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def accumulated(plan: dict) -> str:
    """' (4 accumulated micro-batches of 16 a step)', or nothing for a run that steps once a
    batch."""
    k = plan.get("accumulate", 1)
    return f" ({k} accumulated micro-batches of {plan['batch_size']} a step)" if k > 1 else ""


def run_length(plan: dict) -> str:
    """'51 steps × 3 epochs = 153 steps', or for a run the spec's `steps` cuts short
    '20 steps (capped by the spec's steps; 51 per epoch)'."""
    per_epoch, epochs, total = plan["steps_per_epoch"], plan["epochs"], plan["total_steps"]
    if total == per_epoch * epochs:
        return f"{per_epoch} steps × {epochs} epoch{'s' * (epochs != 1)} = {total} steps"
    over = f" over {epochs} epochs" if epochs > 1 else ""
    return f"{total} steps{over} (capped by the spec's steps; {per_epoch} per epoch)"


def summary_table(record: dict) -> Table:
    """The run at a glance: the same rows for every strategy, then the strategy's own."""
    final, timing, plan = record["final"], record["timing"], record["plan"]
    table = Table(title=f"{record['name']}: summary", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")  # a long path folds onto more lines, never "…"
    table.add_row("validation accuracy", percent(final["val_accuracy"]))
    table.add_row("validation loss", decimal(final["val_loss"]))
    accumulate = plan.get("accumulate", 1)  # absent from runs before accumulation
    replicas = plan["global_batch_size"] // (plan["batch_size"] * accumulate)
    parts = [f"{replicas} workers"] if replicas > 1 else []
    if accumulate > 1:
        parts.append(f"{accumulate} accumulated")
    batch = f"batch {plan['global_batch_size']}"
    if parts:
        batch += " = " + " × ".join([*parts, str(plan["batch_size"])])
    table.add_row("steps", f"{final['step']:,} ({batch})")
    table.add_row(
        "wall time",
        f"{final['wall_s']:.1f} s in the trainer, from its setup ({final['setup_s']:.1f} s; the "
        "command's start-up and imports before it not counted)",
    )
    median = final["median_step_s"]
    typical = f"; median step {median * 1e3:.2f} ms" if median else ""
    table.add_row(
        "throughput",
        f"{final['train_samples_per_s']:,.0f} samples/s{typical} (after "
        f"{timing['warmup_steps']} warm-up steps)",
    )
    split = (
        f"data wait {percent(timing['data_wait_share'])} · host→device "
        f"{percent(timing['h2d_share'])} · compute {percent(timing['compute_share'])}"
    )
    if timing["comm_wait_share"]:
        split += f" · waiting on other workers {percent(timing['comm_wait_share'])}"
    table.add_row("step time split", split)
    skipped = skipped_samples(record)
    if skipped:
        table.add_row(
            "skipped samples",
            f"[yellow]{skipped:,} reads of a sample that did not decode[/] (data.skip_bad; in "
            "training, counted each epoch it is read)",
        )
    live = [w for w in record["workers"] if w["status"] == "completed"]
    if len(record["workers"]) > 1 and live:
        table.add_row(
            "per worker",
            f"{final['per_worker_samples_per_s']:,.0f} samples/s "
            f"(slowest {min(w['samples_per_s'] for w in live):,.0f})",
        )
    if "distributed" in record:
        dist = record["distributed"]
        per_step_ms = dist["allreduce_s_per_step"] * 1e3
        payload = binary_bytes(dist["allreduce_payload_bytes_per_step"])
        sent = binary_bytes(dist["bytes_sent_per_worker_per_step"])
        table.add_row(
            "allreduce",
            f"{per_step_ms:.2f} ms a step ({percent(dist['allreduce_share'])} of it, overlapping "
            f"backward); {payload} of gradients, {sent} sent per worker ({dist['backend']})",
        )
    if "ps" in record:
        ps_rows(table, record)
    if "pipeline" in record:
        pipeline_rows(table, record)
    if "tensor" in record:
        tensor_rows(table, record)
    kind = final["peak_memory_kind"].replace("_", " ")
    table.add_row("peak memory", f"{binary_bytes(final['peak_memory_bytes'])} ({kind})")
    table.add_row("run record", f"{record['run_dir']}/run.json")
    if record["checkpoints"]:
        table.add_row("last checkpoint", record["checkpoints"][-1])
    return table


def skipped_samples(record: dict) -> int:
    """Reads skipped by data.skip_bad in training, over the run's data-parallel slices: the
    trainers of one slice (a tensor group's shards, a pipeline's stages) read the same samples,
    so each slice counts once; the slices' samples are disjoint, so they add up (the record's
    `timing` is one trainer's)."""
    slices: dict[int, int] = {}
    for worker in record["workers"]:
        if isinstance(worker, dict) and worker.get("bad_samples"):
            rank = worker.get("data_rank", worker.get("rank", 0))
            slices[rank] = max(slices.get(rank, 0), worker["bad_samples"])
    return sum(slices.values()) or record["timing"].get("bad_samples") or 0


def ps_rows(table: Table, record: dict) -> None:
    """Parameter-server figures: updates, traffic, staleness, waiting, per-server load."""
    ps = record["ps"]
    table.add_row(
        "parameter servers",
        f"{ps['mode']}: {ps['workers']} workers, {ps['servers']} server(s); {ps['updates']:,} "
        f"updates ({ps['updates_per_s']:,.1f}/s), {binary_bytes(ps['bytes_per_s'])}/s moved "
        f"({ps['data_plane']})",
    )
    live = [w for w in record["workers"] if w["status"] == "completed"]
    waits = ", ".join(f"worker {w['rank']} {percent(w['comm_wait_share'])}" for w in live)
    table.add_row("workers waiting", f"{waits} of its step time, waiting on pull and push")
    if ps["mode"] != "averaging":
        table.add_row(
            "staleness",
            f"mean {ps['mean_staleness']:.2f}, max {ps['max_staleness']} (updates behind the "
            "server when applied)",
        )
    load = ", ".join(
        f"#{s['shard']} {s['elements']:,} params {s['updates']:,} updates" for s in ps["per_server"]
    )
    table.add_row("per server", load)
    if ps["dropped_workers"]:
        table.add_row("dropped workers", ", ".join(str(w) for w in ps["dropped_workers"]))


def split_table(split: dict) -> Table:
    """The stages a pipeline will train, as planned: layers, parameters, FLOPs, memory."""
    table = Table(
        title=f"pipeline stages (balanced by {split['balanced_by']})", title_justify="left"
    )
    for column in ("stage", "layers", "parameters", "FLOPs / microbatch", "memory (predicted)"):
        table.add_column(column, justify="left" if column == "layers" else "right")
    for stage in split["stages"]:
        layers = stage["units"]
        shown = layers[0] if len(layers) == 1 else f"{layers[0]} … {layers[-1]} ({len(layers)})"
        table.add_row(
            str(stage["index"] + 1),
            shown,
            f"{stage['params']:,}",
            si(stage["flops"]),
            binary_bytes(stage["memory_bytes"]),
        )
    return table


def pipeline_rows(table: Table, record: dict) -> None:
    """Pipeline figures: the schedule, each stage's busy share, the bubble (measured, predicted)."""
    pipe = record["pipeline"]
    shape = f"{pipe['stages']} stages"
    if pipe["data_parallel"] > 1:
        shape = f"{pipe['data_parallel']} replicas × {shape}"
    table.add_row(
        "pipeline",
        f"{shape}, {pipe['schedule']}, {pipe['microbatches']} microbatch(es); split before "
        f"{', '.join(pipe['split']) or '-'}",
    )
    busy = ", ".join(
        f"#{s['index'] + 1} {percent(s['busy_s'] / s['schedule_s'] if s['schedule_s'] else 0)}"
        for s in pipe["per_stage"]
    )
    table.add_row("stage busy", f"{busy} of each schedule step")
    rule = "(none in steady state)" if pipe["schedule"] == "2bw" else "((S − 1) / (M + S − 1))"
    slots = pipe["bubble_slots"]
    table.add_row(
        "bubble",
        f"{percent(pipe['bubble_measured'])} measured, {percent(pipe['bubble_predicted'])} "
        f"predicted {rule}; counted: {slots['idle_slots']:,} of "
        f"{slots['slots'] * pipe['stages']:,} stage slots idle, "
        f"{slots['steady_idle_slots']:,} in steady state",
    )
    if pipe["schedule"] == "2bw":
        table.add_row(
            "staleness",
            f"mean {pipe['mean_staleness']:.2f}, max {pipe['max_staleness']} (updates behind the "
            "weights a gradient was computed on)",
        )
