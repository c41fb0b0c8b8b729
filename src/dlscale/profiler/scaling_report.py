"""Many devices, per device kind: the predicted points with their cost and energy, the deadline
pick, as JSON and as tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.console import Console

from dlscale import units
from dlscale.errors import UserError
from dlscale.hardware.device import Hardware
from dlscale.hardware.links import Link, device_link, load_links
from dlscale.profiler import ProfileResult
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION
from dlscale.profiler.columns import Column, print_fitted
from dlscale.profiler.memory import training_memory
from dlscale.profiler.request import ScalingRequest
from dlscale.profiler.scaling import ScalePoint, predict_scaling
from dlscale.profiler.tensor_plan import plans_for
from dlscale.units import duration


@dataclass
class Costed:
    """A point with what an epoch and the whole run take, cost and use."""

    point: ScalePoint
    epoch_s: float | None
    run_s: float | None
    cost_epoch: float | None  # USD
    cost_run: float | None
    energy_epoch_kwh: float | None  # at TDP: an upper bound
    energy_run_kwh: float | None
    # Whole global batches in an epoch (None: no data set size); 0 where the global batch passes
    # the data set: no step, so no epoch time, cost or energy, and never the deadline's pick.
    steps_per_epoch: int | None = None


@dataclass
class ScalingReport:
    hardware: Hardware
    link: Link
    rows: list[Costed]
    epochs: int
    epochs_from: str  # "spec", "--epochs" or "default"
    deadline_s: float | None = None
    pick: Costed | None = None
    other_links: dict[str, list[ScalePoint]] = field(default_factory=dict)  # for the plot
    network: Link | None = None  # between nodes, where the devices span `nodes` of them
    nodes: int = 1
    dataset_size: int | None = None  # samples an epoch
    fits_one_device: bool = True  # the whole training step in one device's usable memory


def cost_and_energy(hardware: Hardware, seconds: float | None, devices: int = 1):
    """(USD, kWh) of `devices` of `hardware` for `seconds`: the price per device-hour, and TDP
    (an upper bound on the power drawn); None where the entry lacks either, or no time."""
    if seconds is None:
        return None, None
    hours = devices * seconds / 3600  # device-hours
    price, tdp = hardware.price_per_hour, hardware.tdp_w
    return (
        hours * price if price is not None else None,
        hours * tdp / 1000 if tdp is not None else None,
    )


def costed(point: ScalePoint, hardware: Hardware, dataset_size: int | None, epochs: int):
    if not dataset_size:
        return Costed(point, None, None, None, None, None, None)
    steps = dataset_size // point.global_batch
    if steps == 0:
        return Costed(point, None, None, None, None, None, None, steps_per_epoch=0)
    epoch_s = steps * point.step_s
    cost, energy = cost_and_energy(hardware, epoch_s, point.devices)
    return Costed(
        point,
        epoch_s,
        epoch_s * epochs,
        cost,
        cost * epochs if cost is not None else None,
        energy,
        energy * epochs if energy is not None else None,
        steps,
    )


def deadline_pick(rows: list[Costed], deadline_s: float) -> Costed | None:
    """The cheapest point whose whole run meets the deadline (by price, else device-hours)."""
    meeting = [r for r in rows if r.point.fits and r.run_s is not None and r.run_s <= deadline_s]
    if not meeting:
        return None

    def cost(row: Costed) -> tuple:
        device_hours = row.point.devices * row.run_s
        return (row.cost_run if row.cost_run is not None else device_hours, row.point.devices)

    return min(meeting, key=cost)


def scaling_links(
    hardware: list[Hardware], request: ScalingRequest, links: dict[str, Link]
) -> tuple[dict[str, Link], dict[str, str]]:
    """Each device's link for the scaling (`request.interconnect`, else its own, from `links`),
    and the devices left out, each with why: an entry with no such link (a CPU's has none) is
    left out where others are scaled, and is the error where none would be."""
    found: dict[str, Link] = {}
    skipped: dict[str, UserError] = {}
    for device in hardware:
        try:
            found[device.name] = device_link(device, request.interconnect, links)
        except UserError as exc:
            skipped[device.name] = exc
    if not found:
        raise next(iter(skipped.values()))
    return found, {name: str(exc) for name, exc in skipped.items()}


def scaling_reports(
    profile: ProfileResult, request: ScalingRequest, link_files: tuple[Path, ...] = ()
) -> list[ScalingReport]:
    """The profiled step on `request.devices` of each profiled device, costed over the run's
    epochs (`request`'s, else the spec's, else one); `link_files`: the user's hardware files,
    which may hold [[link]] tables."""
    trace, workload = profile.trace, profile.workload
    # The auto tensor-parallel plan per degree (none for a model given --inputs: its plan is
    # drawn from one tensor input).
    tensor_plans = (
        plans_for(workload.build, workload.sample, trace.params, workload.precision)
        if workload.inputs is None
        else None
    )
    hardware = [report.hardware for report in profile.reports]
    dataset_size = workload.dataset_size
    epochs = request.epochs or workload.epochs or 1
    epochs_from = "--epochs" if request.epochs else "spec" if workload.epochs else "default"
    deadline_s = request.deadline_s
    if deadline_s is not None and not dataset_size:
        raise UserError("--deadline needs the epoch's size: give --dataset-size (or a spec)")
    links = load_links(list(link_files))
    device_links, skipped = scaling_links(hardware, request, links)
    profile.scaling_skipped = skipped
    hardware = [device for device in hardware if device.name in device_links]
    network = device_link(hardware[0], request.network, links) if request.nodes > 1 else None
    if workload.sync_batchnorm:  # the spec trains with it: its ddp points pay for it
        request = replace(request, sync_batchnorm=True)
    ddp_only = replace(request, strategies=("ddp",))
    reports = []
    for device in hardware:
        link = device_links[device.name]
        points = predict_scaling(
            trace,
            device,
            request,
            link,
            network,
            tensor_plans=tensor_plans,
            accumulate=workload.accumulate,
            pinned=workload.pinned,
            fresh_pages=workload.fresh_pages,
        )
        rows = [costed(p, device, dataset_size, epochs) for p in points]
        report = ScalingReport(device, link, rows, epochs, epochs_from, deadline_s)
        report.network, report.nodes = network, request.nodes
        report.dataset_size = dataset_size
        usable = device.memory_bytes * USABLE_MEMORY_FRACTION
        report.fits_one_device = training_memory(trace).total_bytes <= usable
        if deadline_s is not None:
            report.pick = deadline_pick(rows, deadline_s)
        for choice in ("nvlink", "pcie"):
            try:
                other = device_link(device, choice, links)
            except UserError:
                continue
            if other.name != link.name:
                report.other_links[other.name] = predict_scaling(
                    trace,
                    device,
                    ddp_only,
                    other,
                    network,
                    accumulate=workload.accumulate,
                    pinned=workload.pinned,
                    fresh_pages=workload.fresh_pages,
                )
        reports.append(report)
    return reports


def _link_json(link: Link) -> dict:
    return {
        "name": link.name,
        "display_name": link.display_name,
        "bytes_per_s": link.bytes_per_s,
        "latency_s": link.latency_s,
        "efficiency": link.efficiency,
        "launch_s": link.launch_s,
        "overlap": link.overlap,
        "contention": link.contention,
    }


def to_json(report: ScalingReport) -> dict:
    def row(r: Costed) -> dict:
        return {**asdict(r.point), **{k: v for k, v in asdict(r).items() if k != "point"}}

    return {
        "hardware": report.hardware.name,
        "link": _link_json(report.link),
        "nodes": report.nodes,
        "network": _link_json(report.network) if report.network else None,
        "price_per_hour": report.hardware.price_per_hour,
        "price_source": report.hardware.price_source,
        "price_date": report.hardware.price_date,
        "tdp_w": report.hardware.tdp_w,
        "epochs": report.epochs,
        "epochs_from": report.epochs_from,
        "points": [row(r) for r in report.rows],
        "deadline_s": report.deadline_s,
        "pick": row(report.pick) if report.pick else None,
    }


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _energy(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} kWh"


SCALING_COLUMNS = [
    Column("devices", 0),
    Column("strategy", 0, "left"),
    Column("step", 2),
    Column("samples/s", 3),
    Column("efficiency", 4),
    Column("comm exposed", 6),
    Column("bound", 5, "left"),
    Column("fits", 1),  # does it fit: the first question, the last column left out
    Column("epoch", 8),
    Column("cost / epoch", 9),
    Column("energy / epoch", 11),
    Column("whole run", 7),
    Column("cost / run", 10),
]


def render(reports: list[ScalingReport], console: Console) -> None:
    for report in reports:
        hw, link = report.hardware, report.link
        title = f"{hw.name} × N over {_link_words(link)}"
        if report.network is not None:
            title += (
                f" within a node, between {report.nodes} nodes over {_link_words(report.network)}"
            )
        rows = []
        for r in report.rows:
            p = r.point
            mark = " ◀" if report.pick is r else ""
            rows.append(
                [
                    f"{p.devices}{mark}",
                    p.strategy,
                    duration(p.step_s),
                    f"{p.samples_per_s:,.0f}",
                    f"{p.efficiency:.0%}",
                    duration(p.comm_s),
                    p.bound,
                    "yes" if p.fits else "[red]no[/]",
                    duration(r.epoch_s),
                    _money(r.cost_epoch),
                    _energy(r.energy_epoch_kwh),
                    duration(r.run_s),
                    _money(r.cost_run),
                ]
            )
        price = (
            f"${hw.price_per_hour}/device-hour ({hw.price_source}, {hw.price_date})"
            if hw.price_per_hour is not None
            else "no price in the catalogue (set price_per_hour in your own entry)"
        )
        weak = "weak scaling: each device keeps the batch (pipeline and tensor split it)"
        accumulate = max((r.point.detail.get("accumulate", 1) for r in report.rows), default=1)
        if accumulate > 1:
            weak = (
                f"weak scaling: each device keeps the batch, as accumulate: {accumulate} "
                "micro-batches a step: ddp with one all-reduce, tensor with each "
                "micro-batch's collectives and one update (ps and pipeline do not accumulate)"
            )
        notes = {
            "devices": weak,
            "cost / epoch": price,
            "energy / epoch": (
                f"energy at TDP {hw.tdp_w:g} W (an upper bound)"
                if hw.tdp_w
                else "no TDP in this device's entry: no energy (set tdp_w in your own entry)"
            ),
            "whole run": f"whole run = {report.epochs} epoch(s) ({report.epochs_from})",
        }
        print_fitted(console, title, SCALING_COLUMNS, rows, notes)
        short = [r.point for r in report.rows if r.steps_per_epoch == 0]
        if short:
            named = ", ".join(
                f"{p.devices} × {p.strategy} (global batch {p.global_batch})" for p in short
            )
            console.print(
                f"{hw.name}: no full step in an epoch of {report.dataset_size:,} samples: "
                f"{named}; no epoch time or cost"
            )
        for line in where_time_goes([r.point for r in report.rows]):
            console.print(line)
        for line in split_choice(report):
            console.print(line)
        if report.deadline_s is not None:
            if report.pick is None:
                console.print(
                    f"{hw.name}: no device count meets the deadline of "
                    f"{duration(report.deadline_s)}"
                )
            else:
                p = report.pick.point
                console.print(
                    f"{hw.name}: cheapest to meet {duration(report.deadline_s)}: {p.devices} × "
                    f"{p.strategy}, whole run {duration(report.pick.run_s)}, "
                    f"{_money(report.pick.cost_run)}"
                )


def _link_words(link: Link) -> str:
    return (
        f"{link.display_name} ({link.bytes_per_s / 1e9:,.1f} GB/s each way × "
        f"{link.efficiency:.2f}, {link.latency_s * 1e6:.0f} µs)"
    )


def where_time_goes(points: list[ScalePoint]) -> list[str]:
    """One line per point that communicates (every one on more than one device, and ps on
    one, which still talks to its server), and ddp on one device where DDP's own work costs
    something: the terms its step holds beyond one device's."""
    lines = []
    for p in points:
        d = p.detail
        head = f"{p.strategy} × {p.devices}:"
        skew = (  # none on one device: nothing to wait for
            f"; skew {duration(d['skew_s'])} (waiting for the slowest device)"
            if d.get("skew_s")
            else ""
        )
        own = (
            f"; DDP's own work {duration(d['reducer_s'])} a step (gradients copied into "
            "buckets, the hook's division, its bookkeeping)"
            if p.strategy == "ddp" and d.get("reducer_s")
            else ""
        )
        if p.devices < 2 and not p.comm_s and not own:
            continue
        if p.strategy == "ddp" and p.devices < 2:
            lines.append(f"{head} no all-reduce on one device{own}")
        elif p.strategy == "ddp":
            lines.append(
                f"{head} all-reduce {duration(d['allreduce_s'])} in {d['buckets']} bucket(s) "
                f"({duration(d['bucket_fixed_s'])} fixed each, contention ×{d['contention']:.2f}), "
                f"{duration(d['hidden_s'])} hidden behind backward (at most "
                f"{d['overlap']:.0%}), {duration(d['exposed_s'])} exposed"
                f"{_sync_batchnorm(d.get('sync_batchnorm'))}{own}{skew}"
            )
        elif p.strategy == "ps":
            lines.append(
                f"{head} worker link {duration(d['worker_s'])}; each of {d['servers']} "
                f"server(s), a push: link {duration(d['server_link_s'])} + update "
                f"{duration(d['server_update_s'])} (busiest part busy {d['server_busy']:.0%}); "
                f"waiting behind other workers {duration(d['waiting_s'])}; messages "
                f"{duration(d['messages_s'])}"
            )
        elif p.strategy in ("pipeline", "hybrid"):
            sync = (
                f"; replica sync {duration(d['replica_sync_s'])}{skew}"
                if p.strategy == "hybrid"
                else ""
            )
            lines.append(
                f"{head} bubble {d['bubble']:.0%}, per-microbatch sends "
                f"{duration(d['microbatch_overhead_s'])} of fixed cost{sync}"
            )
    return lines


def _sync_batchnorm(sync: dict | None) -> str:
    """SyncBatchNorm's part of a ddp line: its blocking collectives and what they send."""
    if not sync:
        return ""
    return (
        f"; SyncBatchNorm {sync['all_gathers']} all-gather(s) + {sync['all_reduces']} "
        f"all-reduce(s) over {sync['layers']} layer(s), "
        f"{units.binary_bytes(sync['bytes_sent_per_device'])} sent per device, "
        f"{duration(sync['seconds'])} on the critical path"
    )


def split_choice(report: ScalingReport) -> list[str]:
    """For a model one device cannot hold: at each count, tensor parallel against a pipeline,
    weighing memory per device, the pipeline's bubble and tensor parallel's collectives."""
    points = [row.point for row in report.rows]
    if report.fits_one_device:
        return []
    lines = []
    for count in sorted({p.devices for p in points if p.devices > 1}):
        by = {p.strategy: p for p in points if p.devices == count}
        tensor, pipe = by.get("tensor"), by.get("pipeline")
        if tensor is None or pipe is None:
            continue
        memory_t = tensor.detail["memory_per_device_bytes"]
        memory_p = pipe.detail["stage_memory_bytes"]
        if not (tensor.fits or pipe.fits):
            lines.append(
                f"{report.hardware.name}: on {count} devices, neither tensor parallel "
                f"({units.binary_bytes(memory_t)} per device) nor a pipeline "
                f"({units.binary_bytes(memory_p)} per stage) fits"
            )
            continue
        faster = tensor if tensor.fits and (not pipe.fits or tensor.step_s < pipe.step_s) else pipe
        why = (
            f"tensor {duration(tensor.step_s)}/step ({duration(tensor.comm_s)} of collectives, "
            f"{units.binary_bytes(memory_t)} per device{'' if tensor.fits else ', does not fit'})"
            f" vs pipeline {duration(pipe.step_s)}/step (bubble {pipe.detail['bubble']:.0%}, "
            f"{units.binary_bytes(memory_p)} per stage{'' if pipe.fits else ', does not fit'})"
        )
        lines.append(
            f"{report.hardware.name}: the model does not fit one device; on {count}, "
            f"{faster.strategy} parallel is the better split: {why}"
        )
    return lines
