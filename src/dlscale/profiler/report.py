"""A ProfileResult as JSON (schema dlscale.profile/1) and as rich tables; no math here."""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from dlscale.hardware.trust import calibration, calibration_line
from dlscale.profiler import ProfileResult
from dlscale.profiler.columns import Column, print_fitted
from dlscale.profiler.inference_report import render as render_inference
from dlscale.profiler.recorder import LOSS, MODEL
from dlscale.profiler.roofline import prediction_spread
from dlscale.profiler.scaling_report import cost_and_energy
from dlscale.profiler.scaling_report import render as render_scaling
from dlscale.profiler.scaling_report import to_json as scaling_json
from dlscale.profiler.systolic_report import render as render_systolic
from dlscale.profiler.systolic_report import to_json as systolic_json
from dlscale.profiler.trace import LayerTrace
from dlscale.units import binary_bytes as binary
from dlscale.units import duration as seconds
from dlscale.units import si

SCHEMA = "dlscale.profile/1"
CONVENTIONS = {
    "flops": "FLOPs = 2 × MACs for conv, linear, matmul and attention (torch.utils.flop_counter "
    "formulas, as FlopCounterMode counts them); attention runs as the CPU runs it: one fused "
    "kernel where torch would pick it, whose backward recomputes the scores (5 products)",
    "macs": "MACs = multiply-accumulates of those products (FLOPs / 2), per batch; a bias add "
    "fused into a conv or linear op is counted in neither, one add per output element (the "
    "'connections' LeCun et al. 1998 count per layer are MACs + outputs)",
    "other_flops": "elementwise ops, reductions, norms, pooling and losses: 1 FLOP per element "
    "of the op's largest tensor; counted separately",
    "bytes": "every aten op reads its tensor inputs and writes its outputs; views move nothing",
    "memory": "fp32 weights, gradients and optimizer state; activations as autograd saves them",
}


def layer_kind(layer: LayerTrace) -> str:
    if layer.name in (MODEL, LOSS):
        return "pseudo"
    return "leaf" if layer.leaf else "own"


def _layer_json(layer: LayerTrace) -> dict:
    forward, backward = layer.forward, layer.backward
    return {
        "name": layer.name,
        "type": layer.type,
        "kind": layer_kind(layer),
        "output_shape": layer.output_shape,
        "params": layer.params,
        "weight_bytes": layer.weight_bytes,
        "input_bytes": layer.input_bytes,
        "output_bytes": layer.output_bytes,
        "working_set_bytes": layer.working_set_bytes,
        "forward_macs": forward.matmul_flops // 2,
        "forward_flops": forward.matmul_flops,
        "forward_other_flops": forward.other_flops,
        "backward_flops": backward.matmul_flops,
        "backward_other_flops": backward.other_flops,
        "forward_bytes": forward.bytes,
        "backward_bytes": backward.bytes,
        "forward_ops": forward.ops,
        "backward_ops": backward.ops,
        "saved_bytes": layer.saved_bytes,
        "intensity": forward.flops / forward.bytes if forward.bytes else 0.0,
        "calls": layer.calls,
    }


def containers(result: ProfileResult) -> list[dict]:
    """Subtotals of every container module over the rows beneath it (and its own ops)."""
    rows = [row for row in result.trace.layers if layer_kind(row) != "pseudo"]
    subtotals = []
    for name, kind in result.trace.module_types.items():
        inside = [r for r in rows if r.name == name or r.name.startswith(name + ".")]
        if not any(r.name.startswith(name + ".") for r in inside):
            continue  # a leaf, not a container
        subtotals.append(
            {
                "name": name,
                "type": kind,
                "params": sum(r.params for r in inside),
                "forward_flops": sum(r.forward.flops for r in inside),
                "backward_flops": sum(r.backward.flops for r in inside),
                "saved_bytes": sum(r.saved_bytes for r in inside),
            }
        )
    return subtotals


def totals(result: ProfileResult) -> dict:
    trace, layers = result.trace, result.trace.layers
    forward_matmul = sum(r.forward.matmul_flops for r in layers)
    forward_other = sum(r.forward.other_flops for r in layers)
    backward_matmul = sum(r.backward.matmul_flops for r in layers)
    backward_other = sum(r.backward.other_flops for r in layers)
    optimizer = trace.optimizer_flops
    return {
        "params": trace.params,
        "trainable_params": trace.trainable_params,
        "non_trainable_params": trace.params - trace.trainable_params,
        "forward_macs": forward_matmul // 2,
        "forward_flops": forward_matmul,
        "forward_other_flops": forward_other,
        "backward_flops": backward_matmul,
        "backward_other_flops": backward_other,
        "optimizer_flops": optimizer,
        "step_flops": forward_matmul + forward_other + backward_matmul + backward_other + optimizer,
        "memory": result.memory.to_dict(),
        "optimizer_step": optimizer_step(result),
    }


def optimizer_step(result: ProfileResult) -> dict:
    """The traced batch is one micro-batch; an optimizer step of the spec's `accumulate` K runs
    K of them (forward and backward K times, the update once) with the step's K batches of
    inputs on the device at once."""
    k, layers, memory = result.workload.accumulate, result.trace.layers, result.memory
    forward = sum(r.forward.matmul_flops + r.forward.other_flops for r in layers)
    backward = sum(r.backward.matmul_flops + r.backward.other_flops for r in layers)
    return {
        "accumulate": k,
        "batch_size": k * result.trace.batch_size,
        "forward_flops": k * forward,
        "backward_flops": k * backward,
        "optimizer_flops": result.trace.optimizer_flops,
        "step_flops": k * (forward + backward) + result.trace.optimizer_flops,
        "batch_bytes": k * memory.batch_bytes,
        "peak_bytes": memory.step_peak_bytes(k),
    }


def _hardware_json(report) -> dict:
    hw, pred, verdict = report.hardware, report.prediction, report.verdict
    epoch_cost = cost_and_energy(hw, pred.epoch_s)
    return {
        "name": hw.name,
        "display_name": hw.display_name,
        "kind": hw.kind,
        "precision_used": pred.precision_used,
        "fits": verdict.fits,
        "required_bytes": verdict.required_bytes,
        "usable_bytes": verdict.usable_bytes,
        "max_batch": verdict.max_batch,
        "advice": verdict.advice,
        "accumulate": pred.accumulate,
        "micro_batch_s": pred.micro_batch_s,
        "forward_s": pred.forward_s,
        "backward_s": pred.backward_s,
        "optimizer_s": pred.optimizer_s,
        "h2d_s": pred.h2d_s,
        "h2d_memory": pred.h2d_memory,
        # dlscale's own loop per step (measured by `bench machine` on `local`, else a default).
        "loop_s": pred.loop_s,
        "step_s": pred.step_s,
        # The step's parameters, gradients and optimizer state pass the last-level cache: its
        # products priced as timed with their operands read from memory.
        "products_cold": pred.products_cold,
        # The calibration's median probe spread (measured entries): the step's relative
        # uncertainty, shown as ±.
        "step_spread": prediction_spread(hw),
        # Which measurement a measured entry's prediction rests on, and whether to trust it.
        "calibration": calibration(hw),
        "samples_per_s": pred.samples_per_s,
        "steps_per_epoch": pred.steps_per_epoch,
        "epoch_s": pred.epoch_s,
        "price_per_hour": hw.price_per_hour,
        "cost_per_epoch": epoch_cost[0],
        "energy_per_epoch_kwh": epoch_cost[1],
        "compute_bound_layers": pred.bound_layers("compute"),
        "memory_bound_layers": pred.bound_layers("memory"),
        "overhead_bound_layers": pred.bound_layers("overhead"),
        # Layer phases timed from measured rates against those from the roofline's peaks.
        "phase_sources": pred.phase_sources(),
        "roofline_layers": pred.roofline_layers(),
        "layers": [
            {
                "name": t.name,
                "forward_s": t.forward.seconds,
                "backward_s": t.backward.seconds,
                "bound": t.bound,
                "forward_source": t.forward.source,
                "backward_source": t.backward.source,
                "intensity": t.intensity,
            }
            for t in pred.layers
        ],
    }


def to_json(result: ProfileResult) -> dict:
    workload, trace = result.workload, result.trace
    return {
        "schema": SCHEMA,
        "target": workload.label,
        "model": workload.model_name,
        "batch_size": trace.batch_size,
        "input_shape": trace.input_shape,
        "input_shapes": trace.input_shapes,
        "precision": trace.precision,
        "optimizer": trace.optimizer_name,
        "dataset_size": workload.dataset_size,
        "conventions": CONVENTIONS,
        "totals": totals(result),
        "layers": [_layer_json(layer) for layer in trace.layers],
        "containers": containers(result),
        "uncounted_ops": trace.uncounted_ops,
        "hardware": [_hardware_json(report) for report in result.reports],
        "scaling": [scaling_json(report) for report in result.scaling],
        "scaling_skipped": result.scaling_skipped,
        "systolic": [systolic_json(report) for report in result.systolic],
        "inference": [asdict(row) for row in result.inference],
        "profile_s": result.profile_s,
    }


def render(result: ProfileResult, console: Console) -> None:
    data = to_json(result)
    total = data["totals"]
    step = total["optimizer_step"]
    batch = f"batch {data['batch_size']}"
    if step["accumulate"] > 1:
        batch += f" × accumulate {step['accumulate']} = {step['batch_size']} an optimizer step"
    console.print(
        f"[bold]{data['model']}[/]: {total['params']:,} parameters "
        f"({total['non_trainable_params']:,} not trainable), {batch}, "
        f"{_inputs(data)}, {_precision(result, data)}, optimizer {data['optimizer']}; "
        f"traced on the meta device in {data['profile_s']:.2f} s"
    )
    _print_layer_table(result, console)
    console.print(_totals_table(total))
    if data["uncounted_ops"]:
        listed = ", ".join(f"{op} ×{n}" for op, n in data["uncounted_ops"].items())
        console.print(f"[yellow]ops whose FLOPs are not counted (bytes are):[/] {listed}")
    if result.reports:
        _print_hardware_table(data["hardware"], console)
        for hw in data["hardware"]:
            if hw["precision_used"] != data["precision"]:
                console.print(
                    Text(
                        f"{hw['name']}: no {data['precision']} peak in its entry: its matrix "
                        f"products are timed at {hw['precision_used']}'s rate (memory as "
                        f"{data['precision']} stores it)",
                        style="yellow",
                    )
                )
            console.print(Text(step_parts_line(hw)))
            console.print(Group(*(Text(f"{hw['name']}: {note}") for note in hw["advice"])))
            if hw["calibration"]:
                style = "" if hw["calibration"]["reliable"] else "yellow"
                console.print(Text(calibration_line(hw["calibration"]), style=style))
    if result.scaling:
        render_scaling(result.scaling, console)
    for name, why in result.scaling_skipped.items():
        console.print(Text(f"not scaled: {name} ({why})", style="yellow"))
    if result.systolic:
        render_systolic(result.systolic, console)
    if result.inference:
        render_inference(result.inference, console)
    console.print(
        f"[dim]{CONVENTIONS['flops']}; {CONVENTIONS['macs']}; {CONVENTIONS['other_flops']}.[/]"
    )


def _precision(result: ProfileResult, data: dict) -> str:
    """The step's precision; with an inference at another (int8: the training step is traced
    in fp32), both."""
    inference = {row.precision for row in result.inference} - {data["precision"]}
    if not inference:
        return data["precision"]
    return (
        f"{data['precision']} (the training step; {', '.join(inference)} for the inference below)"
    )


def _inputs(data: dict) -> str:
    """'input (3, 32, 32)', or every input of a forward that takes several."""
    shapes = data["input_shapes"] or [data["input_shape"]]
    if len(shapes) == 1:
        return f"input {tuple(shapes[0])}"
    return "inputs " + ", ".join(str(tuple(shape)) for shape in shapes)


def step_parts_line(hw: dict) -> str:
    """One device's predicted step as its parts, and where the layers' rates came from."""
    parts = [
        ("forward", hw["forward_s"]),
        ("backward", hw["backward_s"]),
        ("optimizer", hw["optimizer_s"]),
        (f"host→device ({hw['h2d_memory']})" if hw["h2d_memory"] else "host→device", hw["h2d_s"]),
        ("dlscale loop", hw["loop_s"]),
    ]
    listed = " + ".join(f"{name} {seconds(value)}" for name, value in parts if value)
    sources = hw["phase_sources"]
    line = f"{hw['name']}: step {seconds(hw['step_s'])} = {listed}"
    if hw["accumulate"] > 1:  # forward, backward and the copy in are the K micro-batches'
        line += (
            f" ({hw['accumulate']} micro-batches of {seconds(hw['micro_batch_s'])} each: "
            "forward, backward, host→device; the update and the loop once)"
        )
    line += (
        f"; layer phases timed from measured rates {sources['measured']}, from the "
        f"roofline's peaks {sources['roofline']}"
    )
    shown = hw["roofline_layers"][:4]
    if shown and sources["measured"]:  # a datasheet entry: every layer, not worth listing
        more = len(hw["roofline_layers"]) - len(shown)
        line += f" ({', '.join(shown)}{f' and {more} more' if more else ''})"
    if hw["products_cold"]:
        line += (
            "; products at their rates read from memory (the step's parameters, gradients and "
            "optimizer state pass the last-level cache)"
        )
    return line


# What a person reads first stays longest when the terminal is narrow (lower `keep`).
LAYER_COLUMNS = [
    Column("layer", 0, "left"),
    Column("type", 6, "left"),
    Column("output", 5, "left"),
    Column("params", 1),
    Column("MACs", 5),
    Column("FLOPs", 2),
    Column("other", 7),
    Column("bwd FLOPs", 3),
    Column("in", 11),
    Column("out", 10),
    Column("weights", 9),
    Column("FLOP/B", 8),
    Column("saved", 4),
]


def _print_layer_table(result: ProfileResult, console: Console) -> None:
    rows = []
    for row in map(_layer_json, result.trace.layers):
        depth = row["name"].count(".")
        name = "  " * depth + row["name"] + (" (own ops)" if row["kind"] == "own" else "")
        shape = "×".join(map(str, row["output_shape"])) if row["output_shape"] else ""
        rows.append(
            [
                name,
                row["type"],
                shape,
                f"{row['params']:,}",
                si(row["forward_macs"]),
                si(row["forward_flops"]),
                si(row["forward_other_flops"]),
                si(row["backward_flops"]),
                binary(row["input_bytes"]),
                binary(row["output_bytes"]),
                binary(row["weight_bytes"]),
                f"{row['intensity']:.1f}",
                binary(row["saved_bytes"]),
            ]
        )
    print_fitted(console, "per layer (forward; backward FLOPs beside)", LAYER_COLUMNS, rows)


def _totals_table(total: dict) -> Table:
    """The traced step's FLOPs and memory; with accumulate K, a column per micro-batch and one
    per optimizer step (forward and backward K times, the update once; the step's K batches of
    inputs on the device at once, one micro-batch's activations)."""
    step = total["optimizer_step"]
    k = step["accumulate"]
    title = "per training step" if k == 1 else f"per micro-batch and per optimizer step (×{k})"
    table = Table(title=title, show_header=k > 1, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value" if k == 1 else "micro-batch", justify="right")
    if k > 1:
        table.add_column("optimizer step", justify="right")
    forward = total["forward_flops"] + total["forward_other_flops"]
    backward = total["backward_flops"] + total["backward_other_flops"]
    memory = total["memory"]
    rows = [
        ("forward FLOPs (MACs × 2)", si(total["forward_flops"]), si(k * total["forward_flops"])),
        (
            "forward other FLOPs",
            si(total["forward_other_flops"]),
            si(k * total["forward_other_flops"]),
        ),
        ("backward FLOPs", si(backward), si(step["backward_flops"])),
        ("optimizer FLOPs", "", si(total["optimizer_flops"])),
        ("step FLOPs", si(forward + backward), si(step["step_flops"])),
    ]
    if k == 1:
        rows[3] = ("optimizer FLOPs", si(total["optimizer_flops"]), "")
        rows[4] = ("step FLOPs", si(total["step_flops"]), "")
    for key, label in (
        ("weights_bytes", "weights (fp32)"),
        ("gradients_bytes", "gradients"),
        ("optimizer_state_bytes", "optimizer state"),
        ("activations_bytes", "activations saved for backward"),
    ):
        rows.append((label, binary(memory[key]), binary(memory[key])))
    rows.append(("input batch", binary(memory["batch_bytes"]), binary(step["batch_bytes"])))
    rows.append(("training memory", binary(memory["total_bytes"]), binary(step["peak_bytes"])))
    for label, micro, whole in rows:
        table.add_row(label, micro, *([whole] if k > 1 else []))
    return table


HARDWARE_COLUMNS = [
    Column("device", 0, "left"),
    Column("fits", 1),
    Column("memory need / usable", 5),
    Column("max batch", 6),
    Column("step", 2),
    Column("samples/s", 3),
    Column("epoch", 4),
    Column("cost / epoch", 8),
    Column("bound (c / m / o)", 7),
]


def _step(hw: dict) -> str:
    """The predicted step, with its uncertainty where the device was calibrated here."""
    spread = hw["step_spread"]
    return seconds(hw["step_s"]) + (f" ±{spread:.0%}" if spread else "")


def _print_hardware_table(hardware: list[dict], console: Console) -> None:
    rows = []
    for hw in hardware:
        counts = [len(hw[f"{b}_bound_layers"]) for b in ("compute", "memory", "overhead")]
        rows.append(
            [
                hw["name"],
                "yes" if hw["fits"] else "[red]no[/]",
                f"{binary(hw['required_bytes'])} / {binary(hw['usable_bytes'])}",
                f"{hw['max_batch']:,}",
                _step(hw),
                f"{hw['samples_per_s']:,.0f}",
                seconds(hw["epoch_s"]),
                f"${hw['cost_per_epoch']:,.2f}" if hw["cost_per_epoch"] is not None else "-",
                " / ".join(map(str, counts)),
            ]
        )
    bound = {
        "bound (c / m / o)": "bound (c / m / o): layers bound by compute, memory "
        "bandwidth, per-op overhead"
    }
    print_fitted(console, "predicted on each device (roofline)", HARDWARE_COLUMNS, rows, bound)
