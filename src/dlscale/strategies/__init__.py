"""Strategies: how gradients and weights move between workers. One registry entry each."""

from collections.abc import Callable

from dlscale.strategies import single

# name -> run(spec, run_dir, resume_from, reporter) -> the run record (run.json's content)
STRATEGIES: dict[str, Callable[..., dict]] = {"single": single.run}

__all__ = ["STRATEGIES"]
