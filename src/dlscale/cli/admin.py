"""`dlscale serve admin ...`: the operator's commands over a service's database (there are no
default accounts): users, tenants, memberships and tokens; disable a user, reset a password,
remove a member, change a tenant's weight and quotas. Each is audited."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from dlscale.cli.errors import user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.errors import UserError
from dlscale.tables import output_console
from dlscale.units import binary_bytes, parse_bytes

app = typer.Typer(
    name="admin",
    cls=FlagHelpGroup,
    help="Users, tenants, memberships and tokens of a service's database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = output_console(soft_wrap=True)

DATA_DIR_HELP = (
    "The service's state: database, secret, job folders (default $DLSCALE_HOME/service)."
)
DB_HELP = "Database URL (default SQLite in the data dir), e.g. postgresql+psycopg://user@host/db."
NO_LIMIT = "none"  # a quota given as this means no limit


@app.command("create-user")
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


@app.command("create-tenant")
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
    max_queued_jobs: int | None = typer.Option(
        None, "--max-queued-jobs", help="Jobs waiting at once (default: the server's)."
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
        "max_queued_jobs": max_queued_jobs,
    }
    if storage is not None:
        limits["storage_bytes"] = _size("--storage", storage)
    given = {key: value for key, value in limits.items() if value is not None}
    console.print(f"created {verbs.create_tenant(data_dir, db, name, **given)}")


@app.command("add-member")
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


@app.command("token")
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


@app.command("revoke-token")
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


def _size(flag: str, text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def _quota(flag: str, text: str | None, size: bool = False) -> int | None:
    """A quota from the command line: a count (or a size), or 'none' for no limit."""
    if text is None or text.strip().lower() == NO_LIMIT:
        return None
    if size:
        return _size(flag, text)
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{flag}: give a whole number, or {NO_LIMIT} for no limit") from None
    if value < 0:
        raise UserError(f"{flag}: give a whole number >= 0, or {NO_LIMIT} for no limit")
    return value


@app.command("set-tenant")
@user_errors
def set_tenant(
    name: str = typer.Argument(..., help="The tenant."),
    weight: float | None = typer.Option(None, "--weight", help="Fair-share weight."),
    max_concurrent_jobs: str | None = typer.Option(
        None, "--max-concurrent-jobs", help=f"Jobs running at once, or {NO_LIMIT}."
    ),
    cpu_slots: str | None = typer.Option(None, "--cpu-slots", help=f"CPU slots, or {NO_LIMIT}."),
    gpu_slots: str | None = typer.Option(None, "--gpu-slots", help=f"GPU slots, or {NO_LIMIT}."),
    storage: str | None = typer.Option(None, "--storage", help=f"e.g. 10GiB, or {NO_LIMIT}."),
    max_queued_jobs: str | None = typer.Option(
        None, "--max-queued-jobs", help=f"Jobs waiting at once, or {NO_LIMIT} (the server's)."
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Change a tenant's weight or quotas (from the scheduler's next poll on)."""
    from dlscale.service import admin as verbs

    given = {
        "max_concurrent_jobs": max_concurrent_jobs,
        "cpu_slots": cpu_slots,
        "gpu_slots": gpu_slots,
        "max_queued_jobs": max_queued_jobs,
    }
    changes = {
        key: _quota(f"--{key.replace('_', '-')}", text)
        for key, text in given.items()
        if text is not None
    }
    if storage is not None:
        changes["storage_bytes"] = _quota("--storage", storage, size=True)
    if weight is not None:
        changes["weight"] = weight
    if not changes:
        raise UserError("give at least one setting to change (see --help)")
    console.print(f"changed {verbs.set_tenant(data_dir, db, name, **changes)}")


@app.command("users")
@user_errors
def users(
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Every user: admin or not, disabled or not, and their tenants with their roles."""
    from dlscale.service import admin as verbs

    rows = verbs.users(data_dir, db)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        flags = [name for name in ("is_admin", "disabled") if row[name]]
        shown = f" [{', '.join(f.removeprefix('is_') for f in flags)}]" if flags else ""
        roles = ", ".join(f"{t} ({r})" for t, r in row["tenants"].items()) or "no tenant"
        console.print(escape(f"{row['name']}{shown}: {roles}"))


@app.command("tenants")
@user_errors
def tenants(
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Every tenant: weight, quotas and the storage its jobs use."""
    from dlscale.service import admin as verbs

    rows = verbs.tenants(data_dir, db)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        quota = row["storage_bytes"]
        storage = f"{binary_bytes(row['storage_used'])} of " + (
            binary_bytes(quota) if quota is not None else "no limit"
        )
        limits = ", ".join(
            f"{key.replace('_', ' ')} {row[key]}"
            for key in ("max_concurrent_jobs", "cpu_slots", "gpu_slots", "max_queued_jobs")
            if row[key] is not None
        )
        weight = f"weight {row['weight']:g}"
        console.print(
            escape(f"{row['name']}: {weight}; {limits or 'no limits'}; storage {storage}")
        )


@app.command("disable-user")
@user_errors
def disable_user(
    name: str = typer.Argument(..., help="The user."),
    enable: bool = typer.Option(False, "--enable", help="Turn the account back on."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Turn an account off: its tokens and sessions stop working at once (--enable: back on)."""
    from dlscale.service import admin as verbs

    console.print(verbs.disable_user(data_dir, db, name, not enable))


@app.command("reset-password")
@user_errors
def reset_password(
    name: str = typer.Argument(..., help="The user."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Give a user a new password (printed once, on the last line); their sessions end."""
    from dlscale.service import admin as verbs

    password = verbs.reset_password(data_dir, db, name)
    console.print(f"new password for {name} (shown once, only its hash is stored):")
    print(password)


@app.command("remove-member")
@user_errors
def remove_member(
    tenant: str = typer.Argument(..., help="The tenant."),
    user: str = typer.Argument(..., help="The user."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help=DATA_DIR_HELP),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Take a user out of a tenant (the tenant keeps its jobs)."""
    from dlscale.service import admin as verbs

    console.print(verbs.remove_member(data_dir, db, tenant, user))
