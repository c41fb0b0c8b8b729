"""Kernel limits for one job: a cgroup of its own under the server's, in each controller it
needs, so that neither a job's threads, its child processes nor its allocations pass the slots it
was given; what the job ran into (peak memory, out-of-memory kills, tasks refused) is read back
when it ends, and the cgroup removed.

cgroup v1 (a hierarchy per controller, found in /proc/self/mountinfo) and v2 (one unified
hierarchy) are both handled. Each job's cgroup is made beneath the server's own, so whatever
confines the server (a systemd unit, a container) confines its jobs too. On v2 the server's own
cgroup must hand the controllers down; the kernel allows that only to a cgroup with no processes
of its own, so the server moves itself into a leaf beside its jobs first (what container
runtimes do on a delegated subtree).

A job process enters its cgroup before it execs anything: `cgroupfs.enter_command` prefixes its
command with a shell that writes its own pid into each cgroup.procs, so no thread or child is
ever outside. The cgroup files themselves are read and written with dlscale/cgroupfs.py.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from dlscale import cgroupfs

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


class CgroupsUnavailable(Exception):
    """Why this server cannot give its jobs kernel limits (one line)."""


@dataclass(frozen=True)
class Limits:
    """What one job may use, enforced by the kernel."""

    cpus: int  # whole cores of CPU time (a quota, however many threads it runs)
    memory_bytes: int  # resident memory, its tmpfs files included; no swap beyond it
    pids: int  # tasks at once: processes and threads

    def __post_init__(self):
        assert self.cpus >= 1 and self.memory_bytes > 0 and self.pids >= 1, self


@dataclass(frozen=True)
class Usage:
    """What a job ran into, read from its cgroup when it ended."""

    peak_memory_bytes: int | None
    oom_kills: int  # processes the kernel killed at the memory limit
    tasks_refused: int  # forks and threads refused at the pids limit
    cpu_throttled_s: float  # time its tasks were held back at its CPU quota

    def as_dict(self) -> dict:
        return {
            "peak_memory_bytes": self.peak_memory_bytes,
            "oom_kills": self.oom_kills,
            "tasks_refused": self.tasks_refused,
            "cpu_throttled_s": self.cpu_throttled_s,
        }


@dataclass(frozen=True)
class Hierarchy:
    """Where this server's own cgroups are: v1, a folder per controller; v2, one folder."""

    version: int
    own: dict[str, Path]  # controller -> the server's own cgroup folder in it

    def folders(self, name: str) -> dict[str, Path]:
        """controller -> the folder of the child cgroup `name`."""
        return {controller: parent / name for controller, parent in self.own.items()}


def detect(proc: Path = Path("/proc/self")) -> Hierarchy:
    """This server's place in the cgroup hierarchies, or CgroupsUnavailable saying why it
    cannot make limited cgroups for its jobs there."""
    try:
        mounts = cgroupfs.mounts((proc / "mountinfo").read_text())
        own = cgroupfs.own_paths((proc / "cgroup").read_text())
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot read {proc}/cgroup: {exc.strerror}") from None
    v1 = {}
    for controller in CONTROLLERS:
        mount = next((m for m in mounts if m[2] == "cgroup" and controller in m[3]), None)
        if mount is not None and controller in own:
            v1[controller] = cgroupfs.inside(mount[1], mount[0], own[controller])
    if len(v1) == len(CONTROLLERS):
        hierarchy = Hierarchy(1, v1)
    else:
        unified = next((m for m in mounts if m[2] == "cgroup2"), None)
        if unified is None or "" not in own:
            missing = ", ".join(c for c in CONTROLLERS if c not in v1)
            raise CgroupsUnavailable(f"no cgroup hierarchy has the {missing} controller(s)")
        folder = cgroupfs.inside(unified[1], unified[0], own[""])
        hierarchy = Hierarchy(2, dict.fromkeys(CONTROLLERS, folder))
    _check_writable(hierarchy)
    return hierarchy


def _check_writable(hierarchy: Hierarchy) -> None:
    for controller, folder in hierarchy.own.items():
        if not os.access(folder, os.W_OK):
            raise CgroupsUnavailable(
                f"cgroup {folder} ({controller}) is not writable by this user: run the server "
                "as root, or in a cgroup delegated to it (systemd-run --user --scope -p "
                "Delegate=yes)"
            )
    if hierarchy.version == 2:
        _delegate_v2(next(iter(hierarchy.own.values())))


def _delegate_v2(own: Path) -> None:
    """Let `own`'s children have the memory, pids and cpu controllers. The kernel refuses that
    while `own` holds processes, so this server's move into a leaf of their own first."""
    available = set((own / "cgroup.controllers").read_text().split())
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        raise CgroupsUnavailable(
            f"cgroup {own} lacks the {', '.join(missing)} controller(s) (not delegated to it)"
        )
    enabled = set((own / "cgroup.subtree_control").read_text().split())
    if set(CONTROLLERS) <= enabled:
        return
    leaf = own / "dlscale-server"
    leaf.mkdir(exist_ok=True)
    for pid in (own / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError, OSError):  # gone meanwhile
            (leaf / "cgroup.procs").write_text(pid)
    try:
        (own / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as exc:
        raise CgroupsUnavailable(
            f"cgroup {own}: cannot enable {', '.join(CONTROLLERS)} for its children "
            f"({exc.strerror})"
        ) from None


class JobCgroup:
    """One job's cgroup, named after it, in every controller of `hierarchy`."""

    def __init__(self, hierarchy: Hierarchy, name: str):
        assert "/" not in name and name not in ("", ".", ".."), name
        self.hierarchy = hierarchy
        self.name = name
        self.folders = hierarchy.folders(name)

    def create(self, limits: Limits) -> None:
        """Make the cgroup (again: a stale one of a crashed server is emptied and reused)."""
        for folder in set(self.folders.values()):
            folder.mkdir(exist_ok=True)
        memory, pids, cpu = (self.folders[c] for c in CONTROLLERS)
        quota_us = limits.cpus * CPU_PERIOD_US
        if self.hierarchy.version == 1:
            # No swap beyond the memory limit (memsw exists where swap is accounted). The kernel
            # keeps memory <= memory+swap at every write: raising both, memsw goes first.
            try:
                _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
            except OSError:
                _write(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes)
                _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
            _write(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes, optional=True)
            _write(pids / "pids.max", limits.pids)
            _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(cpu / "cpu.cfs_quota_us", quota_us)
        else:
            _write(memory / "memory.max", limits.memory_bytes)
            _write(memory / "memory.swap.max", 0, optional=True)
            _write(pids / "pids.max", limits.pids)
            _write(cpu / "cpu.max", f"{quota_us} {CPU_PERIOD_US}")

    def procs_files(self) -> list[str]:
        """The cgroup.procs files a process writes its pid to, to enter this cgroup."""
        return [str(folder / "cgroup.procs") for folder in sorted(set(self.folders.values()))]

    def pids(self) -> list[int]:
        return cgroupfs.pids(self.folders.values())

    def usage(self) -> Usage:
        memory, pids, cpu = (self.folders[c] for c in CONTROLLERS)
        if self.hierarchy.version == 1:
            peak = cgroupfs.read_int(memory / "memory.max_usage_in_bytes")
            oom = cgroupfs.read_key(memory / "memory.oom_control", "oom_kill")
            throttled_s = (cgroupfs.read_key(cpu / "cpu.stat", "throttled_time") or 0) / 1e9
        else:
            peak = cgroupfs.read_int(memory / "memory.peak")
            oom = cgroupfs.read_key(memory / "memory.events", "oom_kill")
            throttled_s = (cgroupfs.read_key(cpu / "cpu.stat", "throttled_usec") or 0) / 1e6
        refused = cgroupfs.read_key(pids / "pids.events", "max") or 0
        return Usage(peak, oom or 0, refused, throttled_s)

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (a job that outlived its end, or a timeout)."""
        cgroupfs.kill(self.folders.values())

    def remove(self) -> None:
        """Kill what is left and remove the cgroup; a cgroup that will not go is left to the
        next removal of the same job (rmdir fails while a task is still exiting)."""
        cgroupfs.remove(self.folders.values())


def _write(path: Path, value, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise
