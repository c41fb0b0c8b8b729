"""K-fold checked before a sweep starts: each configuration's data must hold at least `kfold`
training samples, found by splitting it once here rather than failing in every fold's run."""

from __future__ import annotations

import json

from dlscale.data import build_data
from dlscale.errors import UserError
from dlscale.jobspec import Spec


def check_folds(runs: list[Spec], source: str) -> None:
    """Read the data of every distinct data section among `runs` (each a fold run) and split
    it as its first fold would; a fold count the data cannot give is one line naming `source`."""
    seen: set[str] = set()
    for run in runs:
        if run.data.fold is None:
            continue
        # Swept settings such as the learning rate leave the data alone: read it once.
        key = json.dumps([run.data.model_dump(mode="json"), run.seed], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            build_data(run.data, run.seed)
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
