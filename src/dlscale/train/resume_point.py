"""Which checkpoint a resume continues from: the newest that loads, past broken newer ones.

A checkpoint is written whole or not at all, but a disk can still corrupt one after the fact,
or a copy can truncate it. Resuming then continues from the newest readable checkpoint whose
contents match their digest, and says which it skipped and why. A skipped file is set aside as
`step-N.pt.unreadable`: left in place, pruning (which keeps the newest K by step) would keep it
over a good one.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlscale.errors import UserError
from dlscale.train import checkpoint as ckpt
from dlscale.train.record import RUN_RECORD

SET_ASIDE_SUFFIX = ".unreadable"


def resume_point(run_dir: Path) -> tuple[Path, list[str]]:
    """The newest readable checkpoint of `run_dir`, and a warning for each newer one skipped;
    one line when there is none, or none loads."""
    found = ckpt.list_checkpoints(run_dir)
    if not found:
        has_record = (Path(run_dir) / RUN_RECORD).exists()
        why = (
            " (the run recorded there stopped before its first checkpoint: remove its run.json "
            "to train there anew, or choose another --out)"
            if has_record
            else ""
        )
        raise UserError(f"nothing to resume: no checkpoint in {ckpt.checkpoint_dir(run_dir)}{why}")
    skipped: list[tuple[Path, str]] = []
    for _, path in reversed(found):
        try:
            state = ckpt.load_checkpoint(path)
        except UserError as exc:  # unreadable or corrupt: truncated, garbage, a wrong digest
            skipped.append((path, str(exc).removeprefix(f"{path}: ")))
            continue
        warnings = [_set_aside(bad, why, path) for bad, why in skipped]
        if ckpt.is_unchecked(state):
            warnings.append(
                f"{path} has no digest (written before dlscale saved one): loaded unchecked"
            )
        return path, warnings
    reasons = "; ".join(f"{path.name}: {_first_sentence(why)}" for path, why in skipped)
    raise UserError(
        f"nothing to resume: no readable checkpoint in {ckpt.checkpoint_dir(run_dir)} ({reasons})"
    )


def _set_aside(path: Path, why: str, chosen: Path) -> str:
    aside = path.with_name(path.name + SET_ASIDE_SUFFIX)
    os.replace(path, aside)
    return f"skipped {path}: {why}; resuming from {chosen.name} instead (kept as {aside.name})"


def _first_sentence(text: str) -> str:
    """torch's reasons run to several sentences of advice; the first names the fault."""
    head, dot, _ = text.partition(". ")
    return head + ("…)" if dot and text.endswith(")") else "")
