"""`dlscale serve [...]` runs the training service (its operators' commands, `dlscale serve admin
...`, are in cli/admin.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import typer

from dlscale.cli.admin import DATA_DIR_HELP, DB_HELP
from dlscale.cli.admin import app as admin_app
from dlscale.cli.errors import user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.errors import UserError
from dlscale.units import parse_bytes

app = typer.Typer(
    name="serve",
    cls=FlagHelpGroup,
    help="Run dlscale as a multi-tenant training service (HTTP API and dashboard).",
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(admin_app, name="admin")


def machine_cpu_slots() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_gpu_slots() -> int:
    """GPUs `nvidia-smi -L` lists, narrowed by CUDA_VISIBLE_DEVICES; no torch import (seconds
    of start-up for a number), and 0 on machines without the NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [item for item in visible.split(",") if item.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
        valid = 0
        for item in entries:
            if item.strip().startswith("-"):
                break
            valid += 1
        found = min(found, valid)
    return found


@app.callback(invoke_without_command=True)
@user_errors
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", help="TCP port."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    cpu_slots: int | None = typer.Option(
        None, "--cpu-slots", help="CPU job slots (default: this machine's cores)."
    ),
    gpu_slots: int | None = typer.Option(
        None, "--gpu-slots", help="GPU job slots (default: the visible GPUs)."
    ),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Listen beyond loopback (put TLS in front of it)."
    ),
    executor: str = typer.Option(
        "process",
        "--executor",
        help="process: jobs as processes here; container: each in "
        "dlscale's image (make image), no network, limited to its slots.",
    ),
    image: str | None = typer.Option(
        None, "--image", help="The container executor's image (default dlscale:<version>)."
    ),
    memory_per_slot: str | None = typer.Option(
        None,
        "--memory-per-slot",
        help="Memory a job gets per CPU slot, e.g. 4GiB (default: this machine's / the slots).",
    ),
    max_queued_jobs: int = typer.Option(
        100, "--max-queued-jobs", help="Jobs a tenant may have waiting at once (its own wins)."
    ),
    validators: int = typer.Option(
        2, "--validators", help="Submissions checked at once (each in a sandbox of its own)."
    ),
    unsafe_single_user: bool = typer.Option(
        False,
        "--unsafe-single-user",
        help="No sandbox: jobs run as this user, unlimited. Only for one person's own jobs.",
    ),
) -> None:
    """Serve the API and dashboard until Ctrl-C; jobs run as processes on this machine (or in
    containers, with --executor container)."""
    if ctx.invoked_subcommand is not None:
        return
    from dlscale.service.app import serve as run_service
    from dlscale.service.config import ServiceConfig, default_data_dir

    if not 0 < port < 65536:
        raise UserError(f"--port {port}: must be between 1 and 65535")
    if not 1 <= validators <= 64:
        raise UserError(f"--validators {validators}: must be between 1 and 64")
    config = ServiceConfig(
        data_dir=data_dir if data_dir is not None else default_data_dir(),
        db_url=db,
        cpu_slots=machine_cpu_slots() if cpu_slots is None else cpu_slots,
        gpu_slots=machine_gpu_slots() if gpu_slots is None else gpu_slots,
        executor=executor,
        image=image,
        memory_per_slot_bytes=None if memory_per_slot is None else _bytes(memory_per_slot),
        max_queued_jobs=max_queued_jobs,
        validations_at_once=validators,
        unsafe_single_user=unsafe_single_user,
    )
    run_service(config, host, port, allow_remote)


def _bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UserError(f"--memory-per-slot: {exc}") from None
