"""The queue as tenants see it (quotas, decayed usage, why each job waits) and the admin's
read-only views: users, tenants, tokens (prefix and last use, never the secret), audit log."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from dlscale.service import store
from dlscale.service.deps import Principal, admin, principal, service
from dlscale.service.fairshare import decay

router = APIRouter()


def queue_view(db, who: Principal, half_life_s: float, machine) -> dict:
    now = time.time()
    roles = store.roles(db, who.user)
    active = store.active_jobs(db)
    queued = store.queued_jobs(db)
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
                "storage_used": store.storage_used(db, tenant),
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
def queue(request: Request, who: Principal = Depends(principal)) -> dict:
    state = service(request)
    with state.maker.begin() as db:
        return queue_view(db, who, state.config.half_life_s, state.loop.machine)


@router.get("/api/admin/users")
def users(request: Request, who: Principal = Depends(admin)) -> list[dict]:
    with service(request).maker.begin() as db:
        return [
            {
                "name": u.name,
                "is_admin": u.is_admin,
                "created_at": u.created_at,
                "tenants": store.roles(db, u),
            }
            for u in store.users(db)
        ]


@router.get("/api/admin/tenants")
def tenants(request: Request, who: Principal = Depends(admin)) -> list[dict]:
    with service(request).maker.begin() as db:
        return [
            {
                "name": t.name,
                "weight": t.weight,
                "max_concurrent_jobs": t.max_concurrent_jobs,
                "cpu_slots": t.cpu_slots,
                "gpu_slots": t.gpu_slots,
                "storage_bytes": t.storage_bytes,
                "storage_used": store.storage_used(db, t),
            }
            for t in store.tenants(db)
        ]


@router.get("/api/admin/tokens")
def tokens(request: Request, who: Principal = Depends(admin)) -> list[dict]:
    with service(request).maker.begin() as db:
        return store.tokens(db)


@router.get("/api/admin/audit")
def audit(request: Request, limit: int = 200, who: Principal = Depends(admin)) -> list[dict]:
    with service(request).maker.begin() as db:
        return [
            {
                "at": e.at,
                "actor": e.actor,
                "ip": e.ip,
                "action": e.action,
                "target": e.target,
                "outcome": e.outcome,
                "detail": e.detail,
            }
            for e in store.audit_log(db, max(1, min(limit, 1000)))
        ]
