"""The container engine (podman, else docker) and the flags restricted hosts need, in one place:
`make image` (docker/build.sh asks `python -m dlscale.service.container flags`), the container
executor and the container tests all run containers through these.

Quirks found on the development machine (podman 4.3, cgroups v1, no registry):
- the container's own open-file and process limits must be given, no higher than the host's
  hard limits: runc fails "error setting rlimit type 7 (nofile) / 6 (nproc): operation not
  permitted" otherwise, and a process limit above 32,768 failed here even below the host's;
- podman runs with runc (`--runtime runc`), the runtime present on Debian's podman.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from dlscale import __version__
from dlscale.errors import UserError
from dlscale.service.executor import Executor, lock_held

IMAGE = f"dlscale:{__version__}"
MAX_NPROC = 32_768


def engine() -> str:
    """podman, else docker, as found on PATH (DLSCALE_CONTAINER_ENGINE picks one)."""
    asked = os.environ.get("DLSCALE_CONTAINER_ENGINE")
    for name in [asked] if asked else ["podman", "docker"]:
        found = shutil.which(name)
        if found:
            return found
    raise UserError(
        "no container engine: install podman (apt-get install podman) or docker"
        + (f"; DLSCALE_CONTAINER_ENGINE names '{asked}', which is not on PATH" if asked else "")
    )


def _limit(kind: int, ceiling: int) -> int:
    hard = resource.getrlimit(kind)[1]
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


def flags(path: str | None = None) -> list[str]:
    """What every `run` and `build` of this engine needs on a restricted host."""
    name = os.path.basename(path or engine())
    if name != "podman":
        return []
    nofile = _limit(resource.RLIMIT_NOFILE, 1 << 20)
    nproc = _limit(resource.RLIMIT_NPROC, MAX_NPROC)
    found = ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
    if shutil.which("runc"):
        found = ["--runtime", "runc", *found]
    return found


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ContainerExecutor(Executor):
    """Each job in dlscale's image: no network, its own folder the only one mounted (at the same
    path, read-write), run as the server's user, and limited to the CPU slots it holds and the
    same share of this machine's memory where the host's cgroups allow limits (checked once:
    without them, jobs run unlimited and the server says so). A job's lock, pid and result are
    files in its folder, as with the process executor, so probing is the same; a cancel is a
    SIGINT to the container's processes through the engine."""

    def __init__(self, image: str, machine_cpus: int | None = None):
        super().__init__()
        self.image = image
        self.engine = engine()
        self.flags = flags(self.engine)
        self.machine_cpus = machine_cpus or (os.cpu_count() or 1)
        self._check_image()
        self.limits = self._limits_allowed()
        if not self.limits:
            print(f"dlscale serve: {self.engine} cannot limit a container's CPUs and memory "
                  "on this host (its cgroups allow no limits): jobs run unlimited",
                  flush=True)  # fmt: skip

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.engine, "run", "--rm", *self.flags, *args], capture_output=True,
                              text=True, timeout=timeout, check=False)  # fmt: skip

    def _check_image(self) -> None:
        found = subprocess.run([self.engine, "image", "inspect", self.image], capture_output=True,
                               text=True, check=False)  # fmt: skip
        if found.returncode != 0:
            raise UserError(f"--executor container: image {self.image} is not in {self.engine}'s "
                            "store; build it with `make image`")  # fmt: skip

    def _limits_allowed(self) -> bool:
        return self._run("--cpus", "1", "--memory", "256m", self.image, "true").returncode == 0

    @staticmethod
    def name(job_dir: Path) -> str:
        return f"dlscale-job-{Path(job_dir).name}"

    def command(self, job_dir: Path, cpus: int) -> list[str]:
        job_dir = Path(job_dir).resolve()
        limits = []
        if self.limits:
            memory = physical_memory_bytes() * min(cpus, self.machine_cpus) // self.machine_cpus
            limits = ["--cpus", str(cpus), "--memory", str(memory)]
        return [
            self.engine, "run", "--rm", "--name", self.name(job_dir), "--network", "none",
            *self.flags, *limits, "--user", f"{os.getuid()}:{os.getgid()}",
            "--volume", f"{job_dir}:{job_dir}:rw", "--workdir", str(job_dir),
            "--env", "PYTHONUNBUFFERED=1", "--env", f"DLSCALE_HOME={job_dir}/.dlscale",
            self.image, "python3", "-P", "-m", "dlscale.service.runner", str(job_dir),
        ]  # fmt: skip

    def cancel(self, job_dir: Path) -> bool:
        """SIGINT to the job's processes in its container (a pid in its folder is the
        container's own numbering, not this host's)."""
        if not lock_held(Path(job_dir)):
            return False
        sent = subprocess.run([self.engine, "kill", "--signal", "INT", self.name(job_dir)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        return sent.returncode == 0


if __name__ == "__main__":  # `python -m dlscale.service.container flags`: for docker/build.sh
    if sys.argv[1:] != ["flags"]:
        raise SystemExit("usage: python -m dlscale.service.container flags")
    print(" ".join(flags()))
