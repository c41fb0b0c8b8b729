"""The spec's `threads`: torch's intra-op threads for the length of a run in this process."""

from __future__ import annotations

import contextlib

import torch

from dlscale.errors import UserError


def check_threads(count: int | None) -> None:
    """A thread count asked for: None (torch's default) or a positive integer."""
    if count is not None and count < 1:
        raise UserError(f"--threads: must be a positive integer (got {count})")


@contextlib.contextmanager
def intra_op_threads(count: int | None):
    """torch's intra-op threads at `count` while the block runs (None: as they are). This
    process may be the caller's (a library user, a sweep trial): its own count comes back."""
    check_threads(count)
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
