"""Strategies: how gradients and weights move between workers. One registry entry each."""

from collections.abc import Callable

from dlscale.strategies import ddp, pipeline, ps, single

# name -> run(spec, run_dir, resume_from, reporter, launcher) -> the run record (run.json)
STRATEGIES: dict[str, Callable[..., dict]] = {
    "single": single.run,
    "ddp": ddp.run,
    "ps": ps.run,
    "pipeline": pipeline.run,
    "hybrid": pipeline.run,
}

# Those that continue from a checkpoint (`train --resume`); pipeline and hybrid start over.
RESUMABLE = frozenset({"single", "ddp", "ps"})

__all__ = ["RESUMABLE", "STRATEGIES"]
