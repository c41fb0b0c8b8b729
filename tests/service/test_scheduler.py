"""The service's scheduler: hard quotas, weighted fair share on decayed usage, FIFO within a
tenant, no head-of-line blocking across tenants, and a reason for every job that waits."""

import math
import random

import pytest

from dlscale.errors import UserError
from dlscale.service.fairshare import GPU_SLOT_COST, charge, decay
from dlscale.service.scheduler import check_fits, plan
from dlscale.service.scheduler_types import Machine, Request, Running, Tenant
from dlscale.service.simulation import Arrival, simulate

HOUR_S = 3600.0


def tenants(*items: Tenant) -> dict[str, Tenant]:
    return {t.name: t for t in items}


@pytest.mark.parametrize(
    ("request_", "tenant", "machine", "reason"),
    [
        (
            Request("j", "a", 1, 1),
            Tenant("a"),
            Machine(4),
            "asks for 1 gpu slots but this server has no GPUs",
        ),
        (
            Request("j", "a", 8),
            Tenant("a"),
            Machine(4),
            "asks for 8 cpu slots but the machine has 4",
        ),
        (
            Request("j", "a", 3),
            Tenant("a", cpu_slots=2),
            Machine(4),
            "asks for 3 cpu slots but tenant a's quota is 2",
        ),
        (
            Request("j", "a", 1, 2),
            Tenant("a", gpu_slots=1),
            Machine(4, 2),
            "asks for 2 gpu slots but tenant a's quota is 1",
        ),
        (
            Request("j", "a", 1, 3),
            Tenant("a"),
            Machine(4, 2),
            "asks for 3 gpu slots but the machine has 2",
        ),
        (
            Request("j", "a", 1),
            Tenant("a", max_concurrent_jobs=0),
            Machine(4),
            "tenant a may run no jobs (max_concurrent_jobs 0)",
        ),
        (
            Request("j", "a", 0),
            Tenant("a"),
            Machine(4),
            "asks for no slots; a job needs at least one",
        ),
        (Request("j", "a", 4, 2), Tenant("a", 2, 1, 4, 2), Machine(4, 2), None),
    ],
)
def test_check_fits_names_why_a_request_can_never_run(request_, tenant, machine, reason):
    assert check_fits(request_, tenant, machine) == reason


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Tenant("a", weight=0), "tenant a: weight must be a number > 0, got 0"),
        (lambda: Tenant("a", cpu_slots=-1), "tenant a: cpu_slots must be a whole number >= 0"),
        (lambda: Machine(cpu_slots=2.5), "machine: cpu_slots must be a whole number >= 0"),
        (lambda: Request("j", "a", cpu_slots=-2), "job j: cpu_slots must be a whole number >= 0"),
        (lambda: decay({}, 1.0, half_life_s=0), "half-life must be a number of seconds > 0"),
    ],
)
def test_bad_settings_are_one_line_user_errors(make, message):
    with pytest.raises(UserError, match=message):
        make()


def test_decayed_usage_halves_after_one_half_life():
    assert decay({"a": 100.0}, HOUR_S, HOUR_S) == {"a": 50.0}
    assert decay({"a": 100.0}, 2 * HOUR_S, HOUR_S)["a"] == pytest.approx(25.0)
    twice = decay(decay({"a": 100.0}, HOUR_S / 2, HOUR_S), HOUR_S / 2, HOUR_S)
    assert twice["a"] == pytest.approx(50.0)


def test_charging_does_not_depend_on_the_poll_interval():
    running = [Running("j", "a", cpu_slots=2, gpu_slots=1)]
    once = charge({"a": 10.0}, running, 600.0, HOUR_S)
    often = {"a": 10.0}
    for _ in range(10):
        often = charge(often, running, 60.0, HOUR_S)
    assert often["a"] == pytest.approx(once["a"])
    # A short interval earns about slots × seconds, a GPU slot counting GPU_SLOT_COST CPU slots.
    assert charge({}, running, 1.0, HOUR_S)["a"] == pytest.approx(2 + GPU_SLOT_COST, rel=1e-3)
    # Held for ever, usage tends to cost × half-life / ln 2 and no further.
    forever = charge({}, running, 50 * HOUR_S, HOUR_S)["a"]
    assert forever == pytest.approx((2 + GPU_SLOT_COST) * HOUR_S / math.log(2))


def test_the_tenant_with_least_usage_per_weight_starts_first():
    ts = tenants(Tenant("heavy", weight=10), Tenant("light"), Tenant("idle"))
    queued = [Request("h1", "heavy", 1, 0, 1.0), Request("l1", "light", 1, 0, 0.0)]
    # heavy: 1000/10 = 100 per weight, light: 500/1 = 500: heavy is first despite more usage.
    decision = plan(queued, [], ts, Machine(1), {"heavy": 1000.0, "light": 500.0})
    assert decision.start == ["h1"]
    assert decision.waiting == {"l1": "machine has 0 of 1 free cpu slots"}
    # What a tenant runs now counts too: light running a job puts it behind idle.
    queued = [Request("l2", "light", 1, 0, 0.0), Request("i1", "idle", 1, 0, 5.0)]
    decision = plan(queued, [Running("l1", "light", 1)], ts, Machine(2), {})
    assert decision.start == ["i1"]


def test_jobs_of_one_tenant_start_first_submitted_first():
    queued = [Request(f"j{i}", "a", 1, 0, submitted_at=10.0 - i) for i in range(4)]
    decision = plan(queued, [], tenants(Tenant("a")), Machine(2), {})
    assert decision.start == ["j3", "j2"]
    assert decision.waiting == {
        "j1": "machine has 0 of 1 free cpu slots",
        "j0": "behind job j1 of the same tenant",
    }


def test_one_poll_shares_free_slots_by_weight():
    ts = tenants(Tenant("a", weight=3), Tenant("b", weight=1))
    queued = [Request(f"{t}{i}", t, 1, 0, float(i)) for t in "ab" for i in range(8)]
    decision = plan(queued, [], ts, Machine(8), {})
    assert sum(job.startswith("a") for job in decision.start) == 6
    assert sum(job.startswith("b") for job in decision.start) == 2


def test_a_tenant_at_its_quota_does_not_block_another_tenant():
    ts = tenants(Tenant("a", max_concurrent_jobs=1), Tenant("b"))
    queued = [Request("a2", "a", 1, 0, 0.0), Request("a3", "a", 1, 0, 1.0)]
    queued.append(Request("b1", "b", 1, 0, 2.0))
    decision = plan(queued, [Running("a1", "a", 1)], ts, Machine(4), {"b": 1e9})
    assert decision.start == ["b1"]
    assert decision.waiting == {
        "a2": "tenant at max_concurrent_jobs 1/1",
        "a3": "behind job a2 of the same tenant",
    }


def test_a_huge_job_does_not_block_another_tenants_small_job():
    ts = tenants(Tenant("big"), Tenant("small"), Tenant("capped", cpu_slots=4))
    queued = [
        Request("huge", "big", 4, 0, 0.0),
        Request("after-huge", "big", 1, 0, 1.0),
        Request("tiny", "small", 1, 0, 2.0),
        Request("over-quota", "capped", 2, 0, 3.0),
    ]
    running = [Running("r1", "capped", 3), Running("r2", "small", 1)]
    # big has no usage, so it is first in line, but its 4 slots are not free: small goes on.
    decision = plan(queued, running, ts, Machine(6), {"small": 5e4, "capped": 0.0})
    assert decision.start == ["tiny"]
    assert decision.waiting == {
        "huge": "machine has 1 of 4 free cpu slots",
        "after-huge": "behind job huge of the same tenant",
        "over-quota": "tenant at cpu_slots 3/4, needs 2",
    }


def test_a_waiting_tenant_is_told_who_is_ahead_in_fair_share():
    ts = tenants(Tenant("a"), Tenant("b"), Tenant("g", gpu_slots=1))
    queued = [Request("a1", "a", 1, 0, 0.0), Request("b1", "b", 2, 0, 1.0)]
    queued += [Request("g1", "g", 1, 1, 2.0), Request("g2", "g", 1, 1, 3.0)]
    running = [Running("x", "g", 1, 1), Running("y", "b", 1)]
    # The cpu slots are all taken; when they free up, b (least usage per weight) goes first.
    decision = plan(queued, running, ts, Machine(2, 2), {"a": 1e5, "b": 1.0, "g": 0.0})
    assert decision.start == []
    assert decision.waiting == {
        "b1": "machine has 0 of 2 free cpu slots",
        "a1": "behind tenant b (fair share)",
        "g1": "tenant at gpu_slots 1/1, needs 1",
        "g2": "behind job g1 of the same tenant",
    }


def test_requests_that_can_never_run_wait_with_the_reason_and_block_nothing():
    ts = tenants(Tenant("a", cpu_slots=2))
    queued = [Request("too-big", "a", 3, 0, 0.0), Request("ok", "a", 1, 0, 1.0)]
    queued.append(Request("orphan", "gone", 1, 0, 2.0))
    decision = plan(queued, [], ts, Machine(4), {})
    assert decision.start == ["ok"]
    assert decision.waiting == {
        "too-big": "can never run: asks for 3 cpu slots but tenant a's quota is 2",
        "orphan": "tenant gone does not exist",
    }


def check_every_poll(ts: dict[str, Tenant], machine: Machine, seen: set[str], reasons: list[str]):
    """An observer asserting the hard quotas after every poll, that every queued job either
    starts or has a reason, and that no job starts twice."""

    def observe(now_s: float, running: list[Running], decision) -> None:
        assert not seen & set(decision.start), f"started twice at {now_s}"
        seen.update(decision.start)
        assert all(reason for reason in decision.waiting.values())
        reasons.extend(decision.waiting.values())
        assert not set(decision.start) & set(decision.waiting)
        assert sum(job.cpu_slots for job in running) <= machine.cpu_slots
        assert sum(job.gpu_slots for job in running) <= machine.gpu_slots
        for name, tenant in ts.items():
            mine = [job for job in running if job.tenant == name]
            for quota, used in [
                (tenant.max_concurrent_jobs, len(mine)),
                (tenant.cpu_slots, sum(job.cpu_slots for job in mine)),
                (tenant.gpu_slots, sum(job.gpu_slots for job in mine)),
            ]:
                assert quota is None or used <= quota, (now_s, name, quota, used)

    return observe


def test_quotas_hold_at_every_poll_of_a_mixed_simulation():
    ts = tenants(
        Tenant("a", weight=2, max_concurrent_jobs=3),
        Tenant("b", cpu_slots=4, gpu_slots=1),
        Tenant("c", weight=0.5, max_concurrent_jobs=2, cpu_slots=6),
    )
    machine, rng = Machine(8, 2), random.Random(0)
    arrivals = [
        Arrival(
            Request(
                f"{name}{i}",
                name,
                rng.randint(1, 4),
                rng.choice([0, 0, 1]),
                rng.uniform(0, 2 * HOUR_S),
            ),
            run_s=rng.uniform(60, 900),
        )
        for name in ts
        for i in range(30)
    ]
    arrivals += [  # never fit: refused at submit, as the service does
        Arrival(Request("b-greedy", "b", 5, 0, 10.0), run_s=60.0),
        Arrival(Request("a-gpus", "a", 1, 3, 20.0), run_s=60.0),
    ]
    seen: set[str] = set()
    reasons: list[str] = []
    observe = check_every_poll(ts, machine, seen, reasons)
    outcome = simulate(ts, machine, arrivals, 6 * HOUR_S, 60.0, HOUR_S, observe)
    assert outcome.refused == {
        "b-greedy": "asks for 5 cpu slots but tenant b's quota is 4",
        "a-gpus": "asks for 3 gpu slots but the machine has 2",
    }
    # Every other job started exactly once, in the order the polls started them.
    assert len(outcome.start_order) == len(seen) == 90
    # The quotas and the machine really were the limits at some polls, so the checks bit.
    for limit in ("max_concurrent_jobs", "cpu_slots", "gpu_slots", "machine has", "behind"):
        assert any(limit in reason for reason in reasons), limit


def backlog(job_id: str, tenant: str, submitted_at: float) -> Arrival:
    """A one-slot job that runs ten minutes."""
    return Arrival(Request(job_id, tenant, 1, 0, submitted_at), run_s=600.0)


@pytest.mark.parametrize(("weight_a", "weight_b", "cpu_slots"), [(1, 1, 4), (3, 1, 4), (3, 1, 5)])
def test_two_backlogged_tenants_share_slot_seconds_by_weight(weight_a, weight_b, cpu_slots):
    ts = tenants(Tenant("a", weight=weight_a), Tenant("b", weight=weight_b))
    # Both submit far more 10-minute jobs than 8 hours can run, so neither ever runs dry.
    arrivals = [backlog(f"{t}{i}", t, 0.0) for t in "ab" for i in range(400)]
    outcome = simulate(ts, Machine(cpu_slots), arrivals, 8 * HOUR_S, 60.0, HOUR_S)
    total = sum(outcome.slot_seconds.values())
    assert total == pytest.approx(cpu_slots * 8 * HOUR_S)  # no slot was left idle
    share_a = outcome.slot_seconds["a"] / total
    expected_a = weight_a / (weight_a + weight_b)
    assert abs(share_a - expected_a) <= 0.1 * expected_a, (share_a, expected_a)
    assert outcome.usage["a"] / weight_a == pytest.approx(outcome.usage["b"] / weight_b, rel=0.1)


def test_past_usage_puts_a_tenant_behind_until_it_decays():
    """A tenant who ran alone all night yields to a newcomer in the morning, then they share."""
    ts = tenants(Tenant("night"), Tenant("morning"))
    night = [backlog(f"n{i:03d}", "night", 0.0) for i in range(200)]
    morning = [backlog(f"m{i:02d}", "morning", 8 * HOUR_S) for i in range(20)]
    outcome = simulate(ts, Machine(2), night + morning, 10 * HOUR_S, 60.0, HOUR_S)
    # Two slots × 8 hours of ten-minute jobs: the night ran 96 before the morning came.
    assert all(job.startswith("n") for job in outcome.start_order[:96])
    # The morning takes both slots for an hour, while the night's usage decays to its own...
    assert outcome.start_order[96:108] == [f"m{i:02d}" for i in range(12)]
    # ...then they take turns (weights 1:1).
    assert outcome.start_order[108:114] == ["n096", "m12", "n097", "m13", "n098", "m14"]


@pytest.mark.parametrize(("weight_a", "weight_b", "cpu_slots"), [(1, 3, 2), (3, 1, 2), (1, 3, 4)])
def test_weights_hold_from_the_first_hour(weight_a, weight_b, cpu_slots):
    """Two tenants with full queues from the start split the first hour's slot-seconds by their
    weights within 10%. (Counting a running job as an hour and a half of usage once split 1:3
    evenly for the first hour: each tenant won back the slot its own job had just freed.)"""
    ts = tenants(Tenant("a", weight=weight_a), Tenant("b", weight=weight_b))
    arrivals = [backlog(f"{t}{i}", t, 0.0) for t in "ab" for i in range(100)]
    outcome = simulate(ts, Machine(cpu_slots), arrivals, HOUR_S, 60.0, HOUR_S)
    share_a = outcome.slot_seconds["a"] / sum(outcome.slot_seconds.values())
    expected_a = weight_a / (weight_a + weight_b)
    assert abs(share_a - expected_a) <= 0.1 * expected_a, (share_a, expected_a)
