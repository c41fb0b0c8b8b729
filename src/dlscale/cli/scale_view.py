"""How `dlscale scale` shows its runs: throughput and efficiency, and how each count converged."""

from __future__ import annotations

from rich.table import Table

from dlscale.api import bench
from dlscale.api.experiments import ScaleResult


def scale_table(result: ScaleResult, cluster: str) -> Table:
    kind = "tensor-parallel" if result.strategy == "tensor" else "data-parallel"
    table = Table(title=f"{result.model}: {kind} scaling ({cluster})")
    columns = (
        "workers",
        "global batch",
        "samples/s",
        "per worker",
        "efficiency",
        "allreduce",
        "predicted samples/s",
        "predicted efficiency",
        "predicted / measured",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for row in result.rows:
        guess = row.predicted_samples_per_s
        table.add_row(
            str(row.workers),
            str(row.global_batch_size),
            f"{row.samples_per_s:,.0f}",
            f"{row.per_worker_samples_per_s:,.0f}",
            f"{100 * row.efficiency:.0f}%",
            f"{100 * row.allreduce_share:.0f}% of step",
            f"{guess:,.0f}" if guess else "-",
            f"{100 * row.predicted_efficiency:.0f}%" if guess else "-",
            f"{row.predicted_over_measured:.2f}" if guess else "-",
        )
    notes = [f"each worker {result.threads_per_worker} thread(s) in every run", result.note]
    if result.predicted_on:
        notes.append(f"predicted: the roofline on 'local' and {result.strategy} over {result.link}")
        if result.calibration:
            notes.append(bench.calibration_line(result.calibration))
    elif cluster == "local":
        notes.append("no prediction: run 'dlscale bench machine' first")
    table.caption = "; ".join(note for note in notes if note)
    return table


def convergence_table(result: ScaleResult) -> Table:
    """Per count: the learning rate, the final accuracy, and when the target was reached."""
    target = result.target_accuracy
    rule = result.lr_scaling or "none"
    table = Table(
        title=f"convergence: learning rate scaled '{rule}'"
        + (f", target {100 * target:.1f}%" if target is not None else "")
    )
    for column in (
        "workers",
        "global batch",
        "lr",
        "val accuracy",
        "epochs",
        "to target: epochs",
        "wall time",
        "samples seen",
    ):
        table.add_column(column, justify="right")
    for row in result.rows:
        run = row.convergence
        assert run is not None, "a scale run with convergence has it on every row"
        reached = run.epochs_to_target is not None
        table.add_row(
            str(row.workers),
            str(row.global_batch_size),
            f"{run.lr:.4g}",
            f"{100 * run.final_val_accuracy:.1f}%",
            str(run.epochs),
            str(run.epochs_to_target) if reached else "not reached" if target else "-",
            f"{run.time_to_target_s:.1f} s" if reached else "-",
            f"{run.samples_to_target:,}" if reached else "-",
        )
    return table
