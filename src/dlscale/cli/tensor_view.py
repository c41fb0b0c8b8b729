"""How `dlscale train` shows a tensor-parallel run: the plan before training, figures after."""

from __future__ import annotations

from rich.table import Table

from dlscale.units import binary_bytes


def _moves(kind: str, bytes_per_sample: int, batch: int) -> str:
    return f"{kind.replace('_', '-')} {binary_bytes(bytes_per_sample * batch)}" if kind else "-"


def plan_table(plan: dict) -> Table:
    """Each split layer: its style, its weights on one device, what it moves per step."""
    batch = plan["batch_size"]
    replicas = (
        f" × {plan['data_parallel']} data-parallel replicas" if plan["data_parallel"] > 1 else ""
    )
    table = Table(
        title=f"tensor plan ({plan['source']}): {plan['degree']} devices{replicas}; "
        f"{plan['params_per_device']:,} of {plan['params']:,} parameters on each device; "
        "other layers whole on every device",
        title_justify="left",
    )
    for column in (
        "layer",
        "kind",
        "split",
        "parameters / device",
        "forward moves",
        "backward moves",
    ):
        table.add_column(column, justify="right" if column.startswith("param") else "left")
    for layer in plan["layers"]:
        table.add_row(
            layer["name"],
            layer["kind"],
            layer["style"],
            f"{layer['params_per_device']:,} of {layer['params']:,}",
            _moves(layer["forward"], layer["forward_bytes"], batch),
            _moves(layer["backward"], layer["backward_bytes"], batch),
        )
    return table


def _collectives(entries: dict) -> str:
    if not entries:
        return "none"
    count = sum(e["count"] for e in entries.values())
    payload = sum(e["payload_bytes"] for e in entries.values())
    kinds = ", ".join(f"{e['count']:g} {k.replace('_', '-')}" for k, e in sorted(entries.items()))
    return f"{kinds} ({count:g} in all, {binary_bytes(payload)})"


def tensor_rows(table: Table, record: dict) -> None:
    """Summary rows: the mesh, the shards, what moved per step measured beside predicted."""
    tensor = record["tensor"]
    shape = f"degree {tensor['degree']}"
    if tensor["data_parallel"] > 1:
        shape += (
            f" × {tensor['data_parallel']} replicas (global batch {tensor['global_batch_size']})"
        )
    table.add_row(
        "tensor parallel",
        f"{shape}, {tensor['backend']}; {tensor['params_per_device']:,} of "
        f"{tensor['params']:,} parameters per device ({tensor['plan_source']} plan)",
    )
    table.add_row(
        "collectives / step",
        f"{_collectives(tensor['collectives_per_step'])} measured; "
        f"{_collectives(tensor['predicted_collectives_per_step'])} predicted",
    )
    table.add_row("communication", f"{tensor['comm_share']:.1%} of the step")
