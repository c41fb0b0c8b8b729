"""Weighted fair share: usage that decays with a half-life, and each tenant's place in line."""

import math
from collections.abc import Iterable, Mapping

from dlscale.errors import UserError
from dlscale.service.scheduler_types import Running

# Usage a tenant earned an hour ago counts half as much as usage earned now (Slurm's
# PriorityDecayHalfLife plays the same part; its default is a week, but a group sharing one
# training machine turns over within a day).
HALF_LIFE_S = 3600.0

# One GPU slot-second is charged as much usage as this many CPU slot-seconds: on a training
# machine the GPU is the scarce resource, so an hour on it must weigh more in a tenant's share
# than an hour on one core (Slurm bills the same way through TRESBillingWeights).
GPU_SLOT_COST = 4.0

# A job that holds its slots counts, in its tenant's place in line, as this many seconds of
# them on top of what its tenant has used: enough that one poll with many free slots shares them
# by weight (each start moves its tenant back), small beside what jobs really use, so that from
# the first hour on the split follows the weights. (Counting a running job as the usage it
# would reach if it ran for ever, cost × half-life / ln 2 ≈ 87 minutes of it, split weights 1:3
# evenly for the first hour: each tenant won back the slot its own job had just freed.)
QUANTUM_S = 300.0

# tenant name -> decayed, weighted slot-seconds (cpu slots + GPU_SLOT_COST × gpu slots, × s)
Usage = dict[str, float]


def slot_cost(cpu_slots: int, gpu_slots: int) -> float:
    """Weighted slots a job holds: the usage it earns per second."""
    return cpu_slots + GPU_SLOT_COST * gpu_slots


def _check_half_life(half_life_s: float) -> None:
    if not (half_life_s > 0 and math.isfinite(half_life_s)):
        raise UserError(f"the usage half-life must be a number of seconds > 0, got {half_life_s}")


def decay(usage: Mapping[str, float], elapsed_s: float, half_life_s: float = HALF_LIFE_S) -> Usage:
    """Usage `elapsed_s` later with nothing running: each half-life halves it."""
    _check_half_life(half_life_s)
    assert elapsed_s >= 0, f"time runs forward (elapsed_s={elapsed_s})"
    factor = 0.5 ** (elapsed_s / half_life_s)
    return {tenant: used * factor for tenant, used in usage.items()}


def steady_usage(cost_per_s: float, half_life_s: float = HALF_LIFE_S) -> float:
    """The usage a constant `cost_per_s` tends to: the integral of cost × 2^(-t/half-life) over
    all past t is cost × half-life / ln 2."""
    return cost_per_s * half_life_s / math.log(2)


def charge(
    usage: Mapping[str, float],
    running: Iterable[Running],
    elapsed_s: float,
    half_life_s: float = HALF_LIFE_S,
) -> Usage:
    """Usage after `running` held their slots for `elapsed_s` (the service charges every poll).

    Each job's slot-seconds decay from the moment they are earned, so charging one interval of
    600 s or ten of 60 s gives the same usage: the poll interval does not tilt the shares."""
    charged = decay(usage, elapsed_s, half_life_s)
    earned_fraction = 1 - 0.5 ** (elapsed_s / half_life_s)  # of the steady usage, in elapsed_s
    for job in running:
        earned = steady_usage(slot_cost(job.cpu_slots, job.gpu_slots), half_life_s)
        charged[job.tenant] = charged.get(job.tenant, 0.0) + earned * earned_fraction
    return charged


def held_usage(cost_per_s: float) -> float:
    """What slots held now add to their tenant's place in line (see QUANTUM_S)."""
    return cost_per_s * QUANTUM_S


def shares(
    usage: Mapping[str, float],
    running: Iterable[Running],
    weights: Mapping[str, float],
) -> dict[str, float]:
    """Each tenant's place in line, lowest first: (decayed usage + running jobs) / weight.

    A running job counts as QUANTUM_S of its slots (`held_usage`), so a tenant that has just
    taken slots goes behind in the same poll; what tenants have really used decides the rest."""
    held = dict.fromkeys(weights, 0.0)
    for job in running:
        held[job.tenant] = held.get(job.tenant, 0.0) + slot_cost(job.cpu_slots, job.gpu_slots)
    return {
        tenant: (usage.get(tenant, 0.0) + held_usage(held[tenant])) / weight
        for tenant, weight in weights.items()
    }
