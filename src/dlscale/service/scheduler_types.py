"""The scheduler's nouns: tenants and their quotas, the machine, queued and running jobs."""

import math
from dataclasses import dataclass

from dlscale.errors import UserError


def check_count(owner: str, field: str, value: int | None, *, optional: bool = False) -> None:
    """A slot count or quota is a whole number >= 0 (None where `optional`: no limit)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{owner}: {field} must be a whole number >= 0, got {value!r}")


@dataclass(frozen=True)
class Tenant:
    """A group sharing the machine: its fair-share weight and hard quotas (None: no limit)."""

    name: str
    weight: float = 1.0
    max_concurrent_jobs: int | None = None
    cpu_slots: int | None = None
    gpu_slots: int | None = None

    def __post_init__(self):
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)) or (
            self.weight <= 0
        ):
            raise UserError(f"tenant {self.name}: weight must be a number > 0, got {self.weight!r}")
        for field in ("max_concurrent_jobs", "cpu_slots", "gpu_slots"):
            check_count(f"tenant {self.name}", field, getattr(self, field), optional=True)


@dataclass(frozen=True)
class Machine:
    """The slots the service may hand out (`dlscale serve --cpu-slots N --gpu-slots N`)."""

    cpu_slots: int
    gpu_slots: int = 0

    def __post_init__(self):
        check_count("machine", "cpu_slots", self.cpu_slots)
        check_count("machine", "gpu_slots", self.gpu_slots)


@dataclass(frozen=True)
class Request:
    """A queued job: who asks, for how many slots, and when (seconds, any fixed epoch)."""

    job_id: str
    tenant: str
    cpu_slots: int
    gpu_slots: int = 0
    submitted_at: float = 0.0

    def __post_init__(self):
        check_count(f"job {self.job_id}", "cpu_slots", self.cpu_slots)
        check_count(f"job {self.job_id}", "gpu_slots", self.gpu_slots)


@dataclass(frozen=True)
class Running:
    """A started job holding its slots until it ends (started_at in the same seconds)."""

    job_id: str
    tenant: str
    cpu_slots: int
    gpu_slots: int = 0
    started_at: float = 0.0

    @classmethod
    def of(cls, request: Request, started_at: float) -> "Running":
        return cls(request.job_id, request.tenant, request.cpu_slots, request.gpu_slots, started_at)
