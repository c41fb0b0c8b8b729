"""Who is asking, and what they may touch: written once, used by every route as dependencies.

Credentials are a bearer token (`Authorization: Bearer dls_...`, for scripts and `dlscale
remote`) or the dashboard's session cookie, which needs the CSRF header on every state change.
A job is reached only through `job_access`, which answers 404 for a job of a tenant the caller
is not a member of: the same answer as for a job that does not exist, so ids cannot be probed.

A route declares what it needs by type, as the FastAPI template does (`CurrentUser`,
`SessionDep`): `Caller`, `Writer` or `Admin` for who asks, `ViewableJob` or `EditableJob` for a
job at `{job_id}` (whose tenant the caller belongs to, with that role at least).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from dlscale.service import jobstore, store
from dlscale.service.auth import ROLES
from dlscale.service.db.models import Job
from dlscale.service.state import ServiceState

SESSION_COOKIE = "dlscale_session"
CSRF_COOKIE = "dlscale_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
JOB_ID = re.compile(r"[0-9a-f]{16}")
ARTIFACT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class Principal:
    user: Any  # db.models.User
    via: str  # "token" | "session"
    scope: str  # "read" | "write"
    csrf: str | None = None  # the session's CSRF value (pages embed nothing else)


def service(request: Request) -> ServiceState:
    return request.app.state.service


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _unauthorized(detail: str = "authentication required") -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def _key(request: Request, name: str | None) -> str:
    """What failures are counted against: the address, and for logins the name tried (users
    sharing an address are not locked out of their own accounts by another's typos)."""
    return f"{client_address(request)}|{name or ''}"


def check_not_limited(request: Request, name: str | None = None) -> None:
    """429 while this address (and login name) has too many recent failures; for a login, also
    while the address has failed too often across all the names it tried (one password sprayed
    over many names)."""
    state = service(request)
    waits = [state.limiter.retry_after_s(_key(request, name))]
    if name is not None:
        waits.append(state.address_limiter.retry_after_s(client_address(request)))
    wait = max((w for w in waits if w is not None), default=None)
    if wait is not None:
        raise HTTPException(
            429,
            f"too many failed attempts; try again in {wait} s",
            headers={"Retry-After": str(wait)},
        )


def record_failure(request: Request, action: str, actor: str | None, detail: str) -> None:
    state = service(request)
    address = client_address(request)
    state.limiter.fail(_key(request, actor))
    if action == "login":
        state.address_limiter.fail(address)
    with state.maker.begin() as db:
        store.audit(db, action, "denied", actor=actor, ip=address, detail=detail)


def principal(request: Request) -> Principal:
    state = service(request)
    header = request.headers.get("authorization")
    if header is not None:
        # A valid token always passes (tokens are 256-bit: a limit protects the server's log,
        # not the token); only a failing address is told to wait, so users sharing an address
        # (loopback, a proxy) are not locked out by one of them.
        scheme, _, text = header.partition(" ")
        found = None
        if scheme.lower() == "bearer" and text.strip():
            with state.maker.begin() as db:
                found = store.authenticate_token(db, state.secret, text.strip())
        if found is None:
            check_not_limited(request)
            record_failure(request, "token", None, "bad, expired or revoked token")
            raise _unauthorized("invalid token")
        user, token = found
        return Principal(user, "token", token.scope)
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        with state.maker.begin() as db:
            found = store.session_of(db, state.secret, session_id)
        if found is None:
            raise _unauthorized("session expired; log in again")
        user, web_session = found
        csrf = request.cookies.get(CSRF_COOKIE)
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER) or ""
            if not store.check_csrf(state.secret, web_session, sent):
                raise HTTPException(403, f"missing or wrong {CSRF_HEADER} header")
        return Principal(user, "session", "write", csrf)
    raise _unauthorized()


Caller = Annotated[Principal, Depends(principal)]


def writer(who: Caller) -> Principal:
    if who.scope != "write":
        raise HTTPException(403, "this token is read-only (scope read)")
    return who


def admin(who: Caller) -> Principal:
    if not who.user.is_admin:
        raise HTTPException(403, "admins only")
    return who


Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]


@dataclass(frozen=True)
class JobAccess:
    """A job the caller may reach, and their role in its tenant."""

    job: Job  # detached: read it, or fetch it again to change it
    role: str


def job_access(request: Request, job_id: str, who: Principal, needed: str = "viewer") -> JobAccess:
    """The job of a tenant `who` belongs to with at least `needed`; 404 when the job does not
    exist or belongs to another tenant; 403 for a member whose role is too low."""
    state = service(request)
    if not JOB_ID.fullmatch(job_id):  # not an id the server could have made (NUL, '/', ...)
        raise HTTPException(404, "job not found")
    with state.maker.begin() as db:
        found = jobstore.visible_job(db, who.user, job_id)
    if found is None:
        raise HTTPException(404, "job not found")
    job, role = found
    if ROLES[role] < ROLES[needed]:
        raise HTTPException(403, f"needs role {needed} in this tenant (you are {role})")
    return JobAccess(job, role)


def viewable_job(job_id: str, request: Request, who: Caller) -> JobAccess:
    return job_access(request, job_id, who, "viewer")


def editable_job(job_id: str, request: Request, who: Writer) -> JobAccess:
    return job_access(request, job_id, who, "editor")


ViewableJob = Annotated[JobAccess, Depends(viewable_job)]
EditableJob = Annotated[JobAccess, Depends(editable_job)]
