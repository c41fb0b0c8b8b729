"""The dashboard: server-rendered pages (Jinja2, autoescaped) built from the JSON API's own views
and access checks, with its script and stylesheet served from /static (public, no data)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import jinja2
from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from dlscale.service import intake, jobstore, store
from dlscale.service.auth import ROLES
from dlscale.service.db.models import Job
from dlscale.service.deps import Principal, admin, job_access, principal, service
from dlscale.service.headers import SecurityHeaders
from dlscale.service.layout import job_dir
from dlscale.service.routes import admin as admin_routes
from dlscale.service.routes import jobs as job_routes
from dlscale.service.routes import queue as queue_routes
from dlscale.service.timesplit import time_split

HERE = Path(__file__).resolve().parent.parent
# What the submit form starts with: the smallest spec that trains something real in seconds.
EXAMPLE_SPEC = """\
name: digits-mlp
model: {name: mlp, kwargs: {hidden: [64]}}
data: {name: digits}
batch_size: 64
epochs: 5
optimizer: {name: sgd, lr: 0.1}
device: cpu
"""

router = APIRouter()


def _when(unix_s: float | None) -> str:
    """UTC text for a unix time (the page's script shows it in the reader's own time zone)."""
    if unix_s is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))


def _size(count_bytes: int | None) -> str:
    if count_bytes is None:
        return "no limit"
    value = float(count_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _figure(value: float) -> str:
    """A measured figure as people read it: 44,790 samples/s, not 4.479e+04."""
    if isinstance(value, int):  # bool included
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value a user or a job wrote is text, never markup
    )
    env.filters.update(when=_when, size=_size, figure=_figure)
    return env


templates = Jinja2Templates(env=_environment())


def _render(
    request: Request,
    name: str,
    who: Principal | None = None,
    status_code: int = 200,
    headers: dict | None = None,
    **context,
) -> HTMLResponse:
    user = None if who is None else {"name": who.user.name, "is_admin": who.user.is_admin}
    return templates.TemplateResponse(
        request, name, {"me": user, **context}, status_code=status_code, headers=headers
    )


def _page(request: Request, build: Callable[[Principal], HTMLResponse]) -> HTMLResponse:
    """`build(caller)` for a signed-in caller; the API's refusals as pages with the same status:
    401 (and 429) the login form in place, so the address stays the one to come back to."""
    who = None
    try:
        who = principal(request)
        return build(who)
    except HTTPException as exc:
        if exc.status_code in (401, 429):
            return _render(
                request, "login.html", None, exc.status_code, exc.headers, message=exc.detail
            )
        return _render(
            request, "error.html", who, exc.status_code, status=exc.status_code, message=exc.detail
        )


def _can_edit(who: Principal, role: str | None) -> bool:
    return role is not None and ROLES[role] >= ROLES["editor"] and who.scope == "write"


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    """The sign-in form (open): the page's script posts it to /api/login."""
    return _render(request, "login.html", message=None)


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request) -> HTMLResponse:
    """The caller's tenants' jobs, newest first, and the form to submit one."""

    def build(who: Principal) -> HTMLResponse:
        with service(request).maker.begin() as db:
            roles = store.roles(db, who.user)
        submit_to = sorted(t for t, role in roles.items() if _can_edit(who, role))
        listed = job_routes.list_jobs(request, Response(), who=who)
        return _render(
            request,
            "jobs.html",
            who,
            jobs=listed,
            tenants=submit_to,
            kinds=intake.KINDS,
            example=EXAMPLE_SPEC,
        )

    return _page(request, build)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request) -> HTMLResponse:
    """One job: state, spec, reproduction record, live log and chart, time split, artifacts."""

    def build(who: Principal) -> HTMLResponse:
        access = job_access(request, job_id, who)
        state = service(request)
        with state.maker.begin() as db:
            row = db.get(Job, access.job.id)  # fresh: never a detached copy written back
            view = job_routes.job_view(db, row, access.role)
            files = [
                {"id": a.id, "name": a.name, "size": a.size, "sha256": a.sha256}
                for a in jobstore.artifacts_of(db, row)
            ]
        return _render(
            request,
            "job.html",
            who,
            job=view,
            artifacts=files,
            split=time_split(job_dir(state.config.data_dir, job_id)),
            ended=view["state"] in jobstore.ENDED,
            can_edit=_can_edit(who, access.role),
        )

    return _page(request, build)


@router.get("/queue", response_class=HTMLResponse)
def queue_page(request: Request) -> HTMLResponse:
    """Per tenant: quotas in use, decayed usage, and why each waiting job waits."""

    def build(who: Principal) -> HTMLResponse:
        state = service(request)
        with state.maker.begin() as db:
            view = queue_routes.queue_view(db, who, state.config.half_life_s, state.loop.machine)
        return _render(request, "queue.html", who, queue=view)

    return _page(request, build)


@router.get("/admin", response_class=HTMLResponse)
def admin_page(request: Request) -> HTMLResponse:
    """For admins: users, tenants, tokens (prefix and dates, never the secret), audit log."""

    def build(who: Principal) -> HTMLResponse:
        admin(who)
        return _render(
            request,
            "admin.html",
            who,
            users=admin_routes.users(request, who),
            tenants=admin_routes.tenants(request, who),
            tokens=admin_routes.tokens(request, who),
            audit=admin_routes.audit(request, who, 200),
        )

    return _page(request, build)


def install(app: FastAPI) -> None:
    """Add the pages, /static and the security headers to `app`."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(SecurityHeaders)
