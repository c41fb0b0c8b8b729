"""A bounded swap file for the memory-wall run: added only where the machine has too little
free swap for it, and swapped off and deleted when the run ends.

Past a cgroup's memory limit the kernel can only move a process's pages out to swap; with no
swap it kills the process instead, and the step time never shows the wall, only a cliff. The
file is named after the process that made it, so one left behind by a run that was killed
(SIGKILL skips every `finally`) is found by the next run and removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

PREFIX = "dlscale-width-swap-"
DISK_HEADROOM_BYTES = 2 * 2**30  # never fill a disk to add swap


class NoSwap(Exception):
    """Why no swap file could be added (one line)."""


def free_swap_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """SwapFree: swap space no process uses now."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("SwapFree:"):
            return int(line.split()[1]) * 1024
    return 0


def active_swap_files(swaps: Path = Path("/proc/swaps")) -> list[str]:
    """The paths /proc/swaps lists (its first line is a header)."""
    with contextlib.suppress(OSError):
        return [line.split()[0] for line in swaps.read_text().splitlines()[1:] if line.strip()]
    return []


def stale_swap_files(folder: Path) -> list[Path]:
    """Swap files of this bench in `folder` whose process is gone."""
    stale = []
    for path in sorted(folder.glob(f"{PREFIX}*")):
        pid = path.name.removeprefix(PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(path)
    return stale


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:  # not installed, or hung
        raise NoSwap(f"{argv[0]} failed: {error}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise NoSwap(f"{' '.join(argv[:1])} failed: {why[-1] if why else done.returncode}")


def _remove(path: Path, active: list[str]) -> None:
    if str(path) in active:
        _run(["swapoff", str(path)])
    path.unlink(missing_ok=True)


@contextlib.contextmanager
def bounded_swap(size_bytes: int, folder: Path) -> Iterator[Path | None]:
    """At least `size_bytes` of free swap while inside: the machine's own if it has that much
    (yields None), else a swap file of `size_bytes` in `folder` (yields its path), removed on
    the way out. NoSwap says why one could not be added (not root, no room, a file system
    that cannot hold swap)."""
    for path in stale_swap_files(folder):
        with contextlib.suppress(NoSwap, OSError):
            _remove(path, active_swap_files())
    if free_swap_bytes() >= size_bytes:
        yield None
        return
    try:
        room = shutil.disk_usage(folder).free - DISK_HEADROOM_BYTES
    except OSError as error:  # a --swap-dir that is missing or not a folder
        raise NoSwap(f"{folder}: {error.strerror}") from None
    if size_bytes > room:
        raise NoSwap(f"{folder} has {max(room, 0) // 2**20} MiB to spare for a swap file")
    path = folder / f"{PREFIX}{os.getpid()}"
    try:
        try:
            with open(path, "wb") as handle:
                os.fchmod(handle.fileno(), 0o600)  # swapon refuses a file others can read
                os.posix_fallocate(handle.fileno(), 0, size_bytes)  # no holes: swap needs blocks
        except OSError as error:  # a file system that cannot allocate it (or no permission)
            raise NoSwap(f"cannot make a swap file in {folder}: {error.strerror}") from None
        _run(["mkswap", str(path)])
        _run(["swapon", str(path)])
        yield path
    finally:
        with contextlib.suppress(NoSwap, OSError):
            _remove(path, active_swap_files())
