"""A memory-limited cgroup (v1 memory controller) for one bench child process: its limit, the
swap it may use beyond it, what it ran into, and its removal however the run ends.

The memory-wall run (`bench width --memory-limit`) makes a model's training state outgrow the
memory it may use on purpose. Done in the open, that would push the whole machine into swap or
its out-of-memory killer; inside a cgroup only the child is squeezed: past `limit_bytes` the
kernel reclaims the child's pages to swap (at most `swap_bytes` of it, where swap is accounted),
and past both it kills the child alone.

The service's jobs get their limits from service/cgroups.py (v1 and v2, memory, pids and cpu,
beneath the server's own cgroup); a bench needs one controller with a swap bound the jobs never
get, so this is that one controller, v1 only. Both read and write the cgroup file system with
dlscale/cgroupfs.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlscale import cgroupfs

PREFIX = "dlscale-width-"  # a bench's cgroups: PREFIX + its pid + "-" + the width measured


class NoMemoryCgroup(Exception):
    """Why no memory-limited cgroup can be made here (one line)."""


def memory_hierarchy(proc: Path = Path("/proc/self")) -> Path:
    """This process's own folder in the cgroup v1 memory hierarchy, where a child cgroup can be
    made; NoMemoryCgroup saying why not (no v1 memory controller, not writable: not root)."""
    try:
        mountinfo = (proc / "mountinfo").read_text()
        own = (proc / "cgroup").read_text()
    except OSError as error:
        raise NoMemoryCgroup(f"cannot read {proc}/cgroup: {error.strerror}") from None
    # A v1 mount (fstype "cgroup") whose super options name the memory controller.
    memory = [m for m in cgroupfs.mounts(mountinfo) if m[2] == "cgroup" and "memory" in m[3]]
    if not memory:
        raise NoMemoryCgroup("no cgroup v1 memory controller is mounted here")
    root, mount_point, _, _ = memory[-1]
    folder = cgroupfs.inside(mount_point, root, cgroupfs.own_paths(own).get("memory", "/"))
    if not os.access(folder, os.W_OK):
        raise NoMemoryCgroup(f"cgroup {folder} is not writable by this user (run as root)")
    return folder


@dataclass(frozen=True)
class MemoryUsage:
    """What the child ran into, read from its cgroup."""

    peak_bytes: int | None  # resident memory at its highest
    peak_with_swap_bytes: int | None  # resident memory plus swap at its highest
    oom_kills: int  # processes the kernel killed at the limit (memory and swap both full)

    def as_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_with_swap_bytes": self.peak_with_swap_bytes,
            "oom_kills": self.oom_kills,
        }


class MemoryCgroup:
    """One child cgroup in the memory hierarchy: made by `limited`, which removes it."""

    def __init__(self, folder: Path):
        self.folder = folder

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into this cgroup, then execs it: every
        page the command ever touches is charged here."""
        return cgroupfs.enter_command([str(self.folder / "cgroup.procs")], argv)

    def pids(self) -> list[int]:
        return cgroupfs.pids([self.folder])

    def usage(self) -> MemoryUsage:
        return MemoryUsage(
            cgroupfs.read_int(self.folder / "memory.max_usage_in_bytes"),
            cgroupfs.read_int(self.folder / "memory.memsw.max_usage_in_bytes"),
            cgroupfs.read_key(self.folder / "memory.oom_control", "oom_kill") or 0,
        )

    def remove(self) -> None:
        """Kill whatever is left in it and remove it (rmdir fails while a task is exiting)."""
        cgroupfs.remove([self.folder])


def remove_stale_cgroups(parent: Path) -> None:
    """Remove the cgroups under `parent` that a bench whose process is gone left behind (SIGKILL
    skips every `finally`), killing what still runs in them."""
    for folder in parent.glob(f"{PREFIX}*"):
        pid = folder.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            cgroupfs.remove([folder])


@contextlib.contextmanager
def limited(
    parent: Path, name: str, limit_bytes: int, swap_bytes: int
) -> Iterator[tuple[MemoryCgroup, bool]]:
    """A new cgroup `name` under `parent` holding at most `limit_bytes` in memory and
    `swap_bytes` more in swap; yields it and whether the swap bound is enforced (the kernel
    accounts swap only with swapaccount=1: else the swap space itself is the bound). Removed on
    the way out, whatever happened inside."""
    assert "/" not in name and limit_bytes > 0 and swap_bytes >= 0, (name, limit_bytes)
    group = MemoryCgroup(parent / name)
    group.remove()  # one of the same name left by a killed run (names carry the bench's pid)
    group.folder.mkdir()
    try:
        # memory+swap is never below memory: the memory limit goes first while memsw is unset.
        (group.folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
        memsw = group.folder / "memory.memsw.limit_in_bytes"
        bounded = memsw.exists()
        if bounded:
            memsw.write_text(str(limit_bytes + swap_bytes))
        yield group, bounded
    finally:
        group.remove()
