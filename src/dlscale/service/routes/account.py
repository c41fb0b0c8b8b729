"""Health, login and logout, who am I, and the API's own description."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, Field

from dlscale import __version__
from dlscale.service import store
from dlscale.service.auth import verify_password
from dlscale.service.db.models import User
from dlscale.service.deps import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Caller,
    check_not_limited,
    client_address,
    record_failure,
    service,
)

router = APIRouter()


class Login(BaseModel):
    name: str = Field(max_length=200)
    password: str = Field(max_length=1000)


@router.get("/api/health")
def health() -> dict:
    """The one route open to all: is the server up (no detail about it)."""
    return {"status": "ok"}


@router.post("/api/login")
def login(body: Login, request: Request, response: Response) -> dict:
    """Password login for the dashboard: a session cookie (HttpOnly, SameSite=Strict) and a
    CSRF value the pages send back in the X-CSRF-Token header on every change."""
    check_not_limited(request, body.name[:100].replace("\x00", "?"))
    state = service(request)
    user = None
    if "\x00" not in body.name + body.password:  # no such name; and PostgreSQL refuses NUL
        with state.maker.begin() as db:
            found, hashed = store.password_of(db, body.name)
        if verify_password(hashed, body.password) and found is not None:
            with state.maker.begin() as db:
                user = db.get(User, found.id)  # fresh, never a detached copy written back
                ttl_s = state.config.session_ttl_s
                session_id, csrf = store.open_session(db, state.secret, user, ttl_s)
                store.audit(db, "login", "ok", actor=user.name, ip=client_address(request))
    if user is None:
        actor = body.name[:100].replace("\x00", "?")
        record_failure(request, "login", actor, "wrong name or password")
        raise HTTPException(401, "wrong name or password", headers={"WWW-Authenticate": "Bearer"})
    secure = state.config.secure_cookies
    max_age = int(state.config.session_ttl_s)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    response.set_cookie(
        CSRF_COOKIE,
        csrf,
        max_age=max_age,
        httponly=False,
        samesite="strict",
        secure=secure,
        path="/",
    )
    return {"user": user.name, "is_admin": user.is_admin, "csrf": csrf}


@router.post("/api/logout")
def logout(request: Request, response: Response, who: Caller) -> dict:
    state = service(request)
    session_id = request.cookies.get(SESSION_COOKIE)
    if who.via == "session" and session_id:
        with state.maker.begin() as db:
            store.close_session(db, state.secret, session_id)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return {"logged_out": True}


@router.get("/api/me")
def me(request: Request, who: Caller) -> dict:
    with service(request).maker.begin() as db:
        roles = store.roles(db, who.user)
    return {
        "user": who.user.name,
        "is_admin": who.user.is_admin,
        "tenants": roles,
        "via": who.via,
        "scope": who.scope,
        "version": __version__,
    }


@router.get("/api/openapi.json")
def openapi(request: Request, who: Caller) -> dict:
    """The routes and their schemas (for clients), to signed-in callers only."""
    return request.app.openapi()
