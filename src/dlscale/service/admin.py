"""The operator's verbs (`dlscale serve admin ...`): each opens the data dir's database, brings its
schema up to date, does one transaction (audited) and returns what the CLI prints."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.orm import Session

from dlscale.errors import UserError
from dlscale.service import auth, jobstore, store
from dlscale.service.config import default_data_dir
from dlscale.service.db import default_url, make_engine, migrate, sessions


@contextmanager
def _transaction(data_dir: Path | None, db_url: str | None) -> Iterator[tuple[Session, Path]]:
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    engine = make_engine(db_url or default_url(data_dir))
    try:
        migrate(engine)
        with sessions(engine).begin() as db:
            yield db, data_dir
    finally:
        engine.dispose()


def create_user(data_dir: Path | None, db_url: str | None, name: str, admin: bool = False) -> str:
    """The new user's one-time password."""
    with _transaction(data_dir, db_url) as (db, _):
        _, password = store.create_user(db, name, admin)
        store.audit(db, "create user", "ok", actor="admin-cli", target=name)
        return password


def create_tenant(
    data_dir: Path | None,
    db_url: str | None,
    name: str,
    weight: float = 1.0,
    max_concurrent_jobs: int | None = None,
    cpu_slots: int | None = None,
    gpu_slots: int | None = None,
    storage_bytes: int | None = None,
    max_queued_jobs: int | None = None,
) -> str:
    """A line describing the new tenant and its quotas."""
    with _transaction(data_dir, db_url) as (db, _):
        tenant = store.create_tenant(
            db,
            name,
            weight,
            max_concurrent_jobs,
            cpu_slots,
            gpu_slots,
            storage_bytes,
            max_queued_jobs,
        )
        store.audit(db, "create tenant", "ok", actor="admin-cli", target=name)
        return describe_tenant(tenant)


def describe_tenant(tenant) -> str:
    """'tenant NAME: weight W, QUOTAS' as the admin commands print it."""
    limits = {
        "max concurrent jobs": tenant.max_concurrent_jobs,
        "cpu slots": tenant.cpu_slots,
        "gpu slots": tenant.gpu_slots,
        "storage bytes": tenant.storage_bytes,
        "max queued jobs": tenant.max_queued_jobs,
    }
    quotas = ", ".join(f"{k} {v}" for k, v in limits.items() if v is not None) or "no quotas"
    return f"tenant {tenant.name}: weight {tenant.weight:g}, {quotas}"


def set_tenant(data_dir: Path | None, db_url: str | None, name: str, **changes) -> str:
    """Change a tenant's weight or quotas (None: no limit); the line describing it after."""
    with _transaction(data_dir, db_url) as (db, _):
        tenant = store.set_tenant(db, name, **changes)
        detail = ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
        store.audit(db, "set tenant", "ok", actor="admin-cli", target=name, detail=detail)
        return describe_tenant(tenant)


def users(data_dir: Path | None, db_url: str | None) -> list[dict]:
    """Every user: name, admin, disabled, created, {tenant: role}."""
    with _transaction(data_dir, db_url) as (db, _):
        return [user_view(db, user) for user in store.users(db)]


def user_view(db, user) -> dict:
    return {
        "name": user.name,
        "is_admin": user.is_admin,
        "disabled": user.disabled,
        "created_at": user.created_at,
        "tenants": store.roles(db, user),
    }


def tenants(data_dir: Path | None, db_url: str | None) -> list[dict]:
    """Every tenant: its weight, quotas and storage in use."""
    with _transaction(data_dir, db_url) as (db, _):
        return [tenant_view(db, tenant) for tenant in store.tenants(db)]


def tenant_view(db, tenant) -> dict:
    view = {key: getattr(tenant, key) for key in ("name", *store.TENANT_SETTINGS)}
    return {**view, "storage_used": jobstore.storage_used(db, tenant)}


def disable_user(
    data_dir: Path | None, db_url: str | None, name: str, disabled: bool = True
) -> str:
    with _transaction(data_dir, db_url) as (db, _):
        store.set_disabled(db, name, disabled)
        action = "disable user" if disabled else "enable user"
        store.audit(db, action, "ok", actor="admin-cli", target=name)
    return f"user {name} {'disabled: their tokens and sessions stop' if disabled else 'enabled'}"


def reset_password(data_dir: Path | None, db_url: str | None, name: str) -> str:
    """The user's new one-time password."""
    with _transaction(data_dir, db_url) as (db, _):
        password = store.reset_password(db, name)
        store.audit(db, "reset password", "ok", actor="admin-cli", target=name)
        return password


def remove_member(data_dir: Path | None, db_url: str | None, tenant: str, user: str) -> str:
    with _transaction(data_dir, db_url) as (db, _):
        if not store.remove_member(db, tenant, user):
            raise UserError(f"{user} is not a member of tenant {tenant}")
        store.audit(db, "remove member", "ok", actor="admin-cli", target=f"{tenant}/{user}")
    return f"{user} is no longer a member of tenant {tenant}"


def add_member(data_dir: Path | None, db_url: str | None, tenant: str, user: str, role: str) -> str:
    with _transaction(data_dir, db_url) as (db, _):
        store.add_member(db, tenant, user, role)
        where = f"{tenant}/{user}"
        store.audit(db, "add member", "ok", actor="admin-cli", target=where, detail=role)
    return f"{user} is {role} in tenant {tenant}"


def issue_token(
    data_dir: Path | None,
    db_url: str | None,
    user: str,
    scope: str = "write",
    expires: str | None = None,
) -> str:
    """The token's text (shown once); `expires` like "30d" or "12h", None for never."""
    expires_s = auth.parse_duration(expires) if expires is not None else None
    with _transaction(data_dir, db_url) as (db, folder):
        text = store.issue_token(db, auth.load_secret(folder), user, scope, expires_s)
        store.audit(
            db, "issue token", "ok", actor="admin-cli", target=user, detail=text.split("_")[1]
        )
        return text


def revoke_token(data_dir: Path | None, db_url: str | None, prefix: str) -> str:
    with _transaction(data_dir, db_url) as (db, _):
        if not store.revoke_token(db, prefix):
            raise UserError(f"no token with prefix '{prefix}' (see the admin token list)")
        store.audit(db, "revoke token", "ok", actor="admin-cli", target=prefix)
    return f"token {prefix} revoked"
