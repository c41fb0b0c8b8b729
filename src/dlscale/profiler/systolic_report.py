"""`dlscale profile … --dataflow ws|is|os|all`: a traced step's matrix products on each
systolic chip asked for, every dataflow side by side, and the share of the step left off the
arrays, as tables and JSON."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from dlscale.errors import UserError, once_each
from dlscale.profiler.memory import ELEMENT_BYTES
from dlscale.profiler.systolic import (
    DATAFLOWS,
    Array,
    LayerChoice,
    Unmapped,
    array_of,
    choose,
    step_gemms,
    unmapped,
)
from dlscale.profiler.systolic import totals as totals_of
from dlscale.units import binary_bytes, duration, si


@dataclass
class SystolicReport:
    hardware: str
    array: Array
    dataflows: tuple[str, ...]
    layers: list[LayerChoice]
    totals: dict[str, dict[str, float]]
    unmapped: Unmapped


def parse_dataflows(text: str) -> tuple[str, ...]:
    if text == "all":
        return DATAFLOWS
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in given if name not in DATAFLOWS]
    if unknown or not given:
        raise UserError(
            f"--dataflow: '{unknown[0] if unknown else text}' is not a dataflow; "
            f"use ws, is, os, a list of them, or all"
        )
    once_each("--dataflow", given)  # it would be mapped once: said, as --hardware twice is
    return tuple(given)


def systolic_reports(
    trace, hardware: list, dataflows: tuple[str, ...], model_name: str
) -> list[SystolicReport]:
    """The traced step's forward and backward GEMMs on each chip, and what they leave out."""
    arrays = [(device.name, array_of(device)) for device in hardware]  # one line if one lacks it
    gemms = step_gemms(trace)
    if not gemms:
        raise UserError(
            f"--dataflow: model '{model_name}' runs no matrix product to map onto an array"
        )
    left = unmapped(trace)
    element = ELEMENT_BYTES[trace.precision]
    reports = []
    for name, array in arrays:
        layers = choose(gemms, array, element, dataflows)
        reports.append(SystolicReport(name, array, dataflows, layers, totals_of(layers), left))
    return reports


def to_json(report: SystolicReport) -> dict:
    return {
        "hardware": report.hardware,
        "array": vars(report.array),
        "dataflows": list(report.dataflows),
        "totals": report.totals,
        "step_flops": report.unmapped.step_flops,
        "mapped_flops": report.unmapped.mapped_flops,
        "unmapped": {
            "flops": report.unmapped.flops,
            "share": report.unmapped.share,
            "other_flops": report.unmapped.other_flops,
            "products": report.unmapped.products,
        },
        "layers": [
            {
                "gemm": vars(choice.gemm),
                "best": choice.best,
                "reason": choice.reason,
                "by_dataflow": {
                    df: {
                        "folds": m.folds,
                        "cycles": m.cycles,
                        "utilization": m.utilization,
                        "dram_bytes": m.dram_bytes,
                        "seconds": m.seconds,
                        "bound": m.bound,
                    }
                    for df, m in choice.by_dataflow.items()
                },
            }
            for choice in report.layers
        ],
    }


def render(reports: list[SystolicReport], console: Console) -> None:
    for report in reports:
        a = report.array
        table = Table(
            title=f"{report.hardware}: {a.arrays} × {a.rows}×{a.cols} systolic arrays at "
            f"{a.clock_hz / 1e6:,.0f} MHz; cycles (PE utilisation) per dataflow",
            title_justify="left",
        )
        table.add_column("GEMM")
        table.add_column("M × K × N", justify="right")
        for df in report.dataflows:
            table.add_column(df, justify="right")
        table.add_column("best: why")
        for choice in report.layers:
            g = choice.gemm
            shape = f"{g.m:,}×{g.k:,}×{g.n:,}" + (f" ×{g.repeats}" if g.repeats > 1 else "")
            cells = [f"{m.cycles:,} ({m.utilization:.0%})" for m in choice.by_dataflow.values()]
            table.add_row(g.name, shape, *cells, f"{choice.best}: {choice.reason}")
        table.add_row(
            "total",
            "",
            *[f"{t['cycles']:,.0f} ({t['utilization']:.0%})" for t in report.totals.values()],
            "",
        )
        console.print(table)
        for df, total in report.totals.items():
            console.print(
                f"  {df}: {duration(total['seconds'])} for the step's matrix products, "
                f"{binary_bytes(total['dram_bytes'])} from DRAM"
            )
        if report.unmapped.flops:
            console.print(f"[yellow]warning:[/] {unmapped_line(report.unmapped)}")


def unmapped_line(left: Unmapped) -> str:
    """What the times above leave out, in one line."""
    vector = "elementwise ops, norms, softmax, loss and optimizer"
    parts = [f"{si(left.other_flops, 'FLOP')} of {vector}"]
    if left.products:
        ops = ", ".join(f"aten.{op}" for op in left.products)
        parts.append(f"{si(sum(left.products.values()), 'FLOP')} of matrix products by {ops}")
    return (
        f"{left.share:.1%} of the step's {si(left.step_flops, 'FLOP')} are not mapped onto the "
        f"arrays ({'; '.join(parts)}): the times above leave them out"
    )
