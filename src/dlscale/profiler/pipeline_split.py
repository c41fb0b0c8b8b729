"""Split a model into pipeline stages: contiguous runs of its layers, balanced by their cost.

The candidate boundaries are the model's top-level modules, with sequential containers
(`nn.Sequential`, `nn.ModuleList`) opened up: GPT's `blocks.0`, `blocks.1`, ..., ResNet's
`layer1.0`, ... Each candidate's cost comes from one traced step (the profiler): its predicted
forward + backward time on the hardware (`local` when this machine was measured, else FLOPs),
its parameters and the activations autograd saves in it. Stages are the contiguous partition
whose costliest stage is cheapest (dynamic programming). A stage's memory is its weights,
gradients and optimizer state plus the activations of every microbatch it holds at once: all M
with GPipe, at most S − s with 1F1B (stage s of S), the one whole batch with `naive`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn

from dlscale.errors import UserError
from dlscale.hardware.device import Hardware
from dlscale.profiler.memory import FP32_BYTES
from dlscale.profiler.recorder import LOSS
from dlscale.profiler.roofline import predict
from dlscale.profiler.trace import StepTrace
from dlscale.units import binary_bytes

_SEQUENCES = (nn.Sequential, nn.ModuleList)


@dataclass(frozen=True)
class Unit:
    """One candidate stage piece: a top-level module, or one element of a sequence."""

    name: str
    params: int
    flops: int  # forward + backward, one microbatch
    seconds: float  # predicted forward + backward, one microbatch (0 without hardware)
    saved_bytes: int  # activations saved for backward, one microbatch


@dataclass(frozen=True)
class StagePlan:
    index: int
    units: list[str]
    params: int
    flops: int  # per microbatch
    seconds: float  # predicted, per microbatch
    static_bytes: int  # weights, gradients, optimizer state
    activation_bytes: int  # saved activations of the microbatches held at once
    in_flight: int  # microbatches whose activations the stage holds at its peak

    @property
    def memory_bytes(self) -> int:
        return self.static_bytes + self.activation_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_bytes": self.memory_bytes}


@dataclass(frozen=True)
class SplitPlan:
    boundaries: list[str]  # the modules that begin stages 2..S (torch pipelining split points)
    stages: list[StagePlan]
    balanced_by: str  # "time", "flops", "memory" or "given"
    hardware: str | None

    def to_dict(self) -> dict:
        return {
            "boundaries": self.boundaries,
            "balanced_by": self.balanced_by,
            "hardware": self.hardware,
            "stages": [stage.to_dict() for stage in self.stages],
        }


def candidate_names(model: nn.Module) -> list[str]:
    """Top-level modules, sequences opened up (recursively), in definition order."""
    found: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if isinstance(child, _SEQUENCES) and len(child):
                visit(full, child)
            else:
                found.append(full)

    visit("", model)
    return found


def in_place_names(model: nn.Module) -> dict[str, str]:
    """Candidates that modify their input in place (`ReLU(inplace=True)`, ...), described. One
    cannot begin a stage: its input is then the stage's input, a leaf autograd may not modify."""
    modules = dict(model.named_modules())
    return {
        name: f"{type(modules[name]).__name__}(inplace=True)"
        for name in candidate_names(model)
        if getattr(modules[name], "inplace", False) is True
    }


def units_of(model: nn.Module, trace: StepTrace, hardware: Hardware | None) -> list[Unit]:
    """The candidates that ran, in execution order, with their share of the traced step. A
    container's own ops (GPT adding its embeddings) go to the piece that runs first, the loss to
    the piece that runs last; a candidate that works in place joins the piece before it."""
    names = candidate_names(model)
    seconds_of: dict[str, float] = {}
    if hardware is not None:
        for layer in predict(trace, hardware).layers:
            seconds_of[layer.name] = layer.seconds
    totals: dict[str, list[float]] = {}  # name -> [params, flops, seconds, saved]
    order: list[str] = []
    pending_root: list = []
    for row in trace.layers:
        owner = _owner(row.name, names)
        if row.name == LOSS:
            owner = order[-1] if order else None
        if owner is None:  # the root or a container above every candidate
            pending_root.append(row)
            continue
        if owner not in totals:
            totals[owner] = [0, 0, 0.0, 0]
            order.append(owner)
        _add(totals[owner], row, seconds_of)
    if not order:
        raise UserError("the model has no layers to split into stages")
    for row in pending_root:
        _add(totals[order[0]], row, seconds_of)
    in_place = in_place_names(model)
    for position, name in reversed(list(enumerate(order))):
        if name in in_place and position > 0:
            before = totals[order[position - 1]]
            before[:] = [a + b for a, b in zip(before, totals.pop(name), strict=True)]
    return [
        Unit(name, int(t[0]), int(t[1]), float(t[2]), int(t[3]))
        for name, t in ((name, totals[name]) for name in order if name in totals)
    ]


def _owner(name: str, candidates: list[str]) -> str | None:
    owners = [c for c in candidates if name == c or name.startswith(c + ".")]
    return max(owners, key=len, default=None)


def _add(total: list, row, seconds_of: dict[str, float]) -> None:
    total[0] += row.params
    total[1] += row.forward.flops + row.backward.flops
    total[2] += seconds_of.get(row.name, 0.0)
    total[3] += row.saved_bytes


def in_flight(schedule: str, microbatches: int, stages: int, index: int) -> int:
    """Microbatches whose saved activations stage `index` holds at its peak."""
    if schedule == "naive":
        return 1
    if schedule in ("1f1b", "2bw"):  # 2bw: 1F1B's order, run on across steps
        return min(microbatches, stages - index)
    return microbatches


def partition(costs: list[float], parts: int) -> list[int]:
    """Start index of each part of the contiguous split of `costs` into `parts` non-empty runs
    whose largest sum is smallest."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    inf = float("inf")
    # best[k][i]: the smallest largest-part over splits of costs[:i] into k parts
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def _stages(
    units: list[Unit],
    starts: list[int],
    schedule: str,
    microbatches: int,
    optimizer_state_per_param: float,
) -> list[StagePlan]:
    stages = []
    ends = [*starts[1:], len(units)]
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        members = units[start:end]
        params = sum(u.params for u in members)
        held = in_flight(schedule, microbatches, len(starts), index)
        stages.append(
            StagePlan(
                index=index,
                units=[u.name for u in members],
                params=params,
                flops=sum(u.flops for u in members),
                seconds=sum(u.seconds for u in members),
                static_bytes=int(params * (2 * FP32_BYTES + optimizer_state_per_param)),
                activation_bytes=sum(u.saved_bytes for u in members) * held,
                in_flight=held,
            )
        )
    return stages


def plan_split(
    model: nn.Module,
    trace: StepTrace,
    stages: int,
    schedule: str,
    microbatches: int,
    split: str | list[str] = "auto",
    hardware: Hardware | None = None,
    max_memory: int | None = None,
) -> SplitPlan:
    """Stages for `model`, from a step traced at one microbatch. `split` is `auto` or the names
    of the modules that begin stages 2..S. With `max_memory`, a time-balanced split whose
    largest stage needs more is rebalanced by memory; if no split into `stages` fits, the error
    says how many stages would."""
    units = units_of(model, trace, hardware)
    state_per_param = trace.optimizer_state_bytes / max(1, trace.trainable_params)

    def build(starts: list[int]) -> list[StagePlan]:
        return _stages(units, starts, schedule, microbatches, state_per_param)

    if stages > len(units):
        raise UserError(
            f"strategy.stages {stages} is more than the model's {len(units)} splittable layers "
            f"({', '.join(u.name for u in units)})"
        )
    if split != "auto":
        names = [u.name for u in units]
        in_place = in_place_names(model)
        for name in split:
            if name in in_place:
                raise UserError(
                    f"strategy.split: {name} runs in place ({in_place[name]}) and cannot begin "
                    "a stage (it would modify the stage's input); begin the stage at the module "
                    "before or after it"
                )
        unknown = [name for name in split if name not in names]
        if unknown:
            raise UserError(
                f"strategy.split: {', '.join(unknown)} cannot begin a stage; choose from "
                f"{', '.join(names[1:])}"
            )
        starts = [0, *(names.index(name) for name in split)]
        if starts != sorted(set(starts)) or starts[1] == 0:
            raise UserError(
                "strategy.split must name modules in the order they run, after the first: "
                f"{', '.join(names)}"
            )
        plan = build(starts)
        balanced_by = "given"
    else:
        by_time = hardware is not None and sum(u.seconds for u in units) > 0
        costs = [u.seconds if by_time else float(u.flops) for u in units]
        plan = build(partition(costs, stages))
        balanced_by = "time" if by_time else "flops"
        if max_memory is not None and max(s.memory_bytes for s in plan) > max_memory:
            plan = _balance_memory(units, stages, build, state_per_param)
            balanced_by = "memory"
    if max_memory is not None:
        _check_memory(plan, max_memory, units, split, build, state_per_param)
    boundaries = [stage.units[0] for stage in plan[1:]]
    return SplitPlan(boundaries, plan, balanced_by, hardware.name if hardware else None)


def _balance_memory(
    units: list[Unit], stages: int, build, state_per_param: float
) -> list[StagePlan]:
    """The split whose largest stage needs the least memory. With 1F1B the activations a stage
    holds depend on its place, so the partition is tried under each in-flight count the stages
    can have, and each result is costed as built."""
    best = None
    for held in sorted({s.in_flight for s in build(partition([1.0] * len(units), stages))}):
        per_param = 2 * FP32_BYTES + state_per_param
        costs = [u.params * per_param + u.saved_bytes * held for u in units]
        plan = build(partition(costs, stages))
        if best is None or max(s.memory_bytes for s in plan) < max(s.memory_bytes for s in best):
            best = plan
    return best


def _check_memory(plan, max_memory: int, units: list[Unit], split, build, state_per_param) -> None:
    worst = max(plan, key=lambda s: s.memory_bytes)
    if worst.memory_bytes <= max_memory:
        return
    advice = ""
    if split == "auto":
        for more in range(len(plan) + 1, len(units) + 1):
            split_more = _balance_memory(units, more, build, state_per_param)
            if max(s.memory_bytes for s in split_more) <= max_memory:
                advice = f"; a split into {more} stages fits"
                break
        else:
            advice = "; no split into stages fits: one layer alone needs more"
    raise UserError(
        f"stage {worst.index + 1} of {len(plan)} ({', '.join(worst.units)}) needs "
        f"{binary_bytes(worst.memory_bytes)}, more than strategy.max_memory_per_worker "
        f"{binary_bytes(max_memory)}{advice}"
    )
