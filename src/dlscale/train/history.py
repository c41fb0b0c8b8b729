"""What a run has done so far: epoch records, sampled step records, step timing. It travels in
every checkpoint, so a resumed run's record covers the whole run."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dlscale.jobspec import LoaderSpec
from dlscale.train.metrics import StepSampler, TimingTotals, starving_advice


def epoch_record(
    epoch: int,
    step: int,
    losses: tuple[float, int],
    validation: tuple[float, float],
    timing: TimingTotals,
    t_start: float,
) -> dict:
    """One entry of run.json's `epochs`: where training stands after `epoch` (0-based);
    `losses`: the sum and count of its steps' training losses."""
    val_loss, val_acc = validation
    total, count = losses
    return {
        "epoch": epoch + 1,
        "step": step,
        "train_loss": total / count if count else None,
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "samples_per_s": timing.samples_per_s,
        "elapsed_s": time.perf_counter() - t_start,
    }


@dataclass
class History:
    epochs: list[dict]
    steps: StepSampler
    timing: TimingTotals
    starving_warned: bool = False

    @classmethod
    def new(cls, total_steps: int) -> History:
        return cls([], StepSampler(total_steps), TimingTotals())

    def to_state(self) -> dict:
        return {
            "epochs": self.epochs,
            "steps": self.steps.records,
            "timing": self.timing.to_state(),
            "starving_warned": self.starving_warned,
        }

    @classmethod
    def from_state(cls, state: dict | None, total_steps: int, step: int) -> History:
        """The history up to `step` (a parameter-server worker resumes from the step its servers
        saved, which may be behind the checkpoint's); none saved: a new one."""
        if state is None:
            return cls.new(total_steps)
        sampler = StepSampler(total_steps, records=[r for r in state["steps"] if r["step"] <= step])
        return cls(
            [e for e in state["epochs"] if e["step"] <= step],
            sampler,
            TimingTotals.from_state(state["timing"]),
            state["starving_warned"],
        )

    def starving_advice(
        self, loader: LoaderSpec, device_type: str, staged: bool = False
    ) -> str | None:
        """The starving-accelerator warning, once per run."""
        if self.starving_warned:
            return None
        advice = starving_advice(
            self.timing, loader.workers, loader.pinned_on(device_type), device_type, staged
        )
        self.starving_warned = advice is not None
        return advice
