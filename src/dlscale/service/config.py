"""How one `dlscale serve` is set up: where its state lives, what it may hand out, its limits,
and what one job's slots give it in memory, tasks and storage."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from dlscale.errors import UserError
from dlscale.home import dlscale_home
from dlscale.service.fairshare import HALF_LIFE_S
from dlscale.service.limits import DEFAULT_MAX_BODY_BYTES


def default_data_dir() -> Path:
    return dlscale_home() / "service"


@dataclass
class ServiceConfig:
    data_dir: Path = field(default_factory=default_data_dir)
    db_url: str | None = None  # None: SQLite in data_dir
    cpu_slots: int = 1
    gpu_slots: int = 0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tick_s: float = 0.5  # how often the scheduler reconciles jobs and starts queued ones
    half_life_s: float = HALF_LIFE_S
    start_grace_s: float = 20.0  # a job 'starting' longer with no process is started again
    session_ttl_s: float = 12 * 3600
    failed_auth_limit: int = 10  # failed logins/bad tokens per address per window → 429
    failed_auth_window_s: float = 60.0
    secure_cookies: bool = False  # set behind TLS (a reverse proxy): cookies only over https
    executor: str = "process"  # or "container": each job in dlscale's image (service/container.py)
    image: str | None = None  # the container executor's image (default dlscale:<version>)
    # No sandbox, no kernel limits: jobs run as the server's user (one person, their own jobs).
    unsafe_single_user: bool = False
    memory_per_slot_bytes: int | None = None  # default: this machine's memory / cpu_slots
    tasks_per_slot: int = 512  # processes and threads a job may hold per CPU slot
    validate_timeout_s: float = 120.0  # the validation job's time limit
    validations_at_once: int = 2  # validation jobs running at once; more submits wait
    max_queued_jobs: int = 100  # a tenant's jobs waiting at once (its own setting wins)
    failed_auth_address_limit: int | None = None  # per address across names (default 3×)
    storage_check_s: float = 0.5  # how often a running job's folder is measured (each tick)
    cancel_kill_s: float = 30.0  # a job still running this long after a cancel is killed
    # A job runs as uid job_uid_base + (its id mod job_uid_count) when the server is root.
    job_uid_base: int = 1_900_000_000
    job_uid_count: int = 100_000_000

    def __post_init__(self):
        self.data_dir = Path(self.data_dir).expanduser()
        for name in ("cpu_slots", "gpu_slots"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"--{name.replace('_', '-')} must be a whole number >= 0")
        if self.memory_per_slot_bytes is not None and self.memory_per_slot_bytes < 64 << 20:
            raise UserError("--memory-per-slot must be at least 64 MiB")
        if self.executor not in ("process", "container"):
            raise UserError(f"--executor must be process or container (got '{self.executor}')")
        if self.cpu_slots + self.gpu_slots == 0:
            raise UserError("the server needs at least one slot (--cpu-slots or --gpu-slots)")

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def sandboxes_dir(self) -> Path:
        """The server's own record of each job's sandbox process (no job can see or write it)."""
        return self.data_dir / "sandboxes"

    @property
    def address_limit(self) -> int:
        return self.failed_auth_address_limit or 3 * self.failed_auth_limit

    def memory_per_slot(self) -> int:
        if self.memory_per_slot_bytes is not None:
            return self.memory_per_slot_bytes
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return physical // max(1, self.cpu_slots)

    def job_uid(self, job_id: str) -> int | None:
        """The unprivileged uid a job (and its validation) runs as, one of its own; None where
        the server cannot switch users (it is not root) or runs jobs unsandboxed."""
        if self.unsafe_single_user or os.geteuid() != 0:
            return None
        return self.job_uid_base + int(job_id, 16) % self.job_uid_count

    def limits(self, cpu_slots: int, gpu_slots: int, job_id: str, storage_left: int | None):
        """What a job holding these slots may use (service/executor.py applies it)."""
        from dlscale.service.executor import JobLimits

        cpus = max(1, cpu_slots)
        return JobLimits(
            cpus=cpus,
            gpus=gpu_slots,
            memory_bytes=self.memory_per_slot() * cpus,
            pids=self.tasks_per_slot * cpus,
            file_bytes=None if storage_left is None else max(1, storage_left),
            uid=self.job_uid(job_id),
        )

    def url(self) -> str:
        from dlscale.service.db import default_url

        return self.db_url or default_url(self.data_dir)


def check_bind(host: str, allow_remote: bool) -> None:
    """Loopback unless the operator says otherwise: a training service on a public address is
    how Ray's unauthenticated job API was exploited (CVE-2023-48022)."""
    if allow_remote:
        return
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UserError(
            f"--host {host}: binding beyond this machine needs --allow-remote "
            "(and TLS in front of the service)"
        )
