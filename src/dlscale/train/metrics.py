"""Per-step time breakdown (data wait, host→device copy, compute, waiting on other workers),
throughput outside warm-up, the median step, starvation."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

STARVING_FRACTION = 0.2  # data wait above this share of the step: the device waits on the loader
WARMUP_STEPS = 3  # first steps of a process pay for lazy init, worker start-up, allocator growth
STEP_TIMES_KEPT = 4096  # steady step times kept for the median (an evenly strided sample)


@dataclass
class StepTiming:
    """Where one step's wall time went, in seconds.

    `comm_wait_s` is time the step spent blocked on other processes and not overlapped with its
    own compute: a parameter server's push and pull, a pipeline's gradient sync. DDP's allreduce
    overlaps backward, so it is counted inside compute (and reported apart as `comm_s`).
    """

    data_wait_s: float
    h2d_s: float
    compute_s: float
    comm_wait_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.data_wait_s + self.h2d_s + self.compute_s + self.comm_wait_s

    @classmethod
    def between(
        cls, t_prev: float, t_data: float, t_copy: float, t_end: float, waited: float
    ) -> StepTiming:
        """A step's split from its timestamps: the last step's end, batch in hand, batch on
        the device, step done; `waited` (communication not overlapped) comes out of compute."""
        return cls(t_data - t_prev, t_copy - t_data, t_end - t_copy - waited, waited)


@dataclass
class TimingTotals:
    """Running sums of step timings, with the warm-up steps of each process kept apart.

    The step times tile the training loop's wall time (a step's data wait starts where the
    previous step's compute ended, per-step bookkeeping included); evaluation and checkpoint
    writes fall outside them. So `steady_samples / steady_step_s` is the loop's throughput after
    warm-up, and the median of the steady step times is the typical step.
    """

    steps: int = 0
    samples: int = 0
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    compute_s: float = 0.0
    comm_wait_s: float = 0.0
    warmup_steps: int = 0
    warmup_s: float = 0.0
    steady_steps: int = 0
    steady_samples: int = 0
    steady_data_wait_s: float = 0.0
    steady_step_s: float = 0.0
    comm_s: float = 0.0  # all communication, overlapping compute (DDP) or not
    comm_payload_bytes: int = 0
    step_times: list[float] = field(default_factory=list)  # every `stride`-th steady step
    step_times_stride: int = 1
    # Data read from disk while training (summed over the batches; zero for data in memory):
    # seconds spent reading and decoding, wherever they ran (in loader workers, in parallel).
    read_s: float = 0.0
    decode_s: float = 0.0
    read_bytes: int = 0
    io_samples: int = 0  # samples those seconds were spent on
    bad_samples: int = 0  # skipped by data.skip_bad
    session_steps: int = field(default=0, repr=False)  # steps since this process started

    def add_io(self, io) -> None:
        """One batch's io stats: (read_s, decode_s, bad_samples, read_bytes, samples)."""
        # One conversion of the batch's small tensor, not five element reads.
        read_s, decode_s, bad, read_bytes, samples = io.tolist() if hasattr(io, "tolist") else io
        self.read_s += read_s
        self.decode_s += decode_s
        self.bad_samples += int(bad)
        self.read_bytes += int(read_bytes)
        self.io_samples += int(samples)

    def add_comm(self, seconds: float, payload_bytes: int) -> None:
        self.comm_s += seconds
        self.comm_payload_bytes += payload_bytes

    def add(self, timing: StepTiming, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        self.data_wait_s += timing.data_wait_s
        self.h2d_s += timing.h2d_s
        self.compute_s += timing.compute_s
        self.comm_wait_s += timing.comm_wait_s
        self.session_steps += 1
        if self.session_steps <= WARMUP_STEPS:
            self.warmup_steps += 1
            self.warmup_s += timing.step_s
            return
        if self.steady_steps % self.step_times_stride == 0:
            self.step_times.append(timing.step_s)
            if len(self.step_times) >= STEP_TIMES_KEPT:  # keep every other, sample half as often
                self.step_times = self.step_times[::2]
                self.step_times_stride *= 2
        self.steady_steps += 1
        self.steady_samples += samples
        self.steady_data_wait_s += timing.data_wait_s
        self.steady_step_s += timing.step_s

    @property
    def step_s(self) -> float:
        return self.data_wait_s + self.h2d_s + self.compute_s + self.comm_wait_s

    @property
    def samples_per_s(self) -> float:
        """Training throughput after warm-up (every step, if the run was all warm-up)."""
        if self.steady_steps and self.steady_step_s > 0:
            return self.steady_samples / self.steady_step_s
        return self.samples / self.step_s if self.step_s > 0 else 0.0

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

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
            "comm_wait_s": self.comm_wait_s,
            "step_s": self.step_s,
            "data_wait_share": self.data_wait_s / total,
            "h2d_share": self.h2d_s / total,
            "compute_share": self.compute_s / total,
            "comm_wait_share": self.comm_wait_s / total,
            "steady_data_wait_share": self.data_wait_fraction,
            "warmup_steps": self.warmup_steps,
            "warmup_s": self.warmup_s,
            "steady_steps": self.steady_steps,
            "median_step_s": self.median_step_s,
            "samples_per_s": self.samples_per_s,
            "comm_s": self.comm_s,
            "comm_share": self.comm_s / total,
            "comm_payload_bytes_per_step": self.comm_payload_bytes / max(1, self.steps),
            **self.io_summary(),
        }

    def io_summary(self) -> dict[str, float]:
        """Reading and decoding per sample, when the data is read from disk while training."""
        if not self.io_samples:
            return {}
        return {
            "read_s_per_sample": self.read_s / self.io_samples,
            "decode_s_per_sample": self.decode_s / self.io_samples,
            "read_bytes": self.read_bytes,
            "bad_samples": self.bad_samples,
        }

    def to_state(self) -> dict:
        state = asdict(self)
        del state["session_steps"]  # a resumed process warms up again
        return state

    @classmethod
    def from_state(cls, state: dict) -> TimingTotals:
        return cls(**state)


def starving_advice(
    totals: TimingTotals,
    loader_workers: int,
    pin_memory: bool,
    device_type: str,
    staged: bool = False,
) -> str | None:
    """The field's 'starving accelerator': a warning naming the cause it measured and the
    likely fix, or None if the device is fed. `staged`: the files are read from a staged copy
    already (data.stage), so staging is no fix to offer."""
    if totals.steady_steps < 5 or totals.data_wait_fraction <= STARVING_FRACTION:
        return None
    share = round(100 * totals.data_wait_fraction)
    head = f"data loading takes {share}% of each step, so the {device_type} waits for data"
    fixes = [f"raise loader.workers (now {loader_workers})"]
    busiest, cause = starving_cause(totals, loader_workers) or (None, None)
    if cause:
        head += f": {cause}"
    if device_type == "cuda" and not pin_memory:
        fixes.append("set loader.pin_memory: true")
    if busiest == "reading" and not staged:
        fixes.append("stage the files on local disk (data.stage: DIR)")
    return head + "; " + " and ".join(fixes)


def starving_cause(totals: TimingTotals, loader_workers: int) -> tuple[str, str] | None:
    """("reading" or "decoding", what bounds the loader: that, or too few workers), from what
    the batches measured; None for data in memory, where nothing is read or decoded."""
    if not totals.io_samples or not totals.steps:
        return None
    per_sample_compute = (totals.compute_s + totals.h2d_s) / max(1, totals.samples)
    read = totals.read_s / totals.io_samples
    decode = totals.decode_s / totals.io_samples
    busiest = "reading" if read > decode else "decoding"
    per = f"{1e3 * max(read, decode):.2f} ms per sample {busiest}"
    parallel = max(1, loader_workers)
    needed = math.ceil((read + decode) / max(per_sample_compute, 1e-9))
    if needed > parallel:
        return busiest, (
            f"{busiest} bounds it ({per}, {1e3 * per_sample_compute:.2f} ms of compute): "
            f"about {needed} loader workers would keep up, {loader_workers} run"
        )
    return busiest, f"{busiest} takes {per}; the loader waits more than it works (too few workers?)"


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
