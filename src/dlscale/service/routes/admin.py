"""The operators' routes (admins only): users, tenants, tokens (prefix and last use, never the
secret) and the audit log; disable or enable a user, reset a password, remove a member, change a
tenant's weight and quotas. Each change is audited with who made it and from where."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveFloat

from dlscale.errors import UserError
from dlscale.service import store
from dlscale.service.admin import tenant_view, user_view
from dlscale.service.deps import Admin, Principal, client_address, service

router = APIRouter()


class Disable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    disabled: bool


class TenantChange(BaseModel):
    """The settings to change; a quota given as null means no limit."""

    model_config = ConfigDict(extra="forbid")

    weight: PositiveFloat | None = None
    max_concurrent_jobs: NonNegativeInt | None = None
    cpu_slots: NonNegativeInt | None = None
    gpu_slots: NonNegativeInt | None = None
    storage_bytes: NonNegativeInt | None = None
    max_queued_jobs: NonNegativeInt | None = None


def _change(request: Request, who: Principal, action: str, target: str, do, detail=None):
    """Run `do(db)` and audit it in one transaction; a refusal is 404 or 422 in one line."""
    with service(request).maker.begin() as db:
        try:
            answer = do(db)
        except UserError as exc:
            raise HTTPException(
                404 if "no user" in str(exc) or "no tenant" in str(exc) else 422, str(exc)
            ) from None
        store.audit(
            db,
            action,
            "ok",
            actor=who.user.name,
            ip=client_address(request),
            target=target,
            detail=detail,
        )
        return answer


@router.get("/api/admin/users")
def users(request: Request, who: Admin) -> list[dict]:
    with service(request).maker.begin() as db:
        return [user_view(db, user) for user in store.users(db)]


@router.get("/api/admin/tenants")
def tenants(request: Request, who: Admin) -> list[dict]:
    with service(request).maker.begin() as db:
        return [tenant_view(db, tenant) for tenant in store.tenants(db)]


@router.get("/api/admin/tokens")
def tokens(request: Request, who: Admin) -> list[dict]:
    with service(request).maker.begin() as db:
        return store.tokens(db)


@router.get("/api/admin/audit")
def audit(request: Request, who: Admin, limit: int = 200) -> list[dict]:
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


@router.post("/api/admin/users/{name}/disable")
def disable(name: str, body: Disable, request: Request, who: Admin) -> dict:
    """Turn an account off (its tokens and sessions stop at once) or on again."""
    if body.disabled and name == who.user.name:
        raise HTTPException(422, "an admin cannot disable their own account")
    action = "disable user" if body.disabled else "enable user"
    user = _change(
        request, who, action, name, lambda db: store.set_disabled(db, name, body.disabled)
    )
    return {"name": user.name, "disabled": user.disabled}


@router.post("/api/admin/users/{name}/password")
def reset(name: str, request: Request, who: Admin) -> dict:
    """A new one-time password for the user, shown once (only its hash is kept)."""
    password = _change(
        request, who, "reset password", name, lambda db: store.reset_password(db, name)
    )
    return {"name": name, "password": password}


@router.delete("/api/admin/tenants/{tenant}/members/{user}")
def remove(tenant: str, user: str, request: Request, who: Admin) -> dict:
    """Take a user out of a tenant (the tenant keeps its jobs)."""

    def do(db):
        if not store.remove_member(db, tenant, user):
            raise UserError(f"no user {user} in tenant {tenant}")

    _change(request, who, "remove member", f"{tenant}/{user}", do)
    return {"tenant": tenant, "user": user, "removed": True}


@router.patch("/api/admin/tenants/{tenant}")
def change(tenant: str, body: TenantChange, request: Request, who: Admin):
    """Change a tenant's weight and quotas; fields left out stay as they are."""
    changes = {key: getattr(body, key) for key in body.model_fields_set}
    if "weight" in changes and changes["weight"] is None:
        raise HTTPException(422, "weight: a tenant always has one (a number > 0)")
    detail = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))

    def do(db):
        return tenant_view(db, store.set_tenant(db, tenant, **changes))

    return _change(request, who, "set tenant", tenant, do, detail)
