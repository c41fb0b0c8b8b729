"""Strategy `single`: one process on one device, the reference every parallel strategy matches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlscale.jobspec import Spec
from dlscale.train.loop import Trainer
from dlscale.train.reporter import Reporter
from dlscale.train.threads import intra_op_threads


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher=None,
    early_warnings: Sequence[str] = (),
) -> dict:
    """One process: the launcher is not needed (a cluster launcher is refused by api.train)."""
    with intra_op_threads(spec.threads):
        trainer = Trainer(spec, run_dir, reporter, early_warnings=early_warnings)
        if resume_from is not None:
            trainer.resume(resume_from)
        return trainer.run()
