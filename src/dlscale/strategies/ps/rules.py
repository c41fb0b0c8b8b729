"""The parameter servers' update rules as pure functions: staleness, its learning-rate scale,
the stale-synchronous bound, averaging rounds, and when a Downpour worker pushes and fetches."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def staleness(server_version: int, computed_from: int) -> int:
    """Updates the server applied since the parameters a gradient was computed from."""
    return server_version - computed_from


def staleness_lr_scale(stale: int, scaled: bool) -> float:
    """`staleness_lr`: a gradient `stale` updates old steps 1 / (1 + stale) as far."""
    return 1.0 / (1 + stale) if scaled else 1.0


def ssp_must_wait(clock: dict[int, int], worker: int, live: Iterable[int], bound: int | None):
    """Stale-synchronous parallel: `worker` may not pull while it is more than `bound` pushes
    ahead of the slowest other live worker."""
    if bound is None:
        return False
    others = [clock[w] for w in live if w != worker]
    return bool(others) and clock[worker] - min(others) > bound


def clock_gap(clock: dict[int, int], live: Iterable[int]) -> int:
    """How far the fastest live worker is ahead of the slowest, in pushes (or rounds)."""
    counts = [clock[w] for w in live]
    return max(counts) - min(counts) if counts else 0


def round_complete(members: set[int], live: Iterable[int]) -> bool:
    """An averaging round ends once every live worker has sent its parameters."""
    return members >= set(live)


def averaging_due(step: int, local_steps: int) -> bool:
    """After its step `step` (1-based), an averaging worker sends its parameters."""
    return step % local_steps == 0


def downpour_actions(step: int, accumulated: int, n_push: int, n_fetch: int, last_step: int):
    """(push, fetch) after step `step` with `accumulated` steps of gradients summed: push every
    `n_push` steps; fetch with the push when `n_fetch` divides the step, unless training ends
    there (async is downpour with n_push = n_fetch = 1)."""
    push = accumulated == n_push
    return push, push and step % n_fetch == 0 and step < last_step


def apply_gradient(
    flat: torch.nn.Parameter,
    grad: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    base_lrs: list[float],
    lr_scale: float,
) -> None:
    """One server update: the spec's optimizer on the shard with `grad`, at lr × `lr_scale`."""
    for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
        group["lr"] = lr * lr_scale
    flat.grad = grad
    optimizer.step()
    flat.grad = None
