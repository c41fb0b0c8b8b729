"""Strategies: how gradients and weights move between workers. One registry entry each."""

from collections.abc import Callable

from dlscale.strategies import ddp, pipeline, ps, single, tensor

# name -> run(spec, run_dir, resume_from, reporter, launcher) -> the run record (run.json)
STRATEGIES: dict[str, Callable[..., dict]] = {
    "single": single.run,
    "ddp": ddp.run,
    "ps": ps.run,
    "pipeline": pipeline.run,
    "hybrid": pipeline.run,
    "tensor": tensor.run,
}

__all__ = ["STRATEGIES"]
