"""A run that goes wrong after it started, through no defect of dlscale's: its loss or weights
stop being numbers, or the user's model fails at some step. Each ends the run in one line
(RunFailed, exit 1) naming the step and what survives; the user's traceback goes to the run
folder's `errors.log`. An error that passed through no user code is dlscale's (or torch's) and
keeps its traceback."""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import torch

from dlscale.atomic import write_json_atomic
from dlscale.errors import RunFailed, lost_peer, one_line, os_reason
from dlscale.models.registry import user_code_failure, user_frame
from dlscale.signals import Terminated
from dlscale.train import checkpoint as ckpt
from dlscale.train.record import RUN_RECORD, recorded

ERROR_LOG = "errors.log"


class NoGradient(Exception):
    """The loss does not depend on any trainable parameter: backward has nothing to reach."""

    def __str__(self) -> str:
        return (
            "its loss does not depend on any trainable parameter (logits detached, or "
            "computed without the parameters)"
        )


def last_good(run_dir: Path) -> str:
    """What a diverged run leaves: its newest checkpoint, saved before the loss went bad."""
    found = ckpt.list_checkpoints(run_dir)
    if not found:
        return "no checkpoint was saved before it"
    step, path = found[-1]
    return f"the last good checkpoint is step {step} ({path})"


def loss_diverged(loss: float | None, step: int, run_dir: Path) -> RunFailed | None:
    """NaN or ±inf: every later step would train on it, so the run stops at the first."""
    if loss is None or math.isfinite(loss):
        return None
    return RunFailed(f"training diverged at step {step}: the loss is {loss}; {last_good(run_dir)}")


def weights_diverged(state: dict, step: int, run_dir: Path) -> RunFailed | None:
    """Before a checkpoint is written: an update can overflow the weights while the loss that
    led to it was still finite, and such a checkpoint would be no good one to go back to."""
    bad = next(
        (
            name
            for name, value in state.items()
            if isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ),
        None,
    )
    if bad is None:
        return None
    return RunFailed(
        f"training diverged at step {step}: weight {bad} is not finite; {last_good(run_dir)}"
    )


def user_code_failed(
    error: BaseException, model_name: str, step: int, run_dir: Path, rank: int, during: str = ""
) -> RunFailed | None:
    """The one line for a step (or the evaluation after it: `during`) that failed in the
    user's model, its traceback logged; None for an error that is dlscale's or torch's own
    (it keeps its traceback)."""
    head = f"model '{model_name}' failed at step {step}{during}"
    if isinstance(error, NoGradient):
        return RunFailed(f"{head}: {error}")
    if not _is_users(error):
        return None
    log = Path(run_dir) / ERROR_LOG
    trace = "".join(traceback.format_exception(error))
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        # Appended, one write: a resumed run's earlier failures stay, and the workers of a
        # job that all fail each add their own.
        with open(log, "a") as handle:
            handle.write(f"--- {stamp} trainer {rank}, {head}\n{trace}\n")
    except OSError as exc:
        return RunFailed(
            f"{head}: {user_code_failure(error)} (its traceback could not be written to "
            f"{log}: {os_reason(exc)})"
        )
    return RunFailed(f"{head}: {user_code_failure(error)}; traceback in {log}")


def _is_users(error: BaseException) -> bool:
    """Raised by the user's code, or by what it called. Not a collective that failed inside
    the user's forward (tensor-parallel layers, a SyncBatchNorm): that lost a peer, which the
    launcher names, and a line blaming the model would hide."""
    if isinstance(error, SystemExit):
        return True
    if isinstance(error, torch.distributed.DistError) or lost_peer(str(error)):
        return False
    return user_frame(error) is not None


class Faults:
    """One trainer's faults, each raised as its one line once run.json says the run failed and
    why: `write_record` (the trainer's method, on the main trainer; None elsewhere) writes it."""

    def __init__(
        self,
        model_name: str,
        run_dir: Path,
        rank: int,
        write_record: Callable[[str, str], object] | None,
    ):
        self.model_name, self.run_dir, self.rank = model_name, Path(run_dir), rank
        self.write_record = write_record

    def failed(self, error: RunFailed) -> RunFailed:
        """`error`, once run.json says the run failed and why."""
        if self.write_record is not None:
            # The record must not hide the fault: a failure to write it goes unsaid.
            with contextlib.suppress(Exception):
                self.write_record("failed", str(error))
        return error

    def user_code(self, step: int, during: str, call: Callable, *args):
        """`call(*args)`, which runs the user's model; its failing is one line (RunFailed)
        with the traceback logged, unless it is dlscale's or torch's own error."""
        try:
            return call(*args)
        except (Exception, SystemExit) as exc:
            failed = user_code_failed(exc, self.model_name, step, self.run_dir, self.rank, during)
            if failed is None:  # not the user's: its traceback is the report
                raise
            raise self.failed(failed) from None

    def check_loss(self, loss: float | None, step: int) -> None:
        """Stops the run at the first loss that is not a number (see `loss_diverged`)."""
        diverged = loss_diverged(loss, step, self.run_dir)
        if diverged is not None:
            raise self.failed(diverged)

    def check_weights(self, state: dict, step: int) -> None:
        """Refuses to checkpoint weights that are not numbers (see `weights_diverged`)."""
        diverged = weights_diverged(state, step, self.run_dir)
        if diverged is not None:
            raise self.failed(diverged)


def record_end(run_dir: Path, status: str, reason: str) -> None:
    """run.json says the run ended (`failed`, `interrupted`) and why, where it still says
    `running`, and names the checkpoints on disk (written and pruned since the trainer's last
    record) and, where it is later, the newest one's step as its final step. For the parent of
    a job's processes, once they are stopped: the trainer that met the fault may not be the one
    that writes the record, or was stopped writing it. A run that ended before its first record
    (written as training starts) has none."""
    record = recorded(run_dir)
    if record is not None and record.get("status") == "running":
        found = ckpt.list_checkpoints(run_dir)
        record.update(status=status, error=reason, checkpoints=[str(path) for _, path in found])
        final = record.get("final")
        if found and isinstance(final, dict) and found[-1][0] > final.get("step", 0):
            final["step"] = found[-1][0]  # where a --resume continues
        with ckpt.naming_intact(run_dir):
            write_json_atomic(Path(run_dir) / RUN_RECORD, record)


@contextlib.contextmanager
def ending_recorded(run_dir: Path) -> Iterator[None]:
    """However the run inside stops short, its run.json stops saying `running`: Ctrl-C and
    SIGTERM leave `interrupted`, any error `failed`, each with its one line; then it re-raises."""
    try:
        yield
    except KeyboardInterrupt as stop:
        by = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
        record_end(run_dir, "interrupted", f"stopped by {by}")
        raise
    except Exception as exc:  # a lost worker, a failed write, a timeout, a defect
        record_end(run_dir, "failed", one_line(exc) or type(exc).__name__)
        raise
