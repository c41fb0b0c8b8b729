"""`dlscale serve [...]` runs the training service; `dlscale serve admin ...` makes its users,
tenants, memberships and tokens (there are no default accounts)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import typer
from rich.console import Console

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
admin_app = typer.Typer(
    name="admin",
    cls=FlagHelpGroup,
    help="Create users, tenants, memberships and tokens in a service's database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(admin_app, name="admin")
console = Console(highlight=False, soft_wrap=True)

DATA_DIR_HELP = (
    "The service's state: database, secret, job folders (default $DLSCALE_HOME/service)."
)
DB_HELP = "Database URL (default SQLite in the data dir), e.g. postgresql+psycopg://user@host/db."


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
) -> None:
    """Serve the API and dashboard until Ctrl-C; jobs run as processes on this machine (or in
    containers, with --executor container)."""
    if ctx.invoked_subcommand is not None:
        return
    from dlscale.service.app import serve as run_service
    from dlscale.service.config import ServiceConfig, default_data_dir

    if not 0 < port < 65536:
        raise UserError(f"--port {port}: must be between 1 and 65535")
    config = ServiceConfig(
        data_dir=data_dir if data_dir is not None else default_data_dir(),
        db_url=db,
        cpu_slots=machine_cpu_slots() if cpu_slots is None else cpu_slots,
        gpu_slots=machine_gpu_slots() if gpu_slots is None else gpu_slots,
        executor=executor,
        image=image,
    )
    run_service(config, host, port, allow_remote)


@admin_app.command("create-user")
@user_errors
def create_user(
    name: str = typer.Argument(..., help="The new user's name."),
    admin: bool = typer.Option(False, "--admin", help="A global admin (sees every tenant)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Create a user and print their password (shown once; only its hash is stored)."""
    from dlscale.service import admin as verbs

    password = verbs.create_user(data_dir, db, name, admin)
    kind = "admin" if admin else "user"
    console.print(f"created {kind} {name}; password (shown once, only its hash is stored):")
    print(password)


@admin_app.command("create-tenant")
@user_errors
def create_tenant(
    name: str = typer.Argument(..., help="The new tenant's name."),
    weight: float | None = typer.Option(None, "--weight", help="Fair-share weight (default 1)."),
    max_concurrent_jobs: int | None = typer.Option(
        None, "--max-concurrent-jobs", help="Jobs running at once (default: no limit)."
    ),
    cpu_slots: int | None = typer.Option(
        None, "--cpu-slots", help="CPU slots in use at once (default: no limit)."
    ),
    gpu_slots: int | None = typer.Option(
        None, "--gpu-slots", help="GPU slots in use at once (default: no limit)."
    ),
    storage: str | None = typer.Option(
        None, "--storage", help="Storage quota for its jobs' folders, e.g. 10GiB (default: none)."
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Create a tenant (a team sharing a quota); unset limits mean no limit."""
    from dlscale.service import admin as verbs

    limits = {
        "weight": weight,
        "max_concurrent_jobs": max_concurrent_jobs,
        "cpu_slots": cpu_slots,
        "gpu_slots": gpu_slots,
    }
    if storage is not None:
        try:
            limits["storage_bytes"] = parse_bytes(storage)
        except ValueError as exc:
            raise UserError(f"--storage: {exc}") from None
    given = {key: value for key, value in limits.items() if value is not None}
    console.print(f"created {verbs.create_tenant(data_dir, db, name, **given)}")


@admin_app.command("add-member")
@user_errors
def add_member(
    tenant: str = typer.Argument(..., help="The tenant."),
    user: str = typer.Argument(..., help="The user."),
    role: str = typer.Option(..., "--role", help="viewer | editor | owner."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Make a user a member of a tenant with a role (or change their role)."""
    from dlscale.service import admin as verbs

    console.print(verbs.add_member(data_dir, db, tenant, user, role))


@admin_app.command("token")
@user_errors
def token(
    user: str = typer.Argument(..., help="Whose token."),
    scope: str = typer.Option("write", "--scope", help="read | write."),
    expires: str = typer.Option(
        "30d", "--expires", help="Lifetime, e.g. 12h, 30d; never for a token that never expires."
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Issue an API token for `dlscale remote` (DLSCALE_TOKEN); printed once, on the last line."""
    from dlscale.service import admin as verbs

    lifetime = None if expires.strip().lower() == "never" else expires
    text = verbs.issue_token(data_dir, db, user, scope, lifetime)
    until = "never expires" if lifetime is None else f"expires in {lifetime}"
    prefix = text.split("_")[1]  # what `revoke-token` and the admin pages name it by
    console.print(
        f"token {prefix} for {user} (scope {scope}, {until}); shown once, only its hash is kept:"
    )
    print(text)


@admin_app.command("revoke-token")
@user_errors
def revoke_token(
    prefix: str = typer.Argument(
        ..., help="The token's prefix (the 8 hex digits after dls_), or the whole token."
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Revoke a token at once (a lost laptop, a leaked CI secret)."""
    from dlscale.service import admin as verbs

    if prefix.startswith("dls_"):  # the whole token, pasted: its prefix names it
        prefix = prefix.split("_")[1]
    console.print(verbs.revoke_token(data_dir, db, prefix))
