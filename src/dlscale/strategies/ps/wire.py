"""How servers and workers talk: request headers over torch.distributed point-to-point, the
data plane the tensors take (/dev/shm buffers on one host, gloo sends between hosts), and the
store keys that carry small records (summaries, statistics)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch

from dlscale.launch.base import WorkerContext

# Requests. PUSH_PULL: apply the gradients, then send back the parameters. FINISH: the main
# worker's last request, answered once every live worker is done, with the final parameters.
PULL, PUSH, AVERAGE, DONE, PUSH_PULL, FINISH = 1, 2, 3, 4, 5, 6
HEADER_FIELDS = 4  # op, version (or round), steps in the push, the worker's step count
SHM_DIR = Path("/dev/shm")


def header(op: int, version: int = 0, steps: int = 0, worker_step: int = 0) -> torch.Tensor:
    return torch.tensor([op, version, steps, worker_step], dtype=torch.int64)


def reply(version: int) -> torch.Tensor:
    """A server's answer: the shard's version (the rest unused)."""
    return torch.tensor([version, 0, 0, 0], dtype=torch.int64)


def empty_header() -> torch.Tensor:
    return torch.zeros(HEADER_FIELDS, dtype=torch.int64)


# ------------------------------------------------------------------------------------ data plane


def slot_path(token: str, worker: int, server: int, kind: str) -> Path:
    """The /dev/shm file behind one worker's `kind` ('params' or 'grads') buffer for one shard."""
    return SHM_DIR / f"dlscale-{token}-w{worker}-s{server}-{kind}"


def map_shared(path: Path, elements: int) -> torch.Tensor:
    """A float32 tensor backed by `path` (created if missing) that every process mapping it sees."""
    return torch.from_file(str(path), shared=True, size=elements, dtype=torch.float32)


def host_id() -> str:
    """This machine: host name and boot id (two containers may share a host name)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return socket.gethostname() + (":" + boot.read_text().strip() if boot.exists() else "")


def choose_data_plane(asked: str, hosts: int, needed_bytes: int) -> tuple[str, str | None]:
    """'shm' or 'gloo' for a job whose processes run on `hosts` machines, and why not the one
    asked for, if it cannot be had. Shared memory needs one host and room in /dev/shm."""
    if asked == "gloo":
        return "gloo", None
    why = None
    if hosts > 1:
        why = f"the processes run on {hosts} hosts"
    elif not SHM_DIR.is_dir():
        why = f"{SHM_DIR} does not exist here"
    else:
        stat = os.statvfs(SHM_DIR)
        free = stat.f_bavail * stat.f_frsize
        if needed_bytes > free // 2:  # leave the rest to everything else that uses it
            why = (
                f"{SHM_DIR} has {free / 2**20:,.0f} MiB free and the buffers need "
                f"{needed_bytes / 2**20:,.0f} MiB"
            )
    if why is None:
        return "shm", None
    if asked == "shm":
        return "gloo", f"data_plane shm is not possible ({why}); using gloo"
    return "gloo", None


def agree_on_data_plane(store, context: WorkerContext, asked: str, needed_bytes: int) -> str:
    """Every rank says where it runs; rank 0 chooses the data plane and tells the others.

    Where it runs is the address its node joined the cluster with, where a launcher placed it
    (two Ray nodes are two hosts, even when they share a kernel), and the host's name and boot.
    """
    store.set(f"ps/host/{context.rank}", f"{context.address}/{host_id()}")
    if context.rank == 0:
        hosts = {store.get(f"ps/host/{rank}") for rank in range(context.world_size)}
        plane, why = choose_data_plane(asked, len(hosts), needed_bytes)
        if why:
            context.send("warn", why)
        store.set("ps/plane", plane)
    return store.get("ps/plane").decode()


# ------------------------------------------------------------------------------------ records


# Set by the main worker once it has read every record at the end; server 0, whose process
# hosts the store, waits for it before leaving (a slow link can make the reads outlast it).
GATHERED = "ps/gathered"


def put_record(store, key: str, record: dict) -> None:
    store.set(f"ps/{key}", json.dumps(record))


def get_record(store, key: str) -> dict:
    return json.loads(store.get(f"ps/{key}"))
