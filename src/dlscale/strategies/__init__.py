"""Strategies: how gradients and weights move between workers. One registry entry each."""

from collections.abc import Callable

from dlscale.strategies import ddp, pipeline, ps, single, tensor

# name -> run(spec, run_dir, resume_from, reporter, launcher, early_warnings) -> the run record
# (run.json, written by the main trainer; its warnings begin with `early_warnings`, said before
# the run)
STRATEGIES: dict[str, Callable[..., dict]] = {
    "single": single.run,
    "ddp": ddp.run,
    "ps": ps.run,
    "pipeline": pipeline.run,
    "hybrid": pipeline.run,
    "tensor": tensor.run,
}

# name -> check(spec, meta_model, data): what its run refuses before any process starts, for
# `validate` to find too (the model built on the meta device); strategies with nothing to plan
# have none.
CHECKS: dict[str, Callable[..., None]] = {
    "pipeline": pipeline.check,
    "hybrid": pipeline.check,
    "tensor": tensor.check,
}

__all__ = ["CHECKS", "STRATEGIES"]
