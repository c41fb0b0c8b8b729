"""`dlscale profile … --dataflow ws|is|os|all`: a model's layers on each systolic chip asked
for, every dataflow side by side, as tables, JSON and a chart."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from dlscale.errors import UserError
from dlscale.profiler.memory import ELEMENT_BYTES
from dlscale.profiler.systolic import DATAFLOWS, Array, LayerChoice, array_of, choose, layer_gemms
from dlscale.profiler.systolic import totals as totals_of
from dlscale.units import binary_bytes, duration


@dataclass
class SystolicReport:
    hardware: str
    array: Array
    dataflows: tuple[str, ...]
    layers: list[LayerChoice]
    totals: dict[str, dict[str, float]]


def parse_dataflows(text: str) -> tuple[str, ...]:
    if text == "all":
        return DATAFLOWS
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in DATAFLOWS]
    if unknown or not names:
        raise UserError(
            f"--dataflow: '{unknown[0] if unknown else text}' is not a dataflow; "
            f"use ws, is, os, a list of them, or all"
        )
    return names


def systolic_reports(workload, hardware: list, dataflows: tuple[str, ...]) -> list[SystolicReport]:
    """The model's forward and backward GEMMs (recorded on the meta device) on each chip."""
    import torch

    from dlscale.profiler.tensor_flow import record_flow

    arrays = [(device.name, array_of(device)) for device in hardware]  # one line if one lacks it
    if workload.inputs is not None:
        raise UserError(
            "--dataflow maps a model given one tensor input; --inputs is not supported with it"
        )
    with torch.device("meta"):
        model = workload.build()
    flow = record_flow(model, workload.sample.unsqueeze(0).to("meta"), workload.precision)
    gemms = layer_gemms(flow, workload.batch_size)
    if not gemms:
        raise UserError(
            f"--dataflow: model '{workload.model_name}' has no convolution or "
            "linear layer to map onto an array"
        )
    element = ELEMENT_BYTES[workload.precision]
    reports = []
    for name, array in arrays:
        layers = choose(gemms, array, element, dataflows)
        reports.append(SystolicReport(name, array, dataflows, layers, totals_of(layers)))
    return reports


def to_json(report: SystolicReport) -> dict:
    return {
        "hardware": report.hardware,
        "array": vars(report.array),
        "dataflows": list(report.dataflows),
        "totals": report.totals,
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
                f"  {df}: {duration(total['seconds'])} a step, "
                f"{binary_bytes(total['dram_bytes'])} from DRAM"
            )
