"""Whether a checkpoint continues this spec: the same spec hash, or a spec that differs from the
one that wrote it only where no step changes (where checkpoints are kept and how often they are
written, how many threads compute). Otherwise one line naming the fields that changed, read
from the run's own record (run.json keeps the spec it ran), so the user need not diff by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlscale.errors import UserError
from dlscale.jobspec import Spec, parse_spec

# Fields a resume may change: they decide when and where checkpoints are written and how fast
# a step runs, not what it computes (threads and keep_freed_memory are out of the hash already).
BOOKKEEPING = {"checkpoint.keep_last", "checkpoint.every_steps", "threads", "keep_freed_memory"}
SHOWN = 3  # changed fields named in the one line


def changed_fields(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, old value, new value) for every leaf that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            found += changed_fields(old.get(key), new.get(key), f"{prefix}{key}.")
        return found
    return [] if old == new else [(prefix.removesuffix("."), old, new)]


def written_by(run_dir: Path, spec_hash: str) -> Spec | None:
    """The spec the run's record says it ran, if that record is of the checkpoint's spec."""
    try:
        record = json.loads((Path(run_dir) / "run.json").read_text())
        spec = parse_spec(record["spec"])
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None
    return spec if spec.spec_hash() == spec_hash else None


def check_resumable(state: dict, path: Path, spec: Spec, run_dir: Path) -> None:
    """A checkpoint at `path` continues `spec` (see the module's docstring), else one line."""
    saved_hash = state.get("spec_hash")
    if saved_hash == spec.spec_hash():
        return
    earlier = written_by(run_dir, saved_hash)
    changed = (
        changed_fields(earlier.model_dump(mode="json"), spec.model_dump(mode="json"))
        if earlier is not None
        else []
    )
    if changed and {field for field, _, _ in changed} <= BOOKKEEPING:
        return
    if changed:
        named = "; ".join(f"{field} changed ({old} → {new})" for field, old, new in changed[:SHOWN])
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        what = f": {named}{more}"
    else:
        what = f" (hash {saved_hash}, this spec {spec.spec_hash()})"
    raise UserError(
        f"{path} was written by a different spec{what}; start a new run instead of --resume "
        f"(a resume may change only {', '.join(sorted(BOOKKEEPING))})"
    )
