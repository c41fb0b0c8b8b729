"""The container engine (podman, else docker) and the flags restricted hosts need, in one place:
`make image` (docker/build.sh asks `python -m dlscale.service.container flags`), the container
executor (jobs in dlscale's image, confined as the process sandbox confines them) and the
container tests all run containers through these.

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
from dlscale.service.executor import Executor, JobLimits, lock_held
from dlscale.service.layout import READ_ONLY
from dlscale.service.sandbox import TMP_BYTES

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


class ContainerExecutor(Executor):
    """Each job, and each validation, in dlscale's image with the guarantees of the process
    sandbox: no network, no capabilities and no way to gain any, a read-only root with a private
    /tmp, its own folder the only one mounted (read-write for a job, but for its inputs, spec
    and job.json; read-only for a validation), an unprivileged uid of its own, and the kernel
    limits of its slots (CPUs, memory without swap, tasks). A host whose engine cannot apply
    limits is refused at start (unless --unsafe-single-user). A job's lock, result and log are
    files in its folder, as with the process executor, so probing is the same; a cancel is a
    SIGINT to the container's processes through the engine, a kill its SIGKILL."""

    def __init__(self, config, image: str):
        super().__init__(
            config.sandboxes_dir,
            None,
            sandboxed=False,
            validations_at_once=config.validations_at_once,
            validation_wait_s=config.validate_timeout_s,
            uid_of=config.job_uid,
        )
        self.image = image
        self.engine = engine()
        self.flags = flags(self.engine)
        self._check_image()
        self.limits = self._limits_allowed()
        if not self.limits and not config.unsafe_single_user:
            raise UserError(
                f"--executor container: {self.engine} cannot limit a container's CPUs, memory "
                "and tasks on this host (its cgroups allow no limits); only for one person "
                "serving their own jobs: --unsafe-single-user"
            )

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        command = [self.engine, "run", "--rm", *self.flags, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def _check_image(self) -> None:
        command = [self.engine, "image", "inspect", self.image]
        found = subprocess.run(command, capture_output=True, text=True, check=False)
        if found.returncode != 0:
            raise UserError(
                f"--executor container: image {self.image} is not in {self.engine}'s store; "
                "build it with `make image`"
            )

    def _limits_allowed(self) -> bool:
        limits = ("--cpus", "1", "--memory", "256m", "--pids-limit", "64")
        return self._run(*limits, self.image, "true").returncode == 0

    def check(self, uid: int | None) -> str | None:
        return None  # the image and the limits were tried when this executor was made

    @staticmethod
    def name(job_dir: Path) -> str:
        return f"dlscale-job-{Path(job_dir).name}"

    def container_command(
        self, folder: Path, name: str, writable: bool, limits: JobLimits, argv: list[str], cpus
    ) -> list[str]:
        """`podman run` (or docker's) of `argv` in the image, confined as the class says."""
        folder = Path(folder).resolve()
        confined = [
            "--hostname",
            "dlscale-job",
            "--network",
            "none",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--read-only",
            "--tmpfs",
            f"/tmp:rw,size={TMP_BYTES},mode=1777",
        ]
        if self.limits:
            memory = str(limits.memory_bytes)
            confined += ["--cpus", str(cpus or limits.cpus), "--memory", memory]
            confined += ["--memory-swap", memory, "--pids-limit", str(limits.pids)]
        user = limits.uid if limits.uid is not None else os.getuid()
        volumes = ["--volume", f"{folder}:{folder}:{'rw' if writable else 'ro'}"]
        if writable:
            for item in READ_ONLY:
                if (folder / item).exists():
                    volumes += ["--volume", f"{folder / item}:{folder / item}:ro"]
        env = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp/home", "DLSCALE_HOME": "/tmp/dlscale"}
        env.update(DLSCALE_CPUS=str(cpus or limits.cpus))
        env.update(DLSCALE_MEMORY_BYTES=str(limits.memory_bytes))
        environment = [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
        return [
            self.engine,
            "run",
            "--rm",
            "--interactive",  # a validator reads its go on stdin
            "--name",
            name,
            *self.flags,
            *confined,
            "--user",
            f"{user}:{user}",
            *volumes,
            "--workdir",
            str(folder),
            *environment,
            self.image,
            "python3",
            *argv[1:],
        ]

    def _wrap(self, folder, name, writable, limits, argv, cpus=None):
        return self.container_command(folder, name, writable, limits, argv, cpus), -1, -1

    def cancel(self, folder: Path, force: bool = False) -> bool:
        """SIGINT (or with `force` SIGKILL) to the job's processes in its container (a pid in
        its folder is the container's own numbering, not this host's)."""
        if not force and not lock_held(Path(folder)):
            return False
        signal_name = "KILL" if force else "INT"
        command = [self.engine, "kill", "--signal", signal_name, self.name(folder)]
        sent = subprocess.run(command, capture_output=True, text=True, check=False)
        return sent.returncode == 0

    def kill_validation(self, name: str, process: subprocess.Popen) -> None:
        command = [self.engine, "kill", "--signal", "KILL", name]
        subprocess.run(command, capture_output=True, text=True, check=False)
        super().kill_validation(name, process)


if __name__ == "__main__":  # `python -m dlscale.service.container flags`: for docker/build.sh
    if sys.argv[1:] != ["flags"]:
        raise SystemExit("usage: python -m dlscale.service.container flags")
    print(" ".join(flags()))
