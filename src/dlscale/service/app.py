"""Assembles the service: database (migrated on start), secret, executor, scheduler loop,
limits and routes, as one FastAPI app; `serve` runs it under uvicorn."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from dlscale import __version__
from dlscale.errors import UserError
from dlscale.service import cgroups
from dlscale.service.auth import load_secret
from dlscale.service.config import ServiceConfig, check_bind
from dlscale.service.db import make_engine, migrate, sessions
from dlscale.service.executor import Executor
from dlscale.service.limits import BodyLimit, FailureLimiter
from dlscale.service.loop import JobLoop
from dlscale.service.state import ServiceState

UNSAFE = (
    "dlscale serve: --unsafe-single-user: jobs run as this server's user, unsandboxed and "
    "unlimited; only for one person serving their own jobs"
)


def make_executor(config: ServiceConfig) -> Executor:
    """Jobs as sandboxed processes on this machine (the default), each in dlscale's container
    image, or (--unsafe-single-user) plain processes. A server that cannot sandbox its jobs
    refuses to start, saying why."""
    if config.executor == "container":
        from dlscale.service.container import IMAGE, ContainerExecutor

        return ContainerExecutor(config, config.image or IMAGE)
    common = {
        "validations_at_once": config.validations_at_once,
        "validation_wait_s": config.validate_timeout_s,
        "uid_of": config.job_uid,
    }
    if config.unsafe_single_user:
        print(UNSAFE, flush=True)
        warm = config.limits(1, 0, "0", None)
        return Executor(config.sandboxes_dir, None, sandboxed=False, warm=warm, **common)
    try:
        hierarchy = cgroups.detect()
    except cgroups.CgroupsUnavailable as exc:
        raise UserError(_cannot_sandbox(f"no kernel limits for jobs: {exc}")) from None
    problem = Executor(config.sandboxes_dir, hierarchy, **common).check(config.job_uid("0"))
    if problem is not None:
        raise UserError(_cannot_sandbox(problem))
    # Validators wait warm from here on: each a sandbox of one slot until a job is given it.
    return Executor(config.sandboxes_dir, hierarchy, warm=config.limits(1, 0, "0", None), **common)


def _cannot_sandbox(reason: str) -> str:
    return (
        f"dlscale serve: jobs cannot be sandboxed on this machine ({reason}); install "
        "bubblewrap (make system-deps) and run the server as root or in a delegated cgroup; "
        "only for one person serving their own jobs: --unsafe-single-user"
    )


def _private(config: ServiceConfig) -> None:
    """The data directory and what the server keeps in it, readable by the server alone."""
    for folder in (config.data_dir, config.jobs_dir, config.sandboxes_dir):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    for name in ("service.db", "service.db-wal", "service.db-shm"):
        if (config.data_dir / name).is_file():
            os.chmod(config.data_dir / name, 0o600)


def build_state(config: ServiceConfig, executor: Executor | None = None) -> ServiceState:
    """Everything one server holds; `executor` replaces the configured one (tests)."""
    _private(config)
    engine = make_engine(config.url())
    migrate(engine)
    _private(config)  # the database file, made by the migration
    maker = sessions(engine)
    executor = executor or make_executor(config)
    return ServiceState(
        config=config,
        engine=engine,
        maker=maker,
        secret=load_secret(config.data_dir),
        executor=executor,
        loop=JobLoop(config, maker, executor),
        limiter=FailureLimiter(config.failed_auth_limit, config.failed_auth_window_s),
        address_limiter=FailureLimiter(config.address_limit, config.failed_auth_window_s),
    )


def create_app(
    config: ServiceConfig, run_scheduler: bool = True, executor: Executor | None = None
) -> FastAPI:
    """The app over `config`'s data dir; `run_scheduler=False` leaves ticking to the caller
    (tests step the scheduler themselves, and may hand it an `executor` of their own)."""
    state = build_state(config, executor)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if run_scheduler:
            state.loop.start()
        try:
            yield
        finally:
            state.loop.stop()
            state.executor.close()
            state.engine.dispose()

    # The generated docs pages load scripts from a CDN (no external requests here) and the
    # schema route would be open to all: both off; /api/openapi.json serves it signed in.
    app = FastAPI(
        title="dlscale",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.service = state
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _one_line(request, exc: RequestValidationError):
        """A malformed request reads like the CLI's errors: one line naming the field."""
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg")
        return JSONResponse({"detail": message or "invalid request"}, status_code=422)

    from dlscale.service.routes import account, admin, jobs, models, outputs, pages, queue, submit

    for module in (account, jobs, submit, models, outputs, queue, admin):
        app.include_router(module.router)
    pages.install(app)
    return app


def serve(config: ServiceConfig, host: str, port: int, allow_remote: bool = False) -> None:
    """Run the service in this process until Ctrl-C (uvicorn, one worker: the scheduler loop
    lives in this process and is the database's only writer of job states)."""
    import uvicorn

    check_bind(host, allow_remote)
    os.umask(0o077)  # whatever this server writes is its own: database, secret, job folders
    app = create_app(config)
    print(f"dlscale serve: http://{host}:{port}  (data {config.data_dir})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
