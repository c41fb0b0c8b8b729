"""The kernel's cgroup file system, read and written: where the hierarchies are mounted, a
process's own cgroups in them, a command that enters cgroups before it runs, counters read back,
and cgroups emptied and removed. The service's job cgroups (service/cgroups.py) and the memory
wall's bench cgroup (bench/memory_cgroup.py) are both made with it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

REMOVE_TRIES = 50  # × 0.1 s: a killed task leaves its cgroup within milliseconds


def mounts(mountinfo: str) -> list[tuple[str, Path, str, set[str]]]:
    """(root, mount point, fstype, super options) of each cgroup mount in /proc/PID/mountinfo;
    a v1 mount's super options name its controllers."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        found.append((fields[3], Path(fields[4]), tail[0], set(tail[2].split(","))))
    return found


def own_paths(proc_cgroup: str) -> dict[str, str]:
    """controller -> a process's cgroup path, from /proc/PID/cgroup ("" keys the v2 hierarchy)."""
    paths = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def inside(mount: Path, root: str, path: str) -> Path:
    """The folder of cgroup `path` in a hierarchy mounted at `mount` whose root is `root`."""
    relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return mount if relative in ("", ".") else mount / relative


def enter_command(procs_files: list[str], command: list[str]) -> list[str]:
    """`command`, run by a shell that first moves itself into the given cgroups, then execs it:
    every process the command ever starts is born inside them, and every page it touches is
    charged there."""
    script = (
        'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; '
        'shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "dlscale-enter", *procs_files, "--", *command]


def read_int(path: Path) -> int | None:
    """A counter file's first number (memory.peak, memory.max_usage_in_bytes); None if absent."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_key(path: Path, key: str) -> int | None:
    """The value of `key` in a flat-keyed file such as memory.events ("oom_kill 2")."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def pids(folders: Iterable[Path]) -> list[int]:
    """The processes in the cgroups at `folders`."""
    found: set[int] = set()
    for folder in set(folders):
        with contextlib.suppress(OSError, ValueError):
            found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
    return sorted(found)


def kill(folders: Iterable[Path]) -> None:
    """SIGKILL every process in the cgroups at `folders`."""
    for pid in pids(folders):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def remove(folders: Iterable[Path]) -> None:
    """Kill what is left in the cgroups at `folders` and remove them; one that will not go is
    left to the next removal (rmdir fails while a task is still exiting)."""
    folders = set(folders)
    for _ in range(REMOVE_TRIES):
        kill(folders)
        left = []
        for folder in folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(folder)
        if not left:
            return
        time.sleep(0.1)
