"""`dlscale hardware list|show`: the devices dlscale plans for, with their figures and sources."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from dlscale import api
from dlscale.api import bench
from dlscale.cli.errors import user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.tables import output_console

app = typer.Typer(
    cls=FlagHelpGroup,
    help="The hardware catalogue: peak FLOP/s, memory, links and power of known devices.",
    no_args_is_help=True,
)
console = output_console()

HARDWARE_FILES = typer.Option(
    None,
    "--hardware-file",
    metavar="<path>",  # one file each time it is given (Typer would show <list[Path]>)
    help="Extra catalogue file (TOML, repeatable); its entries replace same-named ones.",
)
AS_JSON = typer.Option(False, "--json", help="Print JSON in SI units (FLOP/s, bytes, bytes/s).")


@app.command("list")
@user_errors
def list_devices(
    as_json: bool = AS_JSON,
    hardware_files: list[Path] | None = HARDWARE_FILES,
    mig: bool = typer.Option(
        False, "--mig", help="Also list each MIG slice (PARENT:PROFILE) under its GPU."
    ),
) -> None:
    """List every known device: shipped ones, $DLSCALE_HOME/hardware/*.toml (default
    ~/.dlscale), and --hardware-file."""
    rows = api.device_links(extra_files=hardware_files, with_mig=mig)
    if as_json:
        print(json.dumps([record(device) | {"link": link} for device, link in rows], indent=2))
        return
    # Narrow terminals get the figures; names and links need room (`show` has them all).
    wide = console.width >= 140 or not console.is_terminal  # a file or a pipe: nothing cut
    table = Table(title="dlscale hardware catalogue")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("kind")
    if wide:
        table.add_column("device")
    for column in ("fp32\nTFLOP/s", "bf16/fp16\nTFLOP/s", "memory\nGiB", "bandwidth\nGB/s"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("link")
    table.add_column("TDP\nW", justify="right")
    table.add_column("$ per\nhour", justify="right")
    for device, link in rows:
        figures = [
            _number(device.peak_flops["fp32"] / 1e12),
            _half_precision(device),
            _number(device.memory_bytes / 2**30),
            _number(device.memory_bandwidth_bytes_per_s / 1e9),
        ]
        tdp = _number(device.tdp_w) if device.tdp_w else "—"
        price = f"{device.price_per_hour:.2f}" if device.price_per_hour is not None else "—"
        head = [device.display_name] if wide else []
        table.add_row(device.name, device.kind, *head, *figures, link or "—", tdp, price)
    console.print(table)
    console.print(
        "Peaks are dense (no 2:4 sparsity); a device without bf16/fp16 units trains mixed "
        "precision at its fp32 rate. link: what its copies talk over by default (see "
        "'dlscale hardware links'). $ per hour: a cloud's on-demand price per device, where one "
        "rents it. 'dlscale hardware show NAME' gives every figure's source and date."
        + ("" if mig else " --mig lists each GPU's MIG slices (a100-40gb:1g.5gb).")
    )


@app.command("show")
@user_errors
def show(
    name: str = typer.Argument(
        ..., help="Device name, e.g. a100-40gb (see 'dlscale hardware list')."
    ),
    as_json: bool = AS_JSON,
    hardware_files: list[Path] | None = HARDWARE_FILES,
) -> None:
    """Every figure of one device, with the sources it comes from and how it was derived."""
    ((device, link),) = api.device_links([name], extra_files=hardware_files)
    if as_json:
        print(json.dumps(record(device) | {"link": link}, indent=2))
        return
    table = Table(title=f"{device.display_name} ({device.name})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field, value in _rows(device, link):
        table.add_row(field, value)
    console.print(table)


@app.command("links")
@user_errors
def list_links(as_json: bool = AS_JSON, hardware_files: list[Path] | None = HARDWARE_FILES) -> None:
    """The links between devices that `dlscale profile --devices` predicts over."""
    found = api.links(extra_files=hardware_files)
    if as_json:
        print(json.dumps([dataclasses.asdict(link) for link in found], indent=2))
        return
    wide = console.width >= 110 or not console.is_terminal  # names need room; a file has it
    table = Table(title="links between devices (per device, one direction)")
    columns = ("name", *(("link",) if wide else ()), "kind", "GB/s", "latency", "efficiency")
    for column in columns:
        table.add_column(column, justify="right" if column in ("GB/s", "efficiency") else "left")
    for link in found:
        head = [link.name, *([link.display_name] if wide else [])]
        table.add_row(
            *head,
            link.kind,
            _number(link.bytes_per_s / 1e9),
            f"{link.latency_s * 1e6:g} µs",
            f"{link.efficiency:.2f}",
        )
    console.print(table)
    console.print(
        escape(
            "GB/s: per device, one direction. efficiency: the share of it a large all-reduce "
            "reaches (NCCL bus bandwidth / link rate). Sources and derivations: --json, or "
            "src/dlscale/hardware/links.toml; your own: [[link]] tables in "
            "$DLSCALE_HOME/hardware/*.toml or a --hardware-file."
        )
    )


def _price(device: api.Hardware) -> str:
    if device.price_per_hour is None:
        return "— (no cloud offer catalogued; set price_per_hour in your own entry)"
    return f"${device.price_per_hour:g}/hour ({device.price_source}, {device.price_date})"


def record(device: api.Hardware) -> dict:
    """A device as a JSON-ready dict in SI units (the Hardware fields)."""
    return dataclasses.asdict(device) | {"sources": list(device.sources)}


def _rows(device: api.Hardware, link: str | None) -> list[tuple[str, str]]:
    rows = [("kind", device.kind), ("vendor", device.vendor)]
    for precision, flops in device.peak_flops.items():  # the catalogue's order, fp64 to int4
        unit = "TOP/s" if precision.startswith("int") else "TFLOP/s"
        rows.append((f"peak {precision}", f"{_number(flops / 1e12)} {unit}"))
    if "int4" not in device.peak_flops and device.kind == "gpu":
        used = device.peak("int4")[1]
        rows.append(("peak int4", f"— (none catalogued; int4 runs at the {used} rate)"))
    rows += _cores_and_caches(device)
    rows += [
        ("memory", f"{_number(device.memory_bytes / 2**30)} GiB"),
        ("memory bandwidth", f"{_number(device.memory_bandwidth_bytes_per_s / 1e9)} GB/s"),
        ("host link", _link(device.host_link, device.host_link_bytes_per_s, "one direction")),
        ("interconnect", _link(device.interconnect, device.interconnect_bytes_per_s, "total")),
        ("default link", f"{link} (dlscale hardware links)" if link else "— (name one)"),
        ("TDP", f"{_number(device.tdp_w)} W" if device.tdp_w else "—"),
        ("price", _price(device)),
        ("compute efficiency", _compute_efficiency(device)),
        (
            "convolutions",
            "3×3 stride-1 at fp32: Winograd F(2×2, 3×3), 2.25× the direct rate"
            if device.winograd_convs
            else "at the direct count",
        ),
        ("memory efficiency", _default_marked(device.efficiency_memory, device.memory_efficiency)),
        (
            "op overhead",
            _default_marked(device.overhead_per_op_s * 1e6, device.op_overhead_s, " µs"),
        ),
        (
            "dlscale loop per step",
            _default_marked(
                device.overhead_per_step_s * 1e3, device.measured.get("loop_step_s"), " ms"
            ),
        ),
        (
            "DDP per step, fixed",
            f"{device.ddp_fixed_step_s * 1e3:.3g} ms"
            + (
                ""
                if (device.measured.get("loop") or {}).get("ddp_step_s") is not None
                else " (not measured: ddp predictions price only its copies and ops)"
            ),
        ),
        ("sources", "\n".join(device.sources) or "—"),
        ("notes", device.notes or "—"),
    ]
    rows += [("differs from", _differs_line(row)) for row in device.differs]
    if device.mig:
        profiles = ", ".join(f"{device.name}:{p}" for p in device.mig["profiles"])
        rows.append(("MIG slices", f"{profiles} ({device.mig['source']})"))
    found = bench.hardware_calibration(device)
    if found:
        rows.append(("calibration", bench.calibration_line(found)))
    if device.measured:
        rows.append(("measured", json.dumps(device.measured, indent=2)))
    return rows


def _differs_line(row: dict[str, str]) -> str:
    """One figure another source gives differently: ours, theirs with its source, and why."""
    return (
        f"{row['figure']}: ours {row['ours']}; {row['source']} gives {row['theirs']} ({row['why']})"
    )


def _cores_and_caches(device: api.Hardware) -> list[tuple[str, str]]:
    """Cores, threads and caches (CPUs), SMs and L2 (GPUs), where the entry gives them."""
    rows = []
    if device.cores:
        threads = f", {device.threads} threads" if device.threads else ""
        rows.append(("cores", f"{device.cores}{threads}"))
    if device.sm_count:
        unit = "compute units" if device.vendor == "AMD" else "SMs"
        rows.append(("multiprocessors", f"{device.sm_count} {unit}"))
    caches = [
        ("L1 data", device.l1d_kib_per_core, " KiB per core"),
        ("L2", device.l2_kib_per_core, " KiB per core"),
        ("L2", device.l2_mib, " MiB"),
        ("L3", device.l3_mib, " MiB per socket"),
    ]
    rows += [(name, f"{_number(size)}{unit}") for name, size, unit in caches if size]
    return rows


def _number(value: float) -> str:
    """3 to 4 significant figures, with thousands separators for big values."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def _half_precision(device: api.Hardware) -> str:
    """The bf16 peak, else the fp16 one (marked), else a dash."""
    if "bf16" in device.peak_flops:
        return _number(device.peak_flops["bf16"] / 1e12)
    if "fp16" in device.peak_flops:
        return f"{_number(device.peak_flops['fp16'] / 1e12)} fp16"
    return "—"


def _link(name: str | None, bytes_per_s: float | None, direction: str) -> str:
    if name is None or bytes_per_s is None:
        return "—"
    return f"{name}: {_number(bytes_per_s / 1e9)} GB/s {direction}"


def _compute_efficiency(device: api.Hardware) -> str:
    """The share of peak per precision the entry gives (with its source), then the rest."""
    rest = _default_marked(device.efficiency_compute, device.compute_efficiency)
    shares = device.compute_efficiency_by_precision
    if not shares:
        return rest
    listed = ", ".join(f"{precision} {share:.3g}" for precision, share in shares.items())
    return f"{listed} ({device.efficiency_source or 'no source given'}); others {rest}"


def _default_marked(value: float, given: float | None, unit: str = "") -> str:
    return f"{value:.3g}{unit}" + ("" if given is not None else " (default for this kind)")
