"""How one `dlscale serve` is set up: where its state lives, what it may hand out, its limits."""

from __future__ import annotations

import ipaddress
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

    def __post_init__(self):
        self.data_dir = Path(self.data_dir).expanduser()
        for name in ("cpu_slots", "gpu_slots"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"--{name.replace('_', '-')} must be a whole number >= 0")
        if self.executor not in ("process", "container"):
            raise UserError(f"--executor must be process or container (got '{self.executor}')")
        if self.cpu_slots + self.gpu_slots == 0:
            raise UserError("the server needs at least one slot (--cpu-slots or --gpu-slots)")

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

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
