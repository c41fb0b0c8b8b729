"""Who may use the service: users, tenants, memberships, tokens, web sessions and the audit log,
as functions over an open SQLAlchemy session. None of them commits: each call site wraps them in
`with maker.begin() as db:` so that it is one transaction. Jobs are in jobstore.py."""

from __future__ import annotations

import re
import time
from functools import cache

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dlscale.errors import UserError
from dlscale.service import auth
from dlscale.service.db.models import AuditEntry, Membership, Tenant, Token, User, WebSession
from dlscale.service.scheduler_types import Tenant as TenantQuota
from dlscale.service.scheduler_types import check_count

SESSION_TTL_S = 12 * 3600
# Names appear in URLs, CLI arguments and folder listings: keep them plain.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@cache
def _dummy_hash() -> str:
    """Checked against when the name is unknown, so a wrong name costs the same time as a wrong
    password and does not tell which names exist."""
    return auth.hash_password(auth.new_password())


def _check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UserError(
            f"{what} name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return name


def _insert(db: Session, row, taken: str):
    """Add `row`; a unique name taken by a concurrent transaction since we looked is `taken`."""
    db.add(row)
    try:
        db.flush()
    except IntegrityError:
        raise UserError(taken) from None
    return row


def _user(db: Session, user: User | str) -> User:
    if isinstance(user, User):
        return user
    found = db.scalar(select(User).where(User.name == user))
    if found is None:
        raise UserError(f"no user named '{user}'")
    return found


def tenant_named(db: Session, name: str) -> Tenant | None:
    """The tenant called `name` (one indexed lookup); None when there is none."""
    return db.scalar(select(Tenant).where(Tenant.name == name))


def _tenant(db: Session, tenant: Tenant | str) -> Tenant:
    if isinstance(tenant, Tenant):
        return tenant
    found = tenant_named(db, tenant)
    if found is None:
        raise UserError(f"no tenant named '{tenant}'")
    return found


# ------------------------------------------------------------------ users, tenants, members


def create_user(db: Session, name: str, admin: bool = False) -> tuple[User, str]:
    """(the new user, their one-time password: shown once, only its hash is kept)."""
    _check_name("user", name)
    if db.scalar(select(User.id).where(User.name == name)) is not None:
        raise UserError(f"user '{name}' already exists")
    password = auth.new_password()
    user = User(
        name=name,
        password_hash=auth.hash_password(password),
        is_admin=bool(admin),
        created_at=time.time(),
    )
    return _insert(db, user, f"user '{name}' already exists"), password


# What an operator may set on a tenant, besides its name.
TENANT_SETTINGS = (
    "weight",
    "max_concurrent_jobs",
    "cpu_slots",
    "gpu_slots",
    "storage_bytes",
    "max_queued_jobs",
)


def _check_tenant(name: str, settings: dict) -> None:
    quota = {k: settings.get(k) for k in ("max_concurrent_jobs", "cpu_slots", "gpu_slots")}
    TenantQuota(name, settings.get("weight", 1.0), **quota)  # validates, or raises
    for key in ("storage_bytes", "max_queued_jobs"):
        check_count(f"tenant {name}", key, settings.get(key), optional=True)


def create_tenant(
    db: Session,
    name: str,
    weight: float = 1.0,
    max_concurrent_jobs: int | None = None,
    cpu_slots: int | None = None,
    gpu_slots: int | None = None,
    storage_bytes: int | None = None,
    max_queued_jobs: int | None = None,
) -> Tenant:
    _check_name("tenant", name)
    settings = {
        "weight": weight,
        "max_concurrent_jobs": max_concurrent_jobs,
        "cpu_slots": cpu_slots,
        "gpu_slots": gpu_slots,
        "storage_bytes": storage_bytes,
        "max_queued_jobs": max_queued_jobs,
    }
    _check_tenant(name, settings)
    if db.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise UserError(f"tenant '{name}' already exists")
    tenant = Tenant(name=name, **{**settings, "weight": float(weight)}, usage=0.0, usage_at=None)
    return _insert(db, tenant, f"tenant '{name}' already exists")


def set_tenant(db: Session, name: str, **changes) -> Tenant:
    """Change a tenant's weight and quotas (a quota of None: no limit); the scheduler applies
    them from its next poll, to the jobs already queued too."""
    unknown = set(changes) - set(TENANT_SETTINGS)
    if unknown:
        raise UserError(f"tenant settings are {', '.join(TENANT_SETTINGS)} (not {unknown.pop()})")
    tenant = _tenant(db, name)
    settings = {key: getattr(tenant, key) for key in TENANT_SETTINGS} | changes
    _check_tenant(tenant.name, settings)
    for key, value in changes.items():
        setattr(tenant, key, float(value) if key == "weight" else value)
    db.flush()
    return tenant


def set_disabled(db: Session, name: str, disabled: bool) -> User:
    """Turn an account off (its tokens and sessions stop working at once) or on again."""
    user = _user(db, name)
    user.disabled = bool(disabled)
    if disabled:
        for held in db.scalars(select(WebSession).where(WebSession.user_id == user.id)):
            db.delete(held)
    db.flush()
    return user


def reset_password(db: Session, name: str) -> str:
    """A new one-time password for the user (their sessions end; their tokens stay)."""
    user = _user(db, name)
    password = auth.new_password()
    user.password_hash = auth.hash_password(password)
    for held in db.scalars(select(WebSession).where(WebSession.user_id == user.id)):
        db.delete(held)
    db.flush()
    return password


def remove_member(db: Session, tenant: Tenant | str, user: User | str) -> bool:
    """Take `user` out of `tenant` (their jobs stay the tenant's); False if not a member."""
    tenant, user = _tenant(db, tenant), _user(db, user)
    member = db.scalar(
        select(Membership).where(Membership.tenant_id == tenant.id, Membership.user_id == user.id)
    )
    if member is None:
        return False
    db.delete(member)
    db.flush()
    return True


def add_member(db: Session, tenant: Tenant | str, user: User | str, role: str) -> Membership:
    """Give `user` `role` in `tenant` (changing the role they had there, if any)."""
    auth.check_role(role)
    tenant, user = _tenant(db, tenant), _user(db, user)
    member = db.scalar(
        select(Membership).where(Membership.tenant_id == tenant.id, Membership.user_id == user.id)
    )
    if member is None:
        member = Membership(tenant_id=tenant.id, user_id=user.id, role=role)
        db.add(member)
    member.role = role
    db.flush()
    return member


def roles(db: Session, user: User) -> dict[str, str]:
    """{tenant name: role} for every tenant `user` belongs to."""
    rows = db.execute(
        select(Tenant.name, Membership.role)
        .join(Membership, Membership.tenant_id == Tenant.id)
        .where(Membership.user_id == user.id)
        .order_by(Tenant.name)
    )
    return dict(rows.all())


def users(db: Session) -> list[User]:
    return list(db.scalars(select(User).order_by(User.name)))


def tenants(db: Session) -> list[Tenant]:
    return list(db.scalars(select(Tenant).order_by(Tenant.name)))


def password_of(db: Session, name: str) -> tuple[User | None, str]:
    """A user and the hash a login is checked against (a dummy one for an unknown name, so a
    wrong name costs the time of a wrong password). The caller checks it after the transaction:
    argon2 takes ~0.2 s, too long to hold SQLite's one write lock."""
    user = db.scalar(select(User).where(User.name == name))
    if user is not None and user.disabled:
        return None, _dummy_hash()  # a disabled account logs in no more
    return user, user.password_hash if user is not None else _dummy_hash()


def check_login(db: Session, name: str, password: str) -> User | None:
    user, hashed = password_of(db, name)
    return user if auth.verify_password(hashed, password) and user is not None else None


# ------------------------------------------------------------------ tokens


def issue_token(
    db: Session,
    key: bytes,
    user: User | str,
    scope: str = "write",
    expires_s: float | None = None,
) -> str:
    """A new API token for `user`; its text is returned once and only its digest is kept."""
    if scope not in auth.SCOPES:
        raise UserError(f"scope '{scope}' is not one of {', '.join(auth.SCOPES)}")
    if expires_s is not None and not expires_s > 0:
        raise UserError(f"a token must expire after a time > 0, got {expires_s} s")
    user = _user(db, user)
    text, prefix = auth.new_token()
    while db.scalar(select(Token.id).where(Token.prefix == prefix)) is not None:
        text, prefix = auth.new_token()  # 32-bit prefixes: rare, but they may repeat
    now = time.time()
    db.add(
        Token(
            user_id=user.id,
            prefix=prefix,
            digest=auth.digest(key, text),
            scope=scope,
            created_at=now,
            expires_at=None if expires_s is None else now + expires_s,
            last_used_at=None,
            revoked=False,
        )
    )
    db.flush()
    return text


def authenticate_token(db: Session, key: bytes, text: str) -> tuple[User, Token] | None:
    """(user, token) for a valid token; None for a malformed, unknown, wrong, expired or
    revoked one. Marks the token used."""
    prefix = auth.parse_token(text)
    if prefix is None:
        return None
    token = db.scalar(select(Token).where(Token.prefix == prefix))
    if token is None or not auth.same_digest(key, text, token.digest):
        return None
    now = time.time()
    if token.revoked or (token.expires_at is not None and token.expires_at <= now):
        return None
    user = db.get(User, token.user_id)
    if user.disabled:
        return None
    token.last_used_at = now
    return user, token


def revoke_token(db: Session, prefix: str) -> bool:
    """Revoke the token named by its prefix; False when there is none."""
    token = db.scalar(select(Token).where(Token.prefix == prefix))
    if token is None:
        return False
    token.revoked = True
    return True


def tokens(db: Session) -> list[dict]:
    """Every token as admins see it: prefix, owner, scope and dates, never the digest."""
    rows = db.execute(
        select(Token, User.name).join(User, User.id == Token.user_id).order_by(Token.id)
    )
    return [
        {
            "prefix": token.prefix,
            "user": name,
            "scope": token.scope,
            "created_at": token.created_at,
            "expires_at": token.expires_at,
            "last_used_at": token.last_used_at,
            "revoked": token.revoked,
        }
        for token, name in rows
    ]


# ------------------------------------------------------------------ web sessions


def open_session(
    db: Session, key: bytes, user: User, ttl_s: float = SESSION_TTL_S
) -> tuple[str, str]:
    """(session id for the cookie, CSRF value); expired sessions are swept out meanwhile."""
    now = time.time()
    for stale in db.scalars(select(WebSession).where(WebSession.expires_at <= now)):
        db.delete(stale)
    session_id, csrf = auth.new_session()
    db.add(
        WebSession(
            digest=auth.digest(key, session_id),
            user_id=user.id,
            csrf_digest=auth.digest(key, csrf),
            created_at=now,
            expires_at=now + ttl_s,
        )
    )
    db.flush()
    return session_id, csrf


def session_of(db: Session, key: bytes, session_id: str) -> tuple[User, WebSession] | None:
    """(user, session) for a live session cookie; None for an unknown or expired one."""
    if not session_id:
        return None
    found = db.scalar(select(WebSession).where(WebSession.digest == auth.digest(key, session_id)))
    if found is None or found.expires_at <= time.time():
        return None
    user = db.get(User, found.user_id)
    return None if user.disabled else (user, found)


def check_csrf(key: bytes, web_session: WebSession, header_value: str | None) -> bool:
    return bool(header_value) and auth.same_digest(key, header_value, web_session.csrf_digest)


def close_session(db: Session, key: bytes, session_id: str) -> None:
    found = db.scalar(select(WebSession).where(WebSession.digest == auth.digest(key, session_id)))
    if found is not None:
        db.delete(found)


# ------------------------------------------------------------------ audit log


def audit(
    db: Session,
    action: str,
    outcome: str,
    actor: str | None = None,
    ip: str | None = None,
    target: str | None = None,
    detail: str | None = None,
) -> AuditEntry:
    entry = AuditEntry(
        at=time.time(),
        actor=actor[:200] if actor else actor,
        ip=ip[:64] if ip else ip,
        action=action[:50],
        target=target[:200] if target else target,
        outcome=outcome[:20],
        detail=detail,
    )
    db.add(entry)
    return entry


def audit_log(db: Session, limit: int = 200) -> list[AuditEntry]:
    """The newest `limit` entries, newest first."""
    return list(db.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)))
