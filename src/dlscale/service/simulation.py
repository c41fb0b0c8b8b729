"""A discrete-event run of the scheduler over simulated time, for tests and benchmarks.

Pure and deterministic: jobs have a known run time, the clock advances in polls of `step_s`
as the service's does, and a job holds its slots until the first poll at or after its end
(the service, too, notices a finished job only when it polls)."""

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from dlscale.service.fairshare import HALF_LIFE_S, Usage, charge, slot_cost
from dlscale.service.scheduler import Decision, check_fits, plan
from dlscale.service.scheduler_types import Machine, Request, Running, Tenant


@dataclass(frozen=True)
class Arrival:
    """A job submitted at `request.submitted_at` (simulated seconds) that runs for `run_s`."""

    request: Request
    run_s: float


@dataclass
class Outcome:
    """What a simulation did: weighted slot-seconds held per tenant (cpu + GPU_SLOT_COST × gpu
    slots, × s, not decayed), job ids in start order, refusals at submit, final decayed usage."""

    slot_seconds: dict[str, float]
    start_order: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    usage: Usage = field(default_factory=dict)


# Called after every poll with (time_s, jobs running after the poll's starts, the decision).
Observer = Callable[[float, list[Running], Decision], None]


def simulate(
    tenants: Mapping[str, Tenant],
    machine: Machine,
    arrivals: Iterable[Arrival],
    duration_s: float,
    step_s: float,
    half_life_s: float = HALF_LIFE_S,
    observe: Observer | None = None,
) -> Outcome:
    """Poll the scheduler every `step_s` from 0 until `duration_s`, as the service would."""
    assert step_s > 0, step_s
    pending = deque(sorted(arrivals, key=lambda a: (a.request.submitted_at, a.request.job_id)))
    run_s = {a.request.job_id: a.run_s for a in pending}
    outcome = Outcome(slot_seconds=dict.fromkeys(tenants, 0.0))
    queued: list[Request] = []
    running: list[Running] = []
    usage: Usage = {}
    poll = 0
    while (now_s := poll * step_s) < duration_s:  # counted in polls: no drift from float sums
        running = [job for job in running if job.started_at + run_s[job.job_id] > now_s]
        while pending and pending[0].request.submitted_at <= now_s:
            request = pending.popleft().request
            never = check_fits(request, tenants[request.tenant], machine)
            if never:  # the service refuses it at submit: it is never queued
                outcome.refused[request.job_id] = never
            else:
                queued.append(request)
        decision = plan(queued, running, tenants, machine, usage)
        starting = set(decision.start)
        running += [Running.of(job, now_s) for job in queued if job.job_id in starting]
        queued = [job for job in queued if job.job_id not in starting]
        outcome.start_order += decision.start
        if observe is not None:
            observe(now_s, list(running), decision)
        elapsed_s = min(step_s, duration_s - now_s)
        usage = charge(usage, running, elapsed_s, half_life_s)
        for job in running:
            cost = slot_cost(job.cpu_slots, job.gpu_slots)
            outcome.slot_seconds[job.tenant] += cost * elapsed_s
        poll += 1
    outcome.usage = usage
    return outcome
