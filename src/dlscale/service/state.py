"""What one running server holds (its configuration, database, secret, executor, scheduler loop
and failure limits), built by app.py and reached by every route through deps.service."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.service.config import ServiceConfig
from dlscale.service.executor import Executor
from dlscale.service.limits import FailureLimiter
from dlscale.service.loop import JobLoop
from dlscale.service.model_proxy import InFlight


@dataclass
class ServiceState:
    config: ServiceConfig
    engine: object
    maker: object
    secret: bytes
    executor: Executor
    loop: JobLoop
    limiter: FailureLimiter  # failed logins per address and name, bad tokens per address
    address_limiter: FailureLimiter  # failed logins per address, whatever names were tried
    model_requests: InFlight = field(default_factory=InFlight)  # to deployed models, each
