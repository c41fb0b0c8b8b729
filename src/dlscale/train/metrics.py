"""Per-step time breakdown (data wait, host→device copy, compute), throughput, starvation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

STARVING_FRACTION = 0.2  # data wait above this share of the step: the device waits on the loader
WARMUP_STEPS = 3  # first steps pay for lazy init, worker start-up and allocator growth


@dataclass
class StepTiming:
    """Where one step's wall time went, in seconds."""

    data_wait_s: float
    h2d_s: float
    compute_s: float

    @property
    def step_s(self) -> float:
        return self.data_wait_s + self.h2d_s + self.compute_s


@dataclass
class TimingTotals:
    """Running sums of step timings, split into warm-up and steady state."""

    steps: int = 0
    samples: int = 0
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    compute_s: float = 0.0
    steady_steps: int = 0
    steady_data_wait_s: float = 0.0
    steady_step_s: float = 0.0
    comm_s: float = 0.0  # allreduce time (data parallel), overlapping with compute
    comm_payload_bytes: int = 0

    def add_comm(self, seconds: float, payload_bytes: int) -> None:
        self.comm_s += seconds
        self.comm_payload_bytes += payload_bytes

    def add(self, timing: StepTiming, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        self.data_wait_s += timing.data_wait_s
        self.h2d_s += timing.h2d_s
        self.compute_s += timing.compute_s
        if self.steps > WARMUP_STEPS:
            self.steady_steps += 1
            self.steady_data_wait_s += timing.data_wait_s
            self.steady_step_s += timing.step_s

    @property
    def step_s(self) -> float:
        return self.data_wait_s + self.h2d_s + self.compute_s

    @property
    def samples_per_s(self) -> float:
        """Training throughput over time spent in steps (evaluation and checkpoints excluded)."""
        return self.samples / self.step_s if self.step_s > 0 else 0.0

    @property
    def data_wait_fraction(self) -> float:
        """Steady-state share of step time spent waiting for the next batch."""
        if self.steady_step_s <= 0:
            return 0.0
        return self.steady_data_wait_s / self.steady_step_s

    def summary(self) -> dict[str, float]:
        total = self.step_s or 1.0
        return {
            "steps": self.steps,
            "samples": self.samples,
            "data_wait_s": self.data_wait_s,
            "h2d_s": self.h2d_s,
            "compute_s": self.compute_s,
            "step_s": self.step_s,
            "data_wait_share": self.data_wait_s / total,
            "h2d_share": self.h2d_s / total,
            "compute_share": self.compute_s / total,
            "steady_data_wait_share": self.data_wait_fraction,
            "samples_per_s": self.samples_per_s,
            "comm_s": self.comm_s,
            "comm_share": self.comm_s / total,
            "comm_payload_bytes_per_step": self.comm_payload_bytes / max(1, self.steps),
        }

    def to_state(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, float]) -> TimingTotals:
        return cls(**state)


def starving_advice(
    totals: TimingTotals, loader_workers: int, pin_memory: bool, device_type: str
) -> str | None:
    """The field's 'starving accelerator': a warning with the likely fix, or None if fed."""
    if totals.steady_steps < 5 or totals.data_wait_fraction <= STARVING_FRACTION:
        return None
    fixes = [f"raise loader.workers (now {loader_workers})"]
    if device_type == "cuda" and not pin_memory:
        fixes.append("set loader.pin_memory: true")
    share = round(100 * totals.data_wait_fraction)
    return (
        f"data loading takes {share}% of each step, so the {device_type} waits for data: "
        + " and ".join(fixes)
    )


@dataclass
class StepSampler:
    """Keeps every k-th step's record so run.json stays small for long runs."""

    total_steps: int
    max_records: int = 500
    records: list[dict] = field(default_factory=list)

    @property
    def every(self) -> int:
        return max(1, -(-self.total_steps // self.max_records))

    def wants(self, step: int) -> bool:
        """Whether this step's record is kept (so the record is only built when it is)."""
        return step % self.every == 0 or step == self.total_steps

    def offer(self, step: int, record: dict) -> None:
        if self.wants(step):
            self.records.append(record)
