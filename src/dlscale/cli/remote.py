"""`dlscale remote ...`: submit jobs to a dlscale server and follow them (list, status, logs,
cancel, rerun, delete, artifacts), deploy a trained job's model and ask it for predictions,
signed in with $DLSCALE_TOKEN."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path, PurePosixPath

import typer
from rich.console import Console
from rich.markup import escape

from dlscale.cli.errors import user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.cli.pipes import stdout_closed
from dlscale.cli.remote_client import DEFAULT_SERVER, Remote, token_from_environment
from dlscale.errors import UserError
from dlscale.tables import output_console
from dlscale.units import binary_bytes, duration

app = typer.Typer(
    name="remote",
    cls=FlagHelpGroup,
    help="Use a dlscale server: submit jobs, follow their logs, fetch their artifacts "
    "(token in $DLSCALE_TOKEN).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = output_console(soft_wrap=True)
ENDED = ("succeeded", "failed", "cancelled")
SUBMIT_TIMEOUT_S = 300.0  # a submit waits for its spec's check (in a sandbox, on the server)
PAGE = 100


def server_option():
    return typer.Option(
        DEFAULT_SERVER, "--server", envvar="DLSCALE_SERVER", help="The server's URL."
    )


@contextmanager
def connect(server: str) -> Iterator[Remote]:
    remote = Remote(server, token_from_environment())
    try:
        yield remote
    finally:
        remote.close()


def _job_path(job: str, *rest: str) -> str:
    # A job id is opaque hex; anything else would change the path it is pasted into.
    if not job or not job.isalnum():
        raise UserError(f"job {job} not found", 1)
    return "/".join((f"/api/jobs/{job}", *rest)) if rest else f"/api/jobs/{job}"


def _open(path: Path, what: str):
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{what} {path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path}: is a folder (send folders as --archive ZIP)") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: {exc.strerror}") from None


@app.command()
@user_errors
def submit(
    spec: Path = typer.Argument(..., help="Job spec (YAML); data files it names as inputs/NAME."),
    kind: str = typer.Option("train", "--kind", help="train | sweep | profile."),
    tenant: str | None = typer.Option(
        None, "--tenant", help="Whose quota (needed when you may submit to several)."
    ),
    parallel: int | None = typer.Option(None, "--parallel", help="sweep: trials at a time."),
    files: list[Path] = typer.Option(
        [], "--file", help="A data file, uploaded as inputs/NAME (repeat for several)."
    ),
    archive: Path | None = typer.Option(
        None, "--archive", help="A zip of data, unpacked into inputs/."
    ),
    server: str = server_option(),
) -> None:
    """Queue a spec on the server; the new job's id is printed alone on the last line."""
    fields = {"kind": kind}
    if tenant is not None:
        fields["tenant"] = tenant
    if parallel is not None:
        fields["parallel"] = str(parallel)
    with connect(server) as remote, ExitStack() as opened:
        uploads = [("spec", (spec.name, opened.enter_context(_open(spec, "spec"))))]
        for path in files:
            uploads.append(("files", (path.name, opened.enter_context(_open(path, "--file")))))
        if archive is not None:
            handle = opened.enter_context(_open(archive, "--archive"))
            uploads.append(("archive", (archive.name, handle)))
        job = remote.json("POST", "/api/jobs", files=uploads, data=fields, timeout=SUBMIT_TIMEOUT_S)
    console.print(
        f"queued {kind} job (seed {job['seed']}, {job['cpu_slots']} CPU slot(s), "
        f"{job['gpu_slots']} GPU slot(s)); follow it with: dlscale remote logs -f {job['id']}"
    )
    print(job["id"])


def when(unix_s: float | None) -> str:
    """A server's unix time as local time people read (2026-11-26 22:35:12)."""
    if unix_s is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


def figure(key: str, value: float) -> str:
    """A result's figure in its unit: times as times, bytes as bytes, rates with commas."""
    if key.endswith("_unix"):
        return when(value)
    if key.endswith("_bytes"):
        return binary_bytes(value)
    if key.endswith("_per_s"):
        return f"{value:,.0f}/s"
    if key.endswith("_s"):
        return duration(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def _summary(job: dict) -> list[str]:
    lines = [f"job {job['id']} ({job['kind']}, tenant {job['tenant']}): {job['state']}"]
    if job["state"] == "queued" and job.get("reason"):
        lines.append(f"waiting: {job['reason']}")
    if job.get("cancel_requested") and job["state"] not in ENDED:
        lines.append("cancel requested: it stops at its next step")
    if job.get("message"):
        lines.append(f"message: {job['message']}")
    times = [("submitted", "submitted_at"), ("started", "started_at"), ("ended", "ended_at")]
    lines.append("; ".join(f"{word} {when(job[key])}" for word, key in times if job.get(key)))
    result = job.get("result") or {}
    metrics = result.get("metrics") or {}
    shown = {
        k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    if shown:
        lines.append("final: " + ", ".join(f"{k} {figure(k, v)}" for k, v in sorted(shown.items())))
    if result.get("weights_sha256"):
        lines.append(f"weights sha256: {result['weights_sha256']}")
    if job.get("rerun_of"):
        lines.append(f"rerun of job {job['rerun_of']}")
    return lines


@app.command("list")
@user_errors
def list_jobs(
    tenant: str | None = typer.Option(None, "--tenant", help="One tenant's jobs only."),
    limit: int = typer.Option(PAGE, "--limit", help="At most this many (newest first)."),
    show_all: bool = typer.Option(False, "--all", help="Every job, page after page."),
    as_json: bool = typer.Option(False, "--json", help="Print them as JSON."),
    server: str = server_option(),
) -> None:
    """Your tenants' jobs, newest first: id, state, tenant, kind, submitted, reason or message."""
    if limit < 1:
        raise UserError("--limit: give a number >= 1")
    rows: list[dict] = []
    more = None
    with connect(server) as remote:
        params = {"limit": min(limit, 1000), **({"tenant": tenant} if tenant else {})}
        while True:
            answer = remote.call("GET", "/api/jobs", params=params)
            rows += answer.json()
            more = answer.headers.get("x-next-before")
            if more is None or (not show_all and len(rows) >= limit):
                break
            params["before"] = more
    rows = rows if show_all else rows[:limit]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print("no jobs yet")
        return
    print(
        f"{'id':<16}  {'state':<9}  {'tenant':<12}  {'kind':<7}  {'submitted':<19}  reason/message"
    )
    for row in rows:
        said = row.get("reason") or row.get("message") or ""
        submitted = when(row.get("submitted_at"))
        print(
            f"{row['id']:<16}  {row['state']:<9}  {row['tenant']:<12}  {row['kind']:<7}  "
            f"{submitted:<19}  {said}"
        )
    if more is not None and not show_all:
        console.print(f"[dim]older jobs: --all, or --limit {limit + PAGE}[/]")


@app.command()
@user_errors
def status(
    job: str = typer.Argument(..., help="Job id."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole job as JSON."),
    server: str = server_option(),
) -> None:
    """A job's state, and why it waits or how it ended."""
    with connect(server) as remote:
        found = remote.json("GET", _job_path(job), job)
    if as_json:
        print(json.dumps(found, indent=2))
        return
    for line in _summary(found):
        console.print(escape(line))


@app.command()
@user_errors
def logs(
    job: str = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing until the job ends (resumes if cut off)."
    ),
    server: str = server_option(),
) -> None:
    """Print a job's log; with -f, follow it live until the job ends."""
    with connect(server) as remote:
        try:
            for event in remote.events(_job_path(job, "logs"), job, follow):
                if event.kind == "log":
                    print(event.data, flush=True)
                    if stdout_closed():  # `| head`: following on would print to no one
                        return
                elif event.kind == "end" and follow:
                    console.print(f"[dim]job {escape(job)} {escape(event.data)}[/]")
        except KeyboardInterrupt as stop:
            # Ctrl-C ends the watching, not the job (the CLI's usual hint is about --resume).
            hint = f"stopped following; job {job} goes on (dlscale remote cancel {job} stops it)"
            Console(stderr=True, highlight=False).print(f"[yellow]{escape(hint)}[/]")
            raise typer.Exit(getattr(stop, "exit_code", 130)) from None  # SIGTERM: 143


@app.command()
@user_errors
def cancel(
    job: str = typer.Argument(..., help="Job id."),
    server: str = server_option(),
) -> None:
    """Cancel a job: a queued one at once, a running one at its next step (checkpoint kept)."""
    with connect(server) as remote:
        answer = remote.json("POST", _job_path(job, "cancel"), job)
    if answer["state"] == "cancelled" and answer["changed"]:
        console.print(f"job {job} cancelled")
    elif answer["cancel_requested"] and answer["state"] not in ENDED:
        console.print(f"job {job} is {answer['state']}: cancel requested, it stops shortly")
    else:
        console.print(f"job {job} had already ended: {answer['state']}")


@app.command()
@user_errors
def delete(
    job: str = typer.Argument(..., help="Job id."),
    server: str = server_option(),
) -> None:
    """Delete a job and its files (a running one is cancelled first), freeing its storage."""
    with connect(server) as remote:
        answer = remote.json("DELETE", _job_path(job), job)
    if answer["deleted"]:
        console.print(f"job {job} deleted")
    else:
        console.print(f"job {job} is running: cancelled, and deleted once it has stopped")


@app.command()
@user_errors
def rerun(
    job: str = typer.Argument(..., help="Job id."),
    server: str = server_option(),
) -> None:
    """Run a job again with the same spec, seed and inputs; prints the new id last."""
    with connect(server) as remote:
        answer = remote.json("POST", _job_path(job, "rerun"), job)
    console.print(f"queued a rerun of job {job} (seed {answer['seed']})")
    print(answer["id"])


@app.command()
@user_errors
def deploy(
    job: str = typer.Argument(..., help="A succeeded train job's id."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda (holds a GPU slot)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 | bf16 | int8 (cpu)."),
    server: str = server_option(),
) -> None:
    """Serve a job's model as a new job until it is cancelled; prints the new id last (ask it
    with `dlscale remote predict ID INPUTS.json`)."""
    fields = {"device": device, "precision": precision}
    with connect(server) as remote:
        answer = remote.json(
            "POST", _job_path(job, "deploy"), job, data=fields, timeout=SUBMIT_TIMEOUT_S
        )
    console.print(
        f"queued a deployment of job {job}'s model on {device} at {precision}; it serves once "
        f"it runs, until: dlscale remote cancel {answer['id']}"
    )
    print(answer["id"])


@app.command()
@user_errors
def predict(
    job: str = typer.Argument(..., help="A deployment's id (from `dlscale remote deploy`)."),
    inputs: Path = typer.Argument(
        ..., help='A JSON file {"inputs": [sample, ...]} (docs/serving.md); - reads stdin.'
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the model's answer as JSON."),
    server: str = server_option(),
) -> None:
    """Ask a deployed model for predictions: one line per sample (class, confidence)."""
    if str(inputs) == "-":
        body = typer.get_binary_stream("stdin").read()
    else:
        with _open(inputs, "inputs") as handle:
            body = handle.read()
    with connect(server) as remote:
        answer = remote.model(_job_path(job, "predict"), job, body)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    print(f"{'sample':>6}  {'class':>5}  confidence")
    for index, row in enumerate(answer["predictions"]):
        confidence = "-" if row.get("confidence") is None else f"{row['confidence']:.4f}"
        cls = "-" if row.get("class") is None else row["class"]
        why = f"  {row['error']}" if row.get("error") else ""  # no prediction: the model's output
        print(f"{index:>6}  {cls:>5}  {confidence:>10}{why}")


@app.command()
@user_errors
def artifacts(
    job: str = typer.Argument(..., help="Job id."),
    download: str | None = typer.Option(None, "--download", help="Artifact id to fetch."),
    out: str | None = typer.Option(
        None,
        "--out",
        help="Where to write it: a file, or a folder (made when it ends with /); default: its "
        "name, here.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out file."),
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
    server: str = server_option(),
) -> None:
    """List a finished job's files (id, size, sha256), or --download one, checked by sha256."""
    with connect(server) as remote:
        rows = remote.json("GET", _job_path(job, "artifacts"), job)
        if download is None:
            _print_artifacts(job, rows, as_json)
            return
        row = next((r for r in rows if r["id"] == download), None)
        if row is None:
            raise UserError(
                f"job {job} has no artifact {download} (list them without --download)", 1
            )
        name = PurePosixPath(row["name"]).name
        target = Path(out) if out is not None else Path(name)
        if out is not None and out.endswith("/"):  # a folder, made if missing
            target.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            target = target / name
        path = _job_path(job, "artifacts", download)
        remote.download(path, job, target, row["sha256"], force)
    console.print(f"wrote {target} ({binary_bytes(row['size'])}, sha256 {row['sha256']} checked)")


def _print_artifacts(job: str, rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print(f"job {job} has no artifacts (yet: they are listed when it ends)")
        return
    # Plain columns, sha256 whole: read by people and by awk alike.
    width = max(len(row["id"]) for row in rows)
    print(f"{'id':<{width}}  {'size':>10}  {'sha256':<64}  name")
    for row in rows:
        size = binary_bytes(row["size"])
        print(f"{row['id']:<{width}}  {size:>10}  {row['sha256']:<64}  {row['name']}")
