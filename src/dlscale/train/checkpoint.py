"""Checkpoints: written atomically with a digest of what they hold, pruned to the last K, loaded
with `weights_only=True` and checked against their digest."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dlscale.atomic import WriteFailed, write_atomic
from dlscale.errors import UserError, one_line, os_reason
from dlscale.signals import interrupt_behind
from dlscale.train.digest import content_digest

# Format 2 carries `sha256`, the digest of everything else in it; format 1 (before digests)
# still loads, unchecked, and a resume says so.
FORMAT_VERSION = 2
UNCHECKED_FORMAT = 1
DIGEST_KEY = "sha256"
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
    payload = sealed({"step": step, **state})
    with naming_intact(run_dir):
        write_atomic(path, lambda handle: torch.save(payload, handle))
    for _, old in list_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def sealed(state: dict[str, Any]) -> dict[str, Any]:
    """`state` as a checkpoint file holds it: the format, and the digest that load checks."""
    payload = {"format": FORMAT_VERSION, **state}
    payload[DIGEST_KEY] = content_digest(payload)
    return payload


@contextmanager
def naming_intact(run_dir: Path) -> Iterator[None]:
    """A run's file that cannot be written (a full disk) stops the run in one line that says
    what survives: the older checkpoints, which a failed write never touches."""
    try:
        yield
    except WriteFailed as exc:
        found = list_checkpoints(run_dir)
        if not found:
            raise WriteFailed(f"{exc}; no checkpoint of this run was saved before") from None
        step, newest = found[-1]
        raise WriteFailed(
            f"{exc}; the older checkpoints are intact (newest: step {step}, {newest}): make "
            "room, then continue with --resume"
        ) from None


def unreadable(path: Path, exc: Exception) -> str:
    """Why torch.load could not read `path`, in words: an empty file, one that is no torch.save
    archive (text, or another format) and one cut short say so; otherwise torch's own line."""
    try:
        with open(path, "rb") as file:
            head = file.read(4)
        if not head:
            return "an empty file"
        if head != b"PK\x03\x04":  # torch.save writes a zip archive
            return "not a torch.save archive"
        if not zipfile.is_zipfile(path):
            return "a torch.save archive cut short: it has no end"
    except OSError as err:
        return os_reason(err)
    return one_line(exc) or type(exc).__name__


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with `weights_only=True`: a checkpoint can hold tensors and plain data, never code."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint not found: {path}") from None
    except Exception as exc:  # a truncated or foreign file: say which and why, in one line
        stop = interrupt_behind(exc)
        if stop is not None:  # Ctrl-C while loading: the file is not to blame
            raise stop from None
        raise UserError(
            f"{path}: not a readable dlscale checkpoint ({unreadable(path, exc)})"
        ) from None
    if not isinstance(state, dict) or state.get("format") not in (FORMAT_VERSION, UNCHECKED_FORMAT):
        raise UserError(f"{path}: not a dlscale checkpoint (format {FORMAT_VERSION} expected)")
    # Checked whenever a digest is there: a flipped byte in `format` must not skip the check.
    if state["format"] == FORMAT_VERSION or DIGEST_KEY in state:
        saved = state.pop(DIGEST_KEY, None)
        if saved != content_digest(state):
            raise UserError(
                f"{path}: corrupt: its contents do not match the sha256 digest saved with it"
            )
    return state


def is_unchecked(state: dict[str, Any]) -> bool:
    """Written before checkpoints carried a digest: loaded as it is, with nothing to check."""
    return state["format"] == UNCHECKED_FORMAT


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def rng_state(device: torch.device) -> dict[str, Any]:
    """This trainer's random streams a step draws from: the CPU generator (dropout on the CPU,
    random init of lazy layers) and its own accelerator's generator (dropout there)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        # Its own GPU's only: restoring every visible GPU's state would open a context on each
        # GPU in every process, and fail on a machine with fewer GPUs than the one that saved.
        state["cuda"] = torch.cuda.get_rng_state(device)
    elif device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back what `rng_state` saved; an accelerator's stream only on that kind of device.
    Generators take their state as a CPU tensor, and a checkpoint loaded with `map_location`
    on a GPU has every tensor there, these too."""
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if device.type == "cuda" and cuda is not None:
        if isinstance(cuda, list | tuple):  # older checkpoints: every visible GPU's, by index
            index = device.index or 0
            if index >= len(cuda):
                return
            cuda = cuda[index]
        torch.cuda.set_rng_state(cuda.cpu(), device)
    elif device.type == "mps" and state.get("mps") is not None:
        torch.mps.set_rng_state(state["mps"].cpu())
