"""A job's own process: `python -m dlscale.service.runner JOBDIR` runs the job in its folder
through dlscale.api and leaves result.json; it writes nothing but files in that folder, and none
of them through a symlink (the server starts it in the job sandbox, service/sandbox.py).

It holds `runner.lock` for its whole life (how the server, even a restarted one, tells it is
alive) and creates `claimed` before anything else, so a job started twice (a server that crashed
between spawning and recording it) runs once. SIGINT or SIGTERM cancels: training stops, the
last checkpoint stays, and the result says so. Exit codes: 0 succeeded (or nothing to do),
1 failed, 130 cancelled.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError, one_line
from dlscale.service.deploy import SERVE_KIND
from dlscale.service.layout import (
    APPEND,
    CLAIMED,
    JOB_FILE,
    LOCK,
    METRICS,
    MODEL,
    PID,
    PROFILE,
    RESULT,
    RUN,
    SOCKET,
    SPEC_FILE,
)

PROGRESS_EVERY_S = 2.0  # a step line in the log at most this often
EXIT_CODES = {"succeeded": 0, "failed": 1, "cancelled": 130}


def say(line: str) -> None:
    print(line, flush=True)  # one line at a time: the server streams the log as it grows


class MetricsFile:
    """metrics.jsonl: one JSON object a line, flushed as each is written."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, row: dict) -> None:
        with os.fdopen(os.open(self.path, APPEND, 0o600), "a") as handle:
            handle.write(json.dumps(row, default=str) + "\n")
            handle.flush()


def run_folder(folder: Path) -> Path:
    """run/, where the job writes its run: a real folder, never a link to elsewhere."""
    run = folder / RUN
    if run.is_symlink() or (run.exists() and not run.is_dir()):
        raise UserError(f"{RUN} in the job's folder is not a folder; the job writes nothing there")
    return run


class LogReporter:
    """A training run as plain log lines (no progress bars: the log is a file) and metrics."""

    def __init__(self, metrics: MetricsFile):
        self.metrics = metrics
        self.total_steps = 0
        self.last_line_at = 0.0

    def start(self, plan: dict) -> None:
        self.total_steps = plan["total_steps"]
        say(
            f"training {plan['name']}: {plan['model']} ({plan['parameters']:,} parameters) on "
            f"{plan['device']}, {plan['precision']}, strategy {plan.get('strategy', 'single')}; "
            f"{plan['train_samples']:,} training / {plan['val_samples']:,} validation samples; "
            f"batch {plan['global_batch_size']}, {plan['total_steps']} steps "
            f"(from step {plan['start_step']})"
        )

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None:
        now = time.monotonic()
        if now - self.last_line_at >= PROGRESS_EVERY_S:
            self.last_line_at = now
            say(
                f"step {step}/{self.total_steps}  epoch {epoch}  loss {loss:.4f}  "
                f"{samples_per_s:,.0f} samples/s"
            )

    def epoch_end(self, record: dict) -> None:
        self.metrics.append(record)
        say(
            f"epoch {record['epoch']}  step {record['step']}  loss {_num(record['train_loss'])}"
            f"  val loss {_num(record['val_loss'])}  val acc {_num(record['val_accuracy'])}"
        )

    def warn(self, message: str) -> None:
        say(f"warning: {message}")

    def finish(self, record: dict) -> None:
        final = record["final"]
        say(
            f"finished: val accuracy {_num(final.get('val_accuracy'))}, val loss "
            f"{_num(final.get('val_loss'))}, {final.get('step')} steps in "
            f"{final.get('wall_s', 0.0):.1f} s"
        )


class SweepLogReporter:
    """A sweep as log lines; each finished trial's row also goes to metrics.jsonl."""

    def __init__(self, metrics: MetricsFile):
        self.metrics = metrics

    def start(self, info: dict) -> None:
        say(
            f"sweep {info['name']}: {info['search']} search, {info['trials']} trial(s), "
            f"{info['slots']} at a time on {info['cluster']}"
        )

    def update(self, result: dict) -> None:
        pass  # trial_done says what changed; a line per event would flood the log

    def trial_done(self, trial: dict) -> None:
        self.metrics.append(trial)
        params = " ".join(f"{k}={v}" for k, v in trial["params"].items())
        error = f" ({trial['error']})" if trial.get("error") else ""
        say(f"trial {trial['id']} {params}: {trial['status']} {_num(trial['metric'])}{error}")

    def warn(self, message: str) -> None:
        say(f"warning: {message}")

    def finish(self, result: dict) -> None:
        best = result.get("best") or {}
        say(f"sweep finished: best trial {best.get('id', '-')} {_num(best.get('metric'))}")


def _num(value) -> str:
    return "-" if value is None else f"{value:.4f}"


# ---------------------------------------------------------------------------------- the kinds


def run_train(job: dict, spec: Path, folder: Path) -> tuple[dict | None, str | None]:
    from dlscale import api

    reporter = LogReporter(MetricsFile(folder / METRICS))
    record = api.train(spec, out_dir=run_folder(folder), reporter=reporter)
    return record.final.model_dump(mode="json"), api.weights_digest(folder / RUN)


def run_sweep(job: dict, spec: Path, folder: Path) -> tuple[dict | None, str | None]:
    from dlscale import api

    reporter = SweepLogReporter(MetricsFile(folder / METRICS))
    run = run_folder(folder)
    result = api.sweep(spec, out_dir=run, parallel=job.get("parallel"), reporter=reporter)
    if result.failure:  # every trial failed: the sweep did not do its job
        raise UserError(result.failure)
    best = None if result.best is None else result.best.model_dump(mode="json")
    return best, None  # many trials' weights: no one digest stands for them


def run_profile(job: dict, spec: Path, folder: Path) -> tuple[dict | None, str | None]:
    from rich.console import Console

    from dlscale.api import profiling

    # What `dlscale profile SPEC` shows, with its defaults.
    result = profiling.profile(profiling.ProfileRequest(str(spec)))
    run = run_folder(folder)
    run.mkdir(exist_ok=True)
    write_json_atomic(run / PROFILE, profiling.profile_json(result))
    profiling.profile_report(result, Console(file=sys.stdout, width=120, color_system=None))
    say(f"wrote {RUN}/{PROFILE}")
    return None, None


def run_serve(job: dict, spec: Path, folder: Path) -> tuple[dict | None, str | None]:
    """Serve the model copied into model/ until cancelled (which ends it as KeyboardInterrupt),
    on a Unix socket in the job's folder: its sandbox has no network, and the server forwards
    its tenant's requests there. Named relative to the folder (the cwd): a socket's path is
    limited to 107 bytes, and the folder's may be longer."""
    from dlscale.api import serving

    options = job["serve"]

    def ready(info: dict) -> None:
        say(
            f"serving {info['task']} model ({info['input_kind']} {info['input_shape']}, "
            f"{info['num_classes']} classes) on {options['device']} at {info['precision']}; "
            f"listening on {SOCKET}"
        )

    serving.serve_on_socket(folder / MODEL, SOCKET, options["device"], options["precision"], ready)
    raise UserError("the model's server stopped without being cancelled")


KINDS = {"train": run_train, "sweep": run_sweep, "profile": run_profile, SERVE_KIND: run_serve}


# ---------------------------------------------------------------------------------- the process


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM cancels like SIGINT: the same cleanup, the same result


def _ignore_signals() -> None:
    """From the first cancel on: the server resends it until the process is gone, and a second
    one must not interrupt the writing of the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _last_checkpoint(folder: Path) -> str | None:
    found = [p for p in (folder / RUN).rglob("step-*.pt") if p.is_file()]
    if not found:
        return None
    return str(max(found, key=lambda p: p.stat().st_mtime_ns).relative_to(folder))


def _data_digest(spec: Path) -> dict | None:
    from dlscale import api

    try:
        return api.data_fingerprint(spec)
    except Exception:  # unreadable data: the run itself says why, in its own words
        return None


def _new_result() -> dict:
    result = {"state": "failed", "message": "", "weights_sha256": None, "data_sha256": None}
    return {**result, "metrics": None, "environment": None}


def _cancelled(folder: Path, when: str = "", kind: str | None = None) -> dict:
    """State and message of a job cancelled (`when`), naming the checkpoint it keeps."""
    if kind == SERVE_KIND:
        return {"state": "cancelled", "message": "cancelled: the model is no longer served"}
    kept = _last_checkpoint(folder)
    where = f": {kept}" if kept else " (none was saved)"
    cancelled = f"cancelled {when};" if when else "cancelled;"
    return {"state": "cancelled", "message": f"{cancelled} the last checkpoint is kept{where}"}


def run_job(folder: Path) -> dict:
    """Run the job in `folder`; its result (never raises but for a second interrupt)."""
    result = _new_result()
    kind = None
    try:
        job = json.loads((folder / JOB_FILE).read_text())
        kind = job.get("kind")
        if kind not in KINDS:
            raise UserError(f"{JOB_FILE}: unknown job kind {kind!r}")
        spec = folder / job.get("spec_file", SPEC_FILE)
        say(f"job {job.get('id', folder.name)}: {kind}")
        data = None if kind == SERVE_KIND else _data_digest(spec)  # it reads no data
        if data is not None:
            result["data_sha256"] = data["sha256"]
            if data["partial"]:
                result["data_partial"] = True  # big files counted by size and mtime, not read
        result["metrics"], result["weights_sha256"] = KINDS[kind](job, spec, folder)
        result.update(state="succeeded", message=f"{kind} succeeded")
    except UserError as exc:
        result["message"] = str(exc)
    except KeyboardInterrupt:
        _ignore_signals()
        result.update(_cancelled(folder, kind=kind))
    except Exception as exc:
        traceback.print_exc()
        result["message"] = f"{type(exc).__name__}: {one_line(exc)}"
    return result


def _hold_lock(folder: Path) -> int | None:
    """The job's lock, held until this process exits; None if another runner holds it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(folder / LOCK, flags, 0o600)
    except OSError as exc:  # a link or a fifo in its place: not this runner's to use
        say(f"cannot take {LOCK}: {exc.strerror}; this process exits")
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m dlscale.service.runner JOBDIR", file=sys.stderr)
        return 2
    folder = Path(argv[0]).absolute()
    # Until the imports are done, a cancel is noted, not raised: a KeyboardInterrupt inside an
    # import can leave a module half-made (numpy.linalg without _umath_linalg), and the job
    # then failed with an AttributeError instead of ending cancelled.
    early: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: early.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: early.append(signum))
    lock = _hold_lock(folder)
    if lock is None:
        say("another process is running this job; this one exits")
        return 0
    try:
        os.close(
            os.open(folder / CLAIMED, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        )
    except FileExistsError:
        say("this job was already started once; it is not run again")
        return 0
    write_json_atomic(folder / PID, {"pid": os.getpid(), "pgid": os.getpgid(0)})
    say(f"starting job {folder.name} as process {os.getpid()}")
    # The imports a cancel must not cut in half: the verbs, and the profile and serve-model
    # kinds' own modules.
    import dlscale.api
    import dlscale.api.profiling
    import dlscale.api.serving  # noqa: F401

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    if early:
        result = {**_new_result(), **_cancelled(folder, "before it started training")}
    else:
        result = run_job(folder)
    _ignore_signals()
    try:
        from dlscale import api

        result["environment"] = api.environment()
        api.exit_quickly()  # the lock goes ~1 s sooner: the server sees the end sooner
    except Exception as exc:  # the result matters more than its footnote
        say(f"warning: could not record the environment: {type(exc).__name__}: {exc}")
    write_json_atomic(folder / RESULT, result)
    say(f"job {result['state']}: {result['message']}")
    return EXIT_CODES[result["state"]]


if __name__ == "__main__":
    sys.exit(main())
