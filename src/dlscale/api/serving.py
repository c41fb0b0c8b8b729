"""The verb that serves a trained model over HTTP: `serve_model` checks the run and the
options here, then starts a Ray Serve deployment of it (local Ray, or a cluster's) and returns
the running server; `plain_app` is the one-process endpoint it is measured against, and
`serve_on_socket` runs that endpoint on a Unix socket (a deployment in the training service,
whose sandbox has no network)."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from dlscale.api.inference import Predictor, load_predictor
from dlscale.errors import UserError, one_line
from dlscale.launch.ray_cluster import connect, import_ray, init_keeping_sigterm, leave
from dlscale.serving.auth import BearerToken, required_token
from dlscale.serving.inputs import MAX_SAMPLES_PER_REQUEST
from dlscale.serving.plain import build_plain_app

SERVE_DEVICES = ("auto", "cpu", "cuda")


@dataclass
class ServingOptions:
    """How a model is served; checked by `check` before anything starts."""

    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    max_replicas: int | None = None  # autoscale from `replicas` up to this many
    max_batch_size: int = 16  # requests batched into one model call
    batch_wait_ms: float = 5.0
    device: str = "auto"  # each replica's; "cuda" gives every replica one GPU of Ray's choice
    precision: str = "fp32"
    address: str | None = None  # a Ray cluster ("auto" or HOST:PORT); None starts a local Ray
    # The bearer token /predict and /metrics require. None: a new one off loopback (written
    # 0600 under $DLSCALE_HOME), no token on loopback.
    token_file: Path | None = None

    def check(self) -> None:
        if not 0 < self.port < 65536:
            raise UserError(f"--port {self.port}: choose a TCP port in 1..65535")
        if self.replicas < 1:
            raise UserError(f"--replicas {self.replicas}: at least 1")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise UserError(
                f"--max-replicas {self.max_replicas} is below --replicas {self.replicas}"
            )
        if not 1 <= self.max_batch_size <= MAX_SAMPLES_PER_REQUEST:
            raise UserError(
                f"--max-batch-size {self.max_batch_size}: choose 1..{MAX_SAMPLES_PER_REQUEST}"
            )
        if not 0 <= self.batch_wait_ms <= 1000:
            raise UserError(f"--batch-wait-ms {self.batch_wait_ms}: choose 0..1000")
        if self.device not in SERVE_DEVICES:
            raise UserError(
                f"--device {self.device}: choose one of {', '.join(SERVE_DEVICES)} (Ray gives "
                "each replica its own GPU, so a GPU index is not chosen here)"
            )
        if self.precision == "int8" and self.device == "cuda":
            raise UserError("--precision int8 runs on the CPU only: use --device cpu")


@dataclass
class ModelServer:
    """A model being served: its address, where its token is (None: no token, loopback only),
    and how to stop it."""

    url: str
    info: dict
    token_file: Path | None
    _stats: object
    _ray: object
    _started_ray: bool

    def wait(self) -> None:
        """Block until Ctrl-C or SIGTERM (raised here as KeyboardInterrupt)."""
        while True:
            time.sleep(3600)

    def stop(self) -> None:
        """Stop the Ray this server started, Serve and the model with it; on a cluster, take
        only the model away."""
        from dlscale.serving.deployment import undeploy

        try:
            # Not serve.shutdown() on our own Ray: Ctrl-C at a terminal (or `timeout`) signals
            # the whole process group, Ray's own processes included, and Serve's graceful
            # shutdown then waits 30 s for a controller that is gone. ray.shutdown() ends
            # every process it started either way.
            if not self._started_ray:
                undeploy(self._stats)
        finally:
            leave(self._ray)


def model_info(run: str | Path, predictor: Predictor, options: ServingOptions) -> dict:
    """What /health says about the model served."""
    return {
        "run": str(run),
        "input_shape": list(predictor.input_shape),
        "input_kind": predictor.input_kind,
        "task": predictor.task,
        "num_classes": predictor.num_classes,
        "precision": options.precision,
    }


def serve_model(run: str | Path, options: ServingOptions | None = None) -> ModelServer:
    """Serve `run` (a run folder or one of its checkpoints) at http://host:port/predict on Ray
    Serve; returns once every replica answers. The run is checked here first (one line if it is
    not a servable run), so a bad one never starts Ray."""
    options = options or ServingOptions()
    options.check()
    run = Path(run).resolve()
    # The driver builds the model once on the CPU: a wrong run, checkpoint or precision is one
    # line here, not a replica's traceback in Ray's logs.
    checked = load_predictor(run, device="cpu", precision=options.precision)
    info = model_info(run, checked, options)
    _check_port_free(options.host, options.port, options.address)
    token, token_file = required_token(options.host, options.port, options.token_file)
    ray = import_ray()
    from dlscale.serving.deployment import Scaling, ServingConfig, deploy

    started_ray = _start_ray(ray, options)
    config = ServingConfig(
        load=functools.partial(load_predictor, str(run), options.device, options.precision),
        info=info,
        max_batch_size=options.max_batch_size,
        batch_wait_s=options.batch_wait_ms / 1000,
        token=token,
    )
    scaling = Scaling(
        replicas=options.replicas,
        max_replicas=options.max_replicas,
        num_gpus=1.0 if _uses_gpu(ray, options.device) else 0.0,
    )
    try:
        stats = deploy(config, scaling, options.host, options.port)
    except Exception as exc:  # Ray says why a deployment failed in a long multi-line error
        leave(ray)
        raise UserError(f"Ray Serve could not start the model: {one_line(exc)}") from None
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it deploys: leave Ray as a failure does
        leave(ray)
        raise
    url = _http_url(options.host, options.port)
    return ModelServer(url, info, token_file, stats, ray, started_ray)


def _http_url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets (RFC 3986 §3.2.2)."""
    return f"http://[{host}]:{port}" if _is_ipv6(host) else f"http://{host}:{port}"


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _start_ray(ray, options: ServingOptions) -> bool:
    """Join the cluster at --address, or start a Ray on this machine; whether one started."""
    if options.address is not None:
        connect(ray, options.address)
        return False
    if ray.is_initialized():
        return False
    init_keeping_sigterm(ray, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return True


def _uses_gpu(ray, device: str) -> bool:
    if device == "cuda":
        return True
    return device == "auto" and ray.cluster_resources().get("GPU", 0) > 0


def _check_port_free(host: str, port: int, address: str | None) -> None:
    """Serve's proxy would fail to bind minutes later, in its own log: say it now. (On a
    cluster the proxy binds on the head, which may not be this machine.)"""
    if address is not None:
        return
    # The family Serve's proxy binds with (an IPv6 address, else IPv4), so the probe fails
    # where the proxy would.
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            where = _http_url(host, port).removeprefix("http://")
            raise UserError(f"cannot listen on {where}: {exc.strerror or exc}") from None


def plain_app(
    run: str | Path, device: str = "cpu", precision: str = "fp32", token: str | None = None
):
    """The same routes over the same model in this one process, with no Ray and no batching
    (each request one model call): what serve-model is measured against. Run it with uvicorn.
    With `token`, /predict and /metrics require it as serve-model's do."""
    return _plain(run, device, precision, token)[0]


def _plain(run: str | Path, device: str, precision: str, token: str | None = None):
    """(the one-process app, what its /health says of the model)."""
    run = Path(run).resolve()
    predictor = load_predictor(run, device=device, precision=precision)
    info = model_info(run, predictor, ServingOptions(precision=precision))
    return build_plain_app(predictor, info, BearerToken.of(token) if token else None), info


def serve_on_socket(
    run: str | Path,
    path: str,
    device: str = "cpu",
    precision: str = "fp32",
    ready: Callable[[dict], None] | None = None,
) -> None:
    """Serve `run` with the one-process engine on the Unix socket `path` until Ctrl-C or
    SIGTERM, which then reach the caller as KeyboardInterrupt (after the requests under way are
    answered). The socket exists only once the model is loaded, and is removed at the end;
    `ready(info)` is called once it accepts connections. Give `path` relative to the current
    folder where the folder is deep: a socket's path is limited to 107 bytes."""
    app, info = _plain(run, device, precision)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if ready is not None and not self.should_exit:
                ready(info)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=5
        )
        # uvicorn takes SIGINT and SIGTERM while it serves, finishes the requests under way, then
        # raises the signal again: the caller's own handler sees it last.
        Server(config).run(sockets=[listener])
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
