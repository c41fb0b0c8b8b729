"""Assembles the service: database (migrated on start), secret, executor, scheduler loop,
limits and routes, as one FastAPI app; `serve` runs it under uvicorn."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from dlscale import __version__
from dlscale.service.auth import load_secret
from dlscale.service.config import ServiceConfig, check_bind
from dlscale.service.db import make_engine, migrate, sessions
from dlscale.service.executor import Executor
from dlscale.service.limits import BodyLimit, FailureLimiter
from dlscale.service.loop import JobLoop


@dataclass
class ServiceState:
    config: ServiceConfig
    engine: object
    maker: object
    secret: bytes
    executor: Executor
    loop: JobLoop
    limiter: FailureLimiter


def make_executor(config: ServiceConfig) -> Executor:
    """Jobs as processes on this machine (the default), or each in dlscale's container image."""
    if config.executor == "container":
        from dlscale.service.container import IMAGE, ContainerExecutor

        return ContainerExecutor(config.image or IMAGE, config.cpu_slots or None)
    return Executor()


def build_state(config: ServiceConfig) -> ServiceState:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    config.jobs_dir.mkdir(exist_ok=True)
    engine = make_engine(config.url())
    migrate(engine)
    maker = sessions(engine)
    executor = make_executor(config)
    return ServiceState(
        config=config,
        engine=engine,
        maker=maker,
        secret=load_secret(config.data_dir),
        executor=executor,
        loop=JobLoop(config, maker, executor),
        limiter=FailureLimiter(config.failed_auth_limit, config.failed_auth_window_s),
    )


def create_app(config: ServiceConfig, run_scheduler: bool = True) -> FastAPI:
    """The app over `config`'s data dir; `run_scheduler=False` leaves ticking to the caller
    (tests step the scheduler themselves)."""
    state = build_state(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if run_scheduler:
            state.loop.start()
        try:
            yield
        finally:
            state.loop.stop()
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

    from dlscale.service.routes import account, jobs, outputs, pages, queue

    for module in (account, jobs, outputs, queue):
        app.include_router(module.router)
    pages.install(app)
    return app


def serve(config: ServiceConfig, host: str, port: int, allow_remote: bool = False) -> None:
    """Run the service in this process until Ctrl-C (uvicorn, one worker: the scheduler loop
    lives in this process and is the database's only writer of job states)."""
    import uvicorn

    check_bind(host, allow_remote)
    app = create_app(config)
    print(f"dlscale serve: http://{host}:{port}  (data {config.data_dir})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
