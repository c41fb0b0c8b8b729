"""Checkpoints: written atomically, pruned to the last K, loaded with `weights_only=True`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from dlscale.errors import UserError, one_line
from dlscale.train.files import write_atomic

FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.pt"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; temp files are not listed."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write `state` as step-N.pt (temp file, fsync, rename), then drop all but the newest K."""
    path = checkpoint_path(run_dir, step)
    payload = {"format": FORMAT_VERSION, "step": step, **state}
    write_atomic(path, lambda handle: torch.save(payload, handle))
    for _, old in list_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with `weights_only=True`: a checkpoint can hold tensors and plain data, never code."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint not found: {path}") from None
    except Exception as exc:  # a truncated or foreign file: say which and why, in one line
        raise UserError(f"{path}: not a readable dlscale checkpoint ({one_line(exc)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise UserError(f"{path}: not a dlscale checkpoint (format {FORMAT_VERSION} expected)")
    return state


def check_spec(state: dict[str, Any], path: Path, spec_hash: str) -> None:
    """A checkpoint continues only the spec that wrote it."""
    if state.get("spec_hash") != spec_hash:
        raise UserError(
            f"{path} was written by a different spec (hash {state.get('spec_hash')}, "
            f"this spec {spec_hash}); start a new run instead of --resume"
        )


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def rng_state(device: torch.device) -> dict[str, Any]:
    """The global RNG streams a step may draw from (dropout, random init of lazy layers)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
