"""Whether a checkpoint continues this spec: the same spec hash, or a spec that differs from the
one that wrote it only where no step changes (when checkpoints are written and how many are
kept). Otherwise one line naming the hashed fields that changed. The spec that wrote a
checkpoint is the one it carries (`spec`, or `model_source.spec`), else the run's record when
that record is of the checkpoint's spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.errors import UserError
from dlscale.jobspec import Spec, parse_spec
from dlscale.train.record import recorded

# Hashed fields a resume may change: they decide when checkpoints are written and how many are
# kept, not what a step computes (threads and the like are outside the hash already).
BOOKKEEPING = {"checkpoint.keep_last", "checkpoint.every_steps"}
SHOWN = 3  # changed fields named in the one line


def changed_fields(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, old value, new value) for every leaf that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            found += changed_fields(old.get(key), new.get(key), f"{prefix}{key}.")
        return found
    return [] if old == new else [(prefix.removesuffix("."), old, new)]


def _parsed(raw: Any, spec_hash: str | None) -> Spec | None:
    try:
        spec = parse_spec(raw)
    except (UserError, TypeError, ValueError):
        return None
    return spec if spec.spec_hash() == spec_hash else None


def written_by(state: dict, run_dir: Path) -> Spec | None:
    """The spec that wrote `state` (a checkpoint or a ps shard), if it can be told."""
    saved_hash = state.get("spec_hash")
    source = state.get("model_source")
    carried = state.get("spec") or (source.get("spec") if isinstance(source, dict) else None)
    if carried is not None:
        return _parsed(carried, saved_hash)
    record = recorded(run_dir)  # a checkpoint from before checkpoints carried their spec
    return None if record is None else _parsed(record.get("spec"), saved_hash)


def bookkeeping_only(earlier: Spec, spec: Spec) -> list[tuple[str, Any, Any]] | None:
    """None where `spec` continues `earlier` (nothing hashed changed but bookkeeping); else the
    hashed fields that changed."""
    changed = changed_fields(earlier.hashed_fields(), spec.hashed_fields())
    return None if {field for field, _, _ in changed} <= BOOKKEEPING else changed


def check_resumable(state: dict, path: Path, spec: Spec, run_dir: Path) -> None:
    """A checkpoint (or shard) at `path` continues `spec` (see the module's docstring)."""
    saved_hash = state.get("spec_hash")
    if saved_hash == spec.spec_hash():
        return
    earlier = written_by(state, run_dir)
    changed = bookkeeping_only(earlier, spec) if earlier is not None else []
    if changed is None:
        return
    if changed:
        named = "; ".join(f"{field} changed ({old} → {new})" for field, old, new in changed[:SHOWN])
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        what = f": {named}{more}"
        allowed = f" (a resume may change only {' and '.join(sorted(BOOKKEEPING))})"
    else:
        what, allowed = f" (hash {saved_hash}, this spec {spec.spec_hash()})", ""
    raise UserError(
        f"{path} was written by a different spec{what}; start a new run instead of "
        f"--resume{allowed}"
    )
