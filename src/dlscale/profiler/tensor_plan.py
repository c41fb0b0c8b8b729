"""Tensor-parallel plans: which layers split across D devices, how, and what moves each step.

A style per Linear or Conv2d (every other layer is replicated):

- `colwise`: output features (channels) split, the input whole; the output stays split for the
  layer that consumes it. Backward sums the input's gradient over the devices (all-reduce).
- `colwise_gather`: the same, then the output is gathered whole (all-gather).
- `rowwise`: input features split (arriving split from `colwise`), the partial outputs summed
  (all-reduce) into a whole output.
- `grouped` / `grouped_gather`: a grouped convolution whose groups divide among the devices:
  input and output channels split, nothing moves (AlexNet's columns); `_gather` gathers after.
- `replicate`: whole on every device.

Megatron-LM's pattern (Shoeybi et al., "Megatron-LM", 2019, §3): a column-split layer feeding a
row-split one moves activations once per pair in forward and once in backward; attention heads
split with their query, key and value columns. `auto` pairs them from the recorded dataflow
(tensor_flow.py), splits each convolution by output channels, and keeps a convolution's output
split where only grouped convolutions consume it. A model may carry its own plan as a
`tp_plan` dict (the Hugging Face convention), which `auto` then takes.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass

from dlscale.errors import UserError
from dlscale.profiler.tensor_flow import Flow, LayerFlow

STYLES = ("colwise", "colwise_gather", "rowwise", "grouped", "grouped_gather", "replicate")
_LINEAR_STYLES = ("colwise", "colwise_gather", "rowwise", "replicate")


@dataclass(frozen=True)
class PlannedLayer:
    """One split layer: its share of the weights and the collectives it implies per sample."""

    name: str
    kind: str
    style: str
    params: int
    params_per_device: int
    forward: str  # "all_reduce", "all_gather" or ""
    forward_bytes: int  # payload per sample (the whole tensor, not one device's part)
    backward: str
    backward_bytes: int


@dataclass(frozen=True)
class TensorPlan:
    degree: int
    source: str  # "auto", "model" (its tp_plan) or "spec"
    layers: list[PlannedLayer]
    params: int  # the whole model's
    params_per_device: int

    @property
    def styles(self) -> dict[str, str]:
        return {layer.name: layer.style for layer in self.layers}

    def collectives(self, batch: int):
        """(kind, payload bytes) of each collective one step runs, in order (none on one
        device: DTensor moves nothing within a mesh of one)."""
        if self.degree == 1:
            return
        for layer in self.layers:
            if layer.forward:
                yield layer.forward, layer.forward_bytes * batch
            if layer.backward:
                yield layer.backward, layer.backward_bytes * batch

    def comm_per_step(self, batch: int) -> dict[str, dict[str, int]]:
        """Collectives one step runs on each device: {kind: {count, payload_bytes}}."""
        totals: dict[str, dict[str, int]] = {}
        for kind, payload in self.collectives(batch):
            entry = totals.setdefault(kind, {"count": 0, "payload_bytes": 0})
            entry["count"] += 1
            entry["payload_bytes"] += payload
        return totals

    def to_dict(self) -> dict:
        return {
            "degree": self.degree,
            "source": self.source,
            "params": self.params,
            "params_per_device": self.params_per_device,
            "layers": [asdict(layer) for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, data: dict) -> TensorPlan:
        layers = [PlannedLayer(**layer) for layer in data["layers"]]
        return cls(
            data["degree"], data["source"], layers, data["params"], data["params_per_device"]
        )


def auto_styles(flow: Flow, degree: int) -> dict[str, str]:
    """Megatron pairs of Linear layers, then convolutions by output channels."""
    styles: dict[str, str] = {}
    layers = flow.layers
    for consumer in layers.values():
        sources = [layers[name] for name in consumer.inputs_from if name in layers]
        if (
            consumer.kind == "Linear"
            and sources
            and consumer.name not in styles
            and not consumer.tied
            and consumer.in_features % degree == 0
            and all(_can_split_linear(s, flow, styles, degree) for s in sources)
        ):
            styles.update({source.name: "colwise" for source in sources})
            styles[consumer.name] = "rowwise"
    split_input: set[str] = set()
    convs = [layer for layer in layers.values() if layer.kind == "Conv2d"]
    for conv in convs:
        grouped = conv.name in split_input
        if conv.out_features % degree or conv.tied or (conv.groups > 1 and not grouped):
            continue
        users = [c for c in convs if conv.name in c.inputs_from]
        keep = (
            bool(users)
            and conv.name not in flow.escaped
            and all(c.inputs_from == {conv.name} and _divides_groups(c, degree) for c in users)
        )
        styles[conv.name] = ("grouped" if grouped else "colwise") + ("" if keep else "_gather")
        if keep:
            split_input.update(c.name for c in users)
    return styles


def _can_split_linear(layer: LayerFlow, flow: Flow, styles: dict, degree: int) -> bool:
    return (
        layer.kind == "Linear"
        and layer.name not in styles
        and not layer.tied
        and layer.name not in flow.escaped
        and layer.out_features % degree == 0
    )


def _divides_groups(conv: LayerFlow, degree: int) -> bool:
    return conv.groups > 1 and conv.groups % degree == 0 and conv.out_features % degree == 0


def model_styles(tp_plan: dict[str, str], flow: Flow) -> dict[str, str]:
    """A model's own `tp_plan` (module names, `*` matching any part) over its layers."""
    styles = {}
    for pattern, style in tp_plan.items():
        matched = [name for name in flow.layers if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise UserError(f"the model's tp_plan names '{pattern}', which matches no layer")
        styles.update(dict.fromkeys(matched, style))
    return styles


def make_plan(
    flow: Flow, degree: int, asked, params: int, model_plan: dict | None = None
) -> TensorPlan:
    """The plan for `degree` devices: `asked` is "auto" or {module: style} from a spec;
    `params` the whole model's parameter count."""
    if isinstance(asked, dict):
        styles, source = dict(asked), "spec"
    elif model_plan:
        styles, source = model_styles(model_plan, flow), "model"
    else:
        styles, source = auto_styles(flow, degree), "auto"
    check_styles(styles, flow, degree)
    rows = [
        _row(flow.layers[name], style, degree)
        for name, style in styles.items()
        if style != "replicate"
    ]
    rows.sort(key=lambda row: flow.layers[row.name].order)
    saved = sum(row.params - row.params_per_device for row in rows)
    return TensorPlan(degree, source, rows, params, params - saved)


def check_styles(styles: dict[str, str], flow: Flow, degree: int) -> None:
    """One line for a plan that names what is not there or cannot split that way."""
    for name, style in styles.items():
        if style not in STYLES:
            raise UserError(
                f"tensor plan: '{name}: {style}' is not a style; use one of {', '.join(STYLES)}"
            )
        layer = flow.layers.get(name)
        if layer is None:
            known = ", ".join(flow.layers) or "none"
            raise UserError(
                f"tensor plan names '{name}', which is not a Linear or Conv2d layer "
                f"the model runs; those are: {known}"
            )
        if style == "replicate":
            continue
        if layer.kind == "Linear" and style not in _LINEAR_STYLES:
            raise UserError(
                f"tensor plan: '{name}' is a Linear layer; '{style}' is for convolutions"
            )
        split = layer.in_features if style == "rowwise" else layer.out_features
        side = "input" if style == "rowwise" else "output"
        if split % degree:
            raise UserError(
                f"tensor plan: '{name}' has {split} {side} features, which do not "
                f"split over {degree} devices"
            )
        if style.startswith("grouped") and layer.groups % degree:
            raise UserError(
                f"tensor plan: '{name}' has {layer.groups} groups, which do not "
                f"divide among {degree} devices"
            )
        if layer.tied:
            raise UserError(
                f"tensor plan: '{name}' shares its weight with another module; "
                "a shared weight stays whole (replicate)"
            )
        if layer.kind == "Conv2d" and getattr(layer.module, "padding_mode", "zeros") != "zeros":
            raise UserError(
                f"tensor plan: '{name}' pads with "
                f"'{layer.module.padding_mode}'; only zero padding splits"
            )


def _row(layer: LayerFlow, style: str, degree: int) -> PlannedLayer:
    module = layer.module
    weight = module.weight.numel()
    bias = module.bias.numel() if module.bias is not None else 0
    # A row-split layer adds its bias once, after the sum: every device holds all of it.
    per_device = weight // degree + bias if style == "rowwise" else (weight + bias) // degree
    # Bytes per sample as they cross: the types autocast gives them (the gradient of an input
    # has the input's type).
    inputs = math.prod(layer.input_shape) * layer.input_itemsize
    outputs = math.prod(layer.output_shape) * layer.output_itemsize
    forward = backward = ""
    forward_n = backward_n = 0
    if style == "rowwise":
        forward, forward_n = "all_reduce", outputs
    if style.endswith("_gather"):
        forward, forward_n = "all_gather", outputs
    if style.startswith("colwise") and layer.input_needs_grad:
        backward, backward_n = "all_reduce", inputs
    return PlannedLayer(
        layer.name,
        layer.kind,
        style,
        weight + bias,
        per_device,
        forward,
        forward_n,
        backward,
        backward_n,
    )


def plans_for(build, sample, params: int, precision: str = "fp32"):
    """degree -> the auto plan (None where it cannot split) for a model the profiler traces:
    its dataflow recorded once on the meta device, nothing real allocated."""
    import torch

    from dlscale.profiler.tensor_flow import record_flow

    try:
        with torch.device("meta"):
            model = build()
        flow = record_flow(model, sample.unsqueeze(0).to("meta"), precision)
    except Exception:  # a model the tagger cannot run: no tensor-parallel prediction
        return lambda degree: None
    model_plan = getattr(model, "tp_plan", None)

    def plan(degree: int) -> TensorPlan | None:
        try:
            found = make_plan(flow, degree, "auto", params, model_plan)
        except UserError:
            return None
        return found if found.layers else None  # nothing splits that many ways

    return plan
