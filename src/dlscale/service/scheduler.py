"""Which queued jobs start now, and why each other one waits: quotas first, then fair share.

A pure function of the queue, the running jobs and the tenants' usage; the service calls `plan`
on every poll and `check_fits` at submit. Order of starts: the tenant with the smallest
(decayed usage + running jobs) / weight first (`fairshare.shares`); within a tenant, first
submitted first (FIFO: a tenant's later job never overtakes its earlier one). Across tenants
there is no head-of-line blocking: a tenant whose next job does not fit now (its quota is
full, or the machine lacks the slots) is skipped and the next tenant's job starts. The price:
a large job may wait while other tenants' small jobs keep the slots busy; it starts as soon as
enough slots are free when its tenant is first in line.
"""

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dlscale.service.fairshare import held_usage, shares, slot_cost
from dlscale.service.scheduler_types import Machine, Request, Running, Tenant


@dataclass(frozen=True)
class Decision:
    """Jobs to start now, in order, and a human reason for every queued job that waits."""

    start: list[str]
    waiting: dict[str, str]


def check_fits(request: Request, tenant: Tenant, machine: Machine) -> str | None:
    """Why `request` can never run, however long it waits (refused at submit); None if it can."""
    if request.cpu_slots + request.gpu_slots == 0:
        return "asks for no slots; a job needs at least one"
    if tenant.max_concurrent_jobs == 0:
        return f"tenant {tenant.name} may run no jobs (max_concurrent_jobs 0)"
    if request.gpu_slots and machine.gpu_slots == 0:
        return f"asks for {request.gpu_slots} gpu slots but this server has no GPUs"
    for kind in ("cpu", "gpu"):
        asked = getattr(request, f"{kind}_slots")
        quota, has = getattr(tenant, f"{kind}_slots"), getattr(machine, f"{kind}_slots")
        if asked > has:
            return f"asks for {asked} {kind} slots but the machine has {has}"
        if quota is not None and asked > quota:
            return f"asks for {asked} {kind} slots but tenant {tenant.name}'s quota is {quota}"
    return None


@dataclass
class _Held:
    """What one tenant holds, counted up as the plan starts its jobs."""

    jobs: int = 0
    cpu_slots: int = 0
    gpu_slots: int = 0

    def add(self, job: Request | Running) -> None:
        self.jobs += 1
        self.cpu_slots += job.cpu_slots
        self.gpu_slots += job.gpu_slots


@dataclass
class _State:
    """The poll being planned: tenants' holdings, free machine slots and places in line."""

    tenants: Mapping[str, Tenant]
    held: dict[str, _Held]
    free: dict[str, int]
    share: dict[str, float]
    lines: dict[str, deque[Request]] = field(default_factory=dict)

    def tenant_limit(self, job: Request) -> str | None:
        tenant, held = self.tenants[job.tenant], self.held[job.tenant]
        if tenant.max_concurrent_jobs is not None and held.jobs >= tenant.max_concurrent_jobs:
            return f"tenant at max_concurrent_jobs {held.jobs}/{tenant.max_concurrent_jobs}"
        for kind in ("cpu", "gpu"):
            asked, quota = getattr(job, f"{kind}_slots"), getattr(tenant, f"{kind}_slots")
            used = getattr(held, f"{kind}_slots")
            if asked and quota is not None and used + asked > quota:
                return f"tenant at {kind}_slots {used}/{quota}, needs {asked}"
        return None

    def short(self, job: Request) -> list[str]:
        """The kinds of machine slots too few are free for `job`."""
        return [kind for kind in ("cpu", "gpu") if getattr(job, f"{kind}_slots") > self.free[kind]]

    def fits(self, job: Request) -> bool:
        return self.tenant_limit(job) is None and not self.short(job)

    def order(self, tenant: str) -> tuple:
        """Place in line: fair share, then the earlier head job, then the name (deterministic)."""
        return (self.share[tenant], self.lines[tenant][0].submitted_at, tenant)

    def start(self, job: Request) -> None:
        self.held[job.tenant].add(job)
        for kind in ("cpu", "gpu"):
            self.free[kind] -= getattr(job, f"{kind}_slots")
        cost = held_usage(slot_cost(job.cpu_slots, job.gpu_slots))
        self.share[job.tenant] += cost / self.tenants[job.tenant].weight


def plan(
    queued: Iterable[Request],
    running: Iterable[Running],
    tenants: Mapping[str, Tenant],
    machine: Machine,
    usage: Mapping[str, float],
) -> Decision:
    """The jobs to start now and why each other queued job waits (see the module docstring)."""
    running = list(running)
    state = _State(
        tenants=tenants,
        held={name: _Held() for name in tenants},
        free={"cpu": machine.cpu_slots, "gpu": machine.gpu_slots},
        share=shares(usage, running, {n: t.weight for n, t in tenants.items()}),
    )
    for job in running:
        state.held.setdefault(job.tenant, _Held()).add(job)
        state.free["cpu"] -= job.cpu_slots
        state.free["gpu"] -= job.gpu_slots
    waiting: dict[str, str] = {}
    for job in sorted(queued, key=lambda r: (r.submitted_at, r.job_id)):
        if job.tenant not in tenants:
            waiting[job.job_id] = f"tenant {job.tenant} does not exist"
        elif never := check_fits(job, tenants[job.tenant], machine):
            # Left out of its tenant's line, so it cannot hold up the tenant's later jobs.
            waiting[job.job_id] = f"can never run: {never}"
        else:
            state.lines.setdefault(job.tenant, deque()).append(job)
    started = []
    while ready := [name for name, line in state.lines.items() if line and state.fits(line[0])]:
        job = state.lines[min(ready, key=state.order)].popleft()
        state.start(job)
        started.append(job.job_id)
    waiting.update(_reasons(state))
    return Decision(start=started, waiting=waiting)


def _reasons(state: _State) -> dict[str, str]:
    """Why each job left in the lines waits: its tenant's quota, the machine's free slots, a
    tenant ahead in fair share that wants the same kind of slots, or its own tenant's FIFO."""
    reasons = {}
    heads = sorted((name for name, line in state.lines.items() if line), key=state.order)
    for rank, name in enumerate(heads):
        head = state.lines[name][0]
        short = state.short(head)
        ahead = [
            other
            for other in heads[:rank]
            if state.tenant_limit(state.lines[other][0]) is None
            and set(short) & set(state.short(state.lines[other][0]))
        ]
        if reason := state.tenant_limit(head):
            reasons[head.job_id] = reason
        elif ahead:
            reasons[head.job_id] = f"behind tenant {ahead[0]} (fair share)"
        else:
            kind = short[0]  # a head job that fits both its quota and the machine has started
            free, asked = max(state.free[kind], 0), getattr(head, f"{kind}_slots")
            reasons[head.job_id] = f"machine has {free} of {asked} free {kind} slots"
        for later in list(state.lines[name])[1:]:
            reasons[later.job_id] = f"behind job {head.job_id} of the same tenant"
    return reasons
