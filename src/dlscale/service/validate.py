"""The validation job: `python -m dlscale.service.validate JOBDIR`, run by the server in the job's
sandbox (its folder read-only, one CPU, the job's memory, a time limit) before a job is queued;
and how the server reads what it said (`bounded_output`, `read_verdict`).

Everything that needs the spec's model, data or code happens here, never in the server: the
model's factory (the tenant's own module, imported as inputs.NAME) built on the meta device, the
data set read and one sample passed through the model, a sweep's trials expanded, and whether the
job can ever run in the slots it asks for (its processes, and its model and data in the memory
those slots give it, as `dlscale train` refuses them). The last line printed is the verdict:
`dlscale-verdict: {"ok": ..., "message": ..., "warnings": [...]}`; a tenant's code may print
anything before it, and a verdict it forges only speaks of its own job.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import UserError, one_line
from dlscale.service.cgroups import Usage
from dlscale.service.deploy import SERVE_KIND
from dlscale.service.layout import JOB_FILE, MODEL, SPEC_FILE, open_plain
from dlscale.units import binary_bytes

LOCAL = "on this machine: "
VERDICT_MARK = "dlscale-verdict: "  # the validation job's last line: this, then JSON
OUTPUT_KEPT_BYTES = 64 * 1024  # of a validation's output: its last lines say what went wrong


@dataclass(frozen=True)
class Verdict:
    """What the validation job said: ok, or the one line that refuses the spec."""

    ok: bool
    message: str
    warnings: tuple[str, ...] = ()


def check(folder: Path) -> list[str]:
    """The spec's warnings if the job can run; UserError with the one line that refuses it."""
    from dlscale import api

    try:
        with open_plain(folder / JOB_FILE) as handle:
            job = json.load(handle)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(f"{JOB_FILE}: unreadable ({exc})") from None
    if job.get("kind") == SERVE_KIND:
        return check_model(folder, job)
    spec_path = folder / job.get("spec_file", SPEC_FILE)
    # Its model, data, one sample; a sweep's trials (its paths were checked by the server).
    spec, warnings = api.validate(spec_path)
    if job.get("kind") == "sweep" and spec.sweep is None:
        raise UserError("kind sweep: the spec has no sweep: section")
    # In its sandbox the machine is the job's slots (DLSCALE_CPUS, DLSCALE_MEMORY_BYTES): what
    # would stop it there (too many processes, a model or data too big) stops it now, not
    # after it waited in the queue. `validate` names those as warnings "on this machine: ...".
    here = [w.removeprefix(LOCAL) for w in warnings if w.startswith(LOCAL)]
    if here and job.get("kind") in ("train", "sweep"):
        raise UserError(f"refused: this job can never run in the slots it asks for: {here[0]}")
    return [w for w in warnings if not w.startswith(LOCAL)]


def check_model(folder: Path, job: dict) -> list[str]:
    """A deployment: its model rebuilt from its copy of the run, on the CPU at the precision
    it will serve at (a GPU is the job's only once it runs)."""
    from dlscale.api.inference import load_predictor

    load_predictor(folder / MODEL, device="cpu", precision=job["serve"]["precision"])
    return []


def verdict(folder: Path) -> dict:
    """The verdict on the job in `folder`, its paths named relative to the folder."""
    try:
        said = {"ok": True, "message": "", "warnings": check(folder)}
    except UserError as exc:
        said = {"ok": False, "message": str(exc)}
    except Exception as exc:  # a defect of ours or of the tenant's code: named, in one line
        traceback.print_exc()
        said = {"ok": False, "message": f"{type(exc).__name__}: {one_line(exc)}"}
    return json.loads(json.dumps(said).replace(f"{folder}/", ""))


def wait_for_go() -> bool:
    """A warm validator: import what checking takes, then wait for the server's one line with
    the job's slots (the machine it checks against); False when the server is gone."""
    import sklearn.datasets  # the zoo's data, which most specs read
    import sklearn.model_selection  # noqa: F401

    from dlscale import api  # noqa: F401

    line = sys.stdin.readline()
    if not line:
        return False
    go = json.loads(line)
    os.environ["DLSCALE_CPUS"] = str(int(go["cpus"]))
    os.environ["DLSCALE_MEMORY_BYTES"] = str(int(go["memory_bytes"]))
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wait = argv[:1] == ["--wait"]
    if len(argv) != 1 + wait:
        print("usage: python -m dlscale.service.validate [--wait] JOBDIR", file=sys.stderr)
        return 2
    if wait and not wait_for_go():
        return 0
    said = verdict(Path(argv[-1]).absolute())
    print(VERDICT_MARK + json.dumps(said), flush=True)
    return 0


def bounded_output(process: subprocess.Popen, timeout_s: float) -> tuple[str, bool]:
    """The last OUTPUT_KEPT_BYTES of the process's output, and whether it ran out of time."""
    kept = b""
    deadline = time.monotonic() + timeout_s
    stream = process.stdout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return kept.decode(errors="replace"), True
        ready, _, _ = select.select([stream], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                stream.close()
                return kept.decode(errors="replace"), False
            kept = (kept + chunk)[-OUTPUT_KEPT_BYTES:]


def read_verdict(
    output: str,
    returncode: int,
    timed_out: bool,
    timeout_s: float,
    usage: Usage | None,
    memory_bytes: int,
) -> Verdict:
    """The verdict a validation's output holds; a time-out, an out-of-memory kill or no
    verdict line at all each refuses the spec with what is known."""
    if timed_out:
        return Verdict(
            False,
            f"checking the spec took longer than {timeout_s:g} s (its model's build, or its "
            "data read)",
        )
    lines = [line for line in output.splitlines() if line.strip()]
    marked = [line for line in lines if line.startswith(VERDICT_MARK)]
    if marked:
        try:
            said = json.loads(marked[-1][len(VERDICT_MARK) :])
            ok, message = bool(said["ok"]), str(said.get("message") or "")
            warnings = tuple(str(w)[:500] for w in said.get("warnings") or [])[:50]
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        else:
            return Verdict(ok, " ".join(message.split())[:2000], warnings)
    if usage is not None and usage.oom_kills:  # it died at the limit before it could say
        share = binary_bytes(memory_bytes)
        return Verdict(
            False, f"checking the spec ran out of memory: the job may use {share} (its slots')"
        )
    last = lines[-1][:500] if lines else "no output"
    return Verdict(False, f"checking the spec failed (exit {returncode}): {last}")


if __name__ == "__main__":
    sys.exit(main())
