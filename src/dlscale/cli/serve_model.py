"""`dlscale serve-model RUN`: a trained run's model as an HTTP prediction endpoint on Ray Serve
(POST /predict, GET /health, GET /metrics) until Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import typer

from dlscale.api.serving import ServingOptions, serve_model
from dlscale.cli.errors import stderr, user_errors
from dlscale.signals import stop_on_sigterm


@user_errors
def serve_model_command(
    run: Path = typer.Argument(..., help="Run folder (its newest checkpoint) or a checkpoint."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the HTTP proxy listens on."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    replicas: int = typer.Option(1, "--replicas", help="Model replicas (Ray actors)."),
    max_replicas: int | None = typer.Option(
        None, "--max-replicas", help="Autoscale from --replicas up to this many by load."
    ),
    max_batch_size: int = typer.Option(
        16, "--max-batch-size", help="Requests batched into one model call."
    ),
    batch_wait_ms: float = typer.Option(
        5.0, "--batch-wait-ms", help="How long a request waits for others to batch with."
    ),
    device: str = typer.Option("auto", "--device", help="Each replica's: auto, cpu or cuda."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 or int8 (CPU)."),
    address: str | None = typer.Option(
        None, "--address", help="A Ray cluster (auto, or the head's HOST:PORT); default: local."
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="The bearer token /predict and /metrics require. Default: none on a loopback "
        "--host; otherwise a new one, written 0600 under $DLSCALE_HOME.",
    ),
) -> None:
    """Serve a trained model over HTTP on Ray Serve, with request batching, until Ctrl-C."""
    options = ServingOptions(
        host=host,
        port=port,
        replicas=replicas,
        max_replicas=max_replicas,
        max_batch_size=max_batch_size,
        batch_wait_ms=batch_wait_ms,
        device=device,
        precision=precision,
        address=address,
        token_file=token_file,
    )
    # SIGTERM takes Ctrl-C's path from the start (serve_model keeps it over ray.init): a stop
    # while the model deploys is the same stop as later. Its /health can answer before
    # serve_model returns, and a SIGTERM sent then ended the command with train's "continue
    # later with --resume" and 143 (a heavy test, after Ray's own handler had been fixed).
    stop_on_sigterm()
    try:
        server = serve_model(run, options)
    except KeyboardInterrupt:  # serve_model has left Ray
        stderr.print("stopped while Ray Serve started the model")
        return
    try:
        shape = "×".join(map(str, server.info["input_shape"]))
        print(
            f"serving {run} ({server.info['input_kind']} {shape}) at {server.url}: "
            f"POST /predict, GET /health, GET /metrics; Ctrl-C stops",
            flush=True,
        )
        if server.token_file is not None:
            # The path, never the token: the terminal's scrollback and logs are not secret.
            print(
                f"token required: send 'Authorization: Bearer <the token in {server.token_file}>'",
                flush=True,
            )
        server.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the way this command is meant to end
        stderr.print("stopping: Ray Serve shuts down")
    finally:
        server.stop()
