"""The queue as tenants see it: quotas, decayed usage, why each job waits."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from dlscale.service import jobstore, store
from dlscale.service.deps import Caller, Principal, service
from dlscale.service.fairshare import decay

router = APIRouter()


def queue_view(db, who: Principal, half_life_s: float, machine) -> dict:
    now = time.time()
    roles = store.roles(db, who.user)
    active = jobstore.active_jobs(db)
    queued = jobstore.queued_jobs(db)
    tenants = []
    for tenant in store.tenants(db):
        if tenant.name not in roles and not who.user.is_admin:
            continue
        mine = [j for j in active if j.tenant_id == tenant.id]
        usage = decay(
            {"t": tenant.usage or 0.0}, max(0.0, now - (tenant.usage_at or now)), half_life_s
        )
        tenants.append(
            {
                "name": tenant.name,
                "weight": tenant.weight,
                "role": roles.get(tenant.name),
                "running_jobs": len(mine),
                "max_concurrent_jobs": tenant.max_concurrent_jobs,
                "cpu_slots_used": sum(j.cpu_slots for j in mine),
                "cpu_slots": tenant.cpu_slots,
                "gpu_slots_used": sum(j.gpu_slots for j in mine),
                "gpu_slots": tenant.gpu_slots,
                "storage_used": jobstore.storage_used(db, tenant),
                "storage_bytes": tenant.storage_bytes,
                "usage": usage["t"],
                "waiting": [
                    {
                        "id": j.id,
                        "reason": j.reason or "waiting for the scheduler",
                        "submitted_at": j.submitted_at,
                        "cpu_slots": j.cpu_slots,
                        "gpu_slots": j.gpu_slots,
                    }
                    for j in queued
                    if j.tenant_id == tenant.id
                ],
            }
        )
    return {
        "machine": {
            "cpu_slots": machine.cpu_slots,
            "gpu_slots": machine.gpu_slots,
            "cpu_slots_used": sum(j.cpu_slots for j in active),
            "gpu_slots_used": sum(j.gpu_slots for j in active),
        },
        "half_life_s": half_life_s,
        "tenants": tenants,
    }


@router.get("/api/queue")
def queue(request: Request, who: Caller) -> dict:
    state = service(request)
    with state.maker.begin() as db:
        return queue_view(db, who, state.config.half_life_s, state.loop.machine)
