"""The job sandbox: the bubblewrap command a job (or its validation) runs under.

A sandboxed process has its own mount, PID, IPC, UTS and network namespaces (a network of its own
loopback only: a multi-process job's workers still meet there, and nothing else is reachable:
not the server's port, not another host). It sees the system's programs and libraries and the
Python that runs dlscale, all read-only, a few files of /etc, a private /tmp, and its own job
folder: read-write for a job (its inputs, spec and job.json read-only), read-only for a
validation. Nothing else of the server's data directory exists for it: no database, no secret,
no other job. When the server runs as root the process runs as an unprivileged uid of its own
(setpriv, after bubblewrap has built the mounts), with no capabilities and no way to gain any;
otherwise bubblewrap's user namespace keeps the server's own (unprivileged) uid.

This module only builds command lines (pure functions over paths); starting, limiting and
watching the processes is the executor's (service/executor.py), the kernel limits cgroups.py's.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

BWRAP = "bwrap"
SETPRIV = "/usr/bin/setpriv"
# What a process needs of /etc: the dynamic linker's cache, users and groups (getpwuid), name
# service, time zone and certificates. Not shadow, not the machine's other configuration.
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "localtime",
    "timezone",
    "ssl/certs",
    "ca-certificates",
    "alternatives",
    "mime.types",
    "os-release",
)
# The system's programs and libraries, as this machine lays them out (merged /usr: links).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Read-only facts a job's libraries look up: the CPUs and NUMA nodes (cache sizes, topology).
SYS_DIRS = ("/sys/devices/system/cpu", "/sys/devices/system/node")
TMP_BYTES = 1 << 30  # the private /tmp (counted in the job's memory too: tmpfs is memory)
# Variables a job may be handed from the server's environment; all others are left behind
# (the server's environment may hold secrets: tokens, database passwords, cloud keys).
PASSED_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "LANG", "TZ")


@dataclass(frozen=True)
class Box:
    """One sandboxed process: its folder, how it may touch it, who it runs as, what it sees."""

    folder: Path
    writable: bool  # a job writes its folder (but for read_only); a validation writes nothing
    uid: int | None  # setpriv to this uid and gid (a root server); None: keep bubblewrap's
    gpus: bool = False  # the NVIDIA device files, for a job holding GPU slots
    environment: dict[str, str] = field(default_factory=dict)
    read_only: tuple[str, ...] = ()  # names in the folder a writable job may still only read


def python_roots() -> list[Path]:
    """The folders the interpreter, its standard library, its packages and dlscale live in,
    including folders a .pth file adds (an editable install) — read the way `site` reads them,
    without running the lines of a .pth that are code."""
    found = [Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix)]
    found.append(Path(__file__).resolve().parents[2])  # the folder dlscale is installed in
    packages = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        packages.append(site.getusersitepackages())
    for folder in packages:
        found.append(Path(folder))
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.endswith(".pth"):
                found += _pth_folders(Path(folder) / name)
    return _outermost([p.resolve() for p in found if p.is_dir()])


def _pth_folders(path: Path) -> list[Path]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", "import ", "import\t")):
            continue
        folder = Path(line) if os.path.isabs(line) else path.parent / line
        if folder.is_dir():
            folders.append(folder)
    return folders


def _outermost(paths: list[Path]) -> list[Path]:
    """The paths with every one inside another dropped, shortest first."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p.parts), str(p))):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def _parents(paths: list[Path]) -> list[Path]:
    """Every ancestor folder of `paths` (but /), outermost first: bubblewrap would make them
    0700 and root's, which an unprivileged uid could not walk through."""
    parents = {parent for path in paths for parent in path.parents if parent != Path("/")}
    return sorted(parents, key=lambda p: (len(p.parts), str(p)))


def _system(root: Path) -> tuple[list[str], list[Path]]:
    """The read-only system binds, and the paths they make inside the sandbox."""
    args: list[str] = []
    made: list[Path] = []
    for name in SYSTEM_DIRS:
        path = root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", str(root / "etc" / name), f"/etc/{name}"]
        made.append(Path("/etc") / name)
    for folder in SYS_DIRS:
        args += ["--ro-bind-try", folder, folder]
        made.append(Path(folder))
    return args, made


def _gpu_devices(dev: Path = Path("/dev")) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(dev) if n.startswith("nvidia"))
    except OSError:
        return []
    args = []
    for name in names:
        args += ["--dev-bind-try", str(dev / name), f"/dev/{name}"]
    return args


def environment(box: Box, source: dict[str, str] | None = None) -> dict[str, str]:
    """The variables the sandboxed process starts with: its own, a few passed on, no others."""
    source = os.environ if source is None else source
    env = {key: source[key] for key in PASSED_ENVIRONMENT if key in source}
    python_bin = str(Path(sys.executable).parent)
    env.update(
        PATH=f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        HOME="/tmp/home",
        TMPDIR="/tmp",
        DLSCALE_HOME="/tmp/dlscale",
        MPLCONFIGDIR="/tmp/matplotlib",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        # Nothing is downloaded at run time; say so to the libraries that would try.
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.setdefault("LANG", "C.UTF-8")
    env.update(box.environment)
    return env


def command(box: Box, argv: list[str], info_fd: int, root: Path = Path("/")) -> list[str]:
    """The bubblewrap command that runs `argv` in `box` (cwd: its folder). bubblewrap writes
    the sandbox's pid (its init, in this namespace) as JSON to file descriptor `info_fd`."""
    folder = box.folder
    pythons = python_roots()
    system, made = _system(root)
    args = [
        BWRAP,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "dlscale-job",
        "--new-session",  # no terminal to push keystrokes into (TIOCSTI)
        "--info-fd",
        str(info_fd),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(TMP_BYTES),
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
    ]
    for parent in _parents([*made, *pythons, folder]):
        if parent not in (Path("/tmp"), Path("/dev"), Path("/proc")):
            args += ["--perms", "0755", "--dir", str(parent)]
    args += system
    if box.gpus:
        args += _gpu_devices(root / "dev")
    for path in pythons:
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind" if box.writable else "--ro-bind", str(folder), str(folder)]
    if box.writable:
        for name in box.read_only:
            args += ["--ro-bind-try", str(folder / name), str(folder / name)]
    args += ["--chdir", str(folder), "--clearenv"]
    for key, value in sorted(environment(box).items()):
        args += ["--setenv", key, value]
    if box.uid is not None:
        args += ["--", SETPRIV, f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups"]
        args += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        return [*args, *argv]
    return [*args, "--", *argv]


def missing_tools() -> list[str]:
    """The programs the sandbox needs that this machine lacks."""
    needed = [BWRAP] + ([SETPRIV] if os.geteuid() == 0 else [])
    return [name for name in needed if shutil.which(name) is None]
