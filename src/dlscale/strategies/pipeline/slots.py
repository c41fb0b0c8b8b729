"""The pipeline schedules as orders of work per stage, and their idle slots counted on a clock
where every forward and every backward of one microbatch on one stage takes one slot.

A stage runs its actions in order; a forward waits for the previous stage's forward of that
microbatch, a backward for the next stage's backward of it. Running every stage as early as that
allows gives each stage's slots, busy or idle: the bubble as a count, not a time. GPipe and 1F1B
flush the pipeline at the end of every step (Huang et al., 2019), so each step adds idle slots;
PipeDream-2BW's 1F1B runs on across steps (Narayanan et al., "Memory-Efficient Pipeline-Parallel
DNN Training", ICML 2021, figure 2), idle only while the pipeline fills and drains.
"""

from __future__ import annotations

from dataclasses import dataclass

Action = tuple[str, int]  # ("F" | "B", microbatch number counted over the whole run)


def in_flight(stages: int, stage: int) -> int:
    """2bw: forwards stage `stage` (0-based) runs ahead of its backwards: a microbatch it sent on
    comes back through the S − 1 − stage stages after it."""
    return stages - 1 - stage


def step_actions(schedule: str, stages: int, micro: int, stage: int, step: int) -> list[Action]:
    """What `stage` runs in training step `step` (0-based), each step given `micro` microbatches.
    2bw's last step leaves backwards for `drain_actions`."""
    first = step * micro
    mbs = range(first, first + micro)
    if schedule in ("naive", "gpipe"):
        return [("F", k) for k in mbs] + [("B", k) for k in mbs]
    if schedule == "1f1b":  # torch's Schedule1F1B: warm up, then one backward, one forward
        warmup = min(micro, stages - stage)
        actions = [("F", k) for k in mbs[:warmup]]
        for i, k in enumerate(mbs):
            actions.append(("B", k))
            if warmup + i < micro:
                actions.append(("F", mbs[warmup + i]))
        return actions
    assert schedule == "2bw", schedule
    ahead = in_flight(stages, stage)
    actions = []
    for k in mbs:  # forward k, then the backward of the microbatch `ahead` before it
        actions.append(("F", k))
        if k - ahead >= 0:
            actions.append(("B", k - ahead))
    return actions


def drain_actions(schedule: str, stages: int, micro: int, stage: int, steps: int) -> list[Action]:
    """2bw after its last step: the backwards still in flight (none for a flushing schedule)."""
    if schedule != "2bw":
        return []
    total = steps * micro
    return [("B", k) for k in range(max(0, total - in_flight(stages, stage)), total)]


def run_actions(schedule: str, stages: int, micro: int, steps: int, stage: int) -> list[Action]:
    actions = [a for t in range(steps) for a in step_actions(schedule, stages, micro, stage, t)]
    return actions + drain_actions(schedule, stages, micro, stage, steps)


@dataclass(frozen=True)
class SlotCount:
    """Idle slots of a run's stages. `steady_idle`: per stage, between its first backward and its
    last forward (the fill before and the drain after left out)."""

    slots: int  # the run's length in slots, the same for every stage
    busy: list[int]
    idle: list[int]
    steady_idle: list[int]

    @property
    def bubble(self) -> float:
        """Idle share of all stages' slots."""
        return sum(self.idle) / (self.slots * len(self.idle)) if self.slots else 0.0

    def to_dict(self) -> dict:
        return {
            "slots": self.slots,
            "idle_slots": sum(self.idle),
            "steady_idle_slots": sum(self.steady_idle),
            "per_stage_idle": self.idle,
            "per_stage_steady_idle": self.steady_idle,
            "bubble": self.bubble,
        }


def timeline(schedule: str, stages: int, micro: int, steps: int) -> list[list[Action | None]]:
    """Each stage's slots, as early as the dependencies allow: an action or None (idle)."""
    orders = [run_actions(schedule, stages, micro, steps, s) for s in range(stages)]
    done: list[dict[Action, int]] = [{} for _ in range(stages)]  # action -> the slot it ran in
    nxt = [0] * stages
    rows: list[list[Action | None]] = [[] for _ in range(stages)]
    slot = 0
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        for s in range(stages):
            action = orders[s][nxt[s]] if nxt[s] < len(orders[s]) else None
            if action is not None and _ready(action, s, stages, done, slot):
                done[s][action] = slot
                nxt[s] += 1
                rows[s].append(action)
            else:
                rows[s].append(None)
        slot += 1
        assert slot <= 4 * sum(len(o) for o in orders) + 4, "the schedule deadlocks"
    return rows


def _ready(action: Action, stage: int, stages: int, done: list[dict], slot: int) -> bool:
    kind, k = action
    if kind == "F":
        need = (stage - 1, ("F", k)) if stage > 0 else None
    else:
        need = (stage + 1, ("B", k)) if stage < stages - 1 else (stage, ("F", k))
    return need is None or done[need[0]].get(need[1], slot) < slot


def count_slots(schedule: str, stages: int, micro: int, steps: int) -> SlotCount:
    rows = timeline(schedule, stages, micro, steps)
    length = len(rows[0])
    busy = [sum(a is not None for a in row) for row in rows]
    steady = []
    for row in rows:
        first_b = next(i for i, a in enumerate(row) if a is not None and a[0] == "B")
        last_f = max(i for i, a in enumerate(row) if a is not None and a[0] == "F")
        steady.append(sum(a is None for a in row[first_b:last_f]))
    return SlotCount(length, busy, [length - b for b in busy], steady)
