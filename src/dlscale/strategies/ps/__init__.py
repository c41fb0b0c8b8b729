"""Strategy `ps`: parameter servers (averaging, asynchronous SGD, Downpour SGD), sharded.

One process group of `servers + workers` ranks: ranks 0..S-1 are servers (`server.py`), each
holding one shard of the parameters (whole tensors, balanced by size: `layout.py`); the rest are
workers, each training on its own slice of every global batch through the one training loop
with a `PsExchange` (`exchange.py`). Requests are small header tensors over torch.distributed
point-to-point; parameters and gradients travel on the data plane (`wire.py`): buffers in
/dev/shm that a worker and a server both map when every process runs on one host, else gloo
sends. The update rules are pure functions (`rules.py`).

- averaging: each worker steps its own optimizer `local_steps` times, then sends its shard
  parameters to every server; a server waits for every live worker, takes the mean, and sends it
  back (synchronous parameter averaging).
- async / downpour: a worker pulls parameters (every step, or every `n_fetch`), computes
  gradients, and pushes them (every step, or their sum every `n_push`); the server applies each
  push at once with the spec's optimizer. The staleness of each update is recorded;
  `max_staleness` makes a worker that is that many pushes ahead of the slowest live worker wait.

Faults: workers send heartbeats through the process group's store; in async and downpour a
worker other than worker 0 that dies (or goes silent for `heartbeat_timeout_s`) after the
rendezvous is dropped and the others finish. Worker 0 evaluates and writes the record, so its
death stops the job like a server's; `--resume` continues from the servers' shards.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from dlscale.jobspec import PsStrategy, Spec, parse_spec
from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.strategies.parent import initial_model, launch, role_names
from dlscale.strategies.ps.exchange import PsExchange
from dlscale.strategies.ps.layout import flatten, shard_parameters
from dlscale.strategies.ps.server import ParameterServer, load_shard, shard_path
from dlscale.strategies.ps.wire import GATHERED, SHM_DIR, agree_on_data_plane
from dlscale.strategies.worker import join, ready, run_trainer
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import resolve_device
from dlscale.train.reporter import Reporter

PEER_DEATH_GRACE_S = 10.0


def serve(context: WorkerContext, payload: dict) -> dict:
    """A server rank: its shard, built before the process group (see PsExchange.connect)."""
    spec = parse_spec(payload["spec"])
    strategy: PsStrategy = spec.strategy
    torch.set_num_threads(spec.threads or 1)
    model, _ = initial_model(spec, run_dir=Path(payload["run_dir"]))
    indices = payload["shards"][context.rank]
    server = ParameterServer(
        spec,
        context.rank,
        list(model.parameters()),
        indices,
        Path(payload["run_dir"]),
        # from its shard, unless none was saved (then from the checkpoint, just below)
        payload["resume_from"] is not None
        and (payload["weights_from"] is None or payload["weights_from"]["shard_step"] is not None),
    )
    if payload["weights_from"] is not None:
        continue_from_checkpoint(server, model, indices, payload, context)
    del model
    server.where = {"host": context.host or socket.gethostname(), "address": context.address}
    join(context, "gloo", strategy.timeout_s)
    store = dist.distributed_c10d._get_default_store()
    needed = 2 * strategy.workers * sum(payload["shard_elements"]) * 4
    if agree_on_data_plane(store, context, strategy.data_plane, needed) == "shm":
        dist.barrier()  # every worker's buffers exist
        server.attach(payload["token"])
        dist.barrier()  # every server has mapped them
    ready(context)
    statistics = server.serve(store, lambda message: context.send("warn", message))
    if context.rank == 0:  # the store's host: the main worker may still be reading from it
        wait_for_gathered(store, strategy.timeout_s)
    if not server.dead:  # a dropped worker's receive thread may still be waiting: leave it be
        dist.destroy_process_group()
    return statistics


def continue_from_checkpoint(
    server: ParameterServer,
    model: torch.nn.Module,
    indices: list[int],
    payload: dict,
    context: WorkerContext,
) -> None:
    """An epoch checkpoint newer than the shards (see resume_points): its weights for this
    shard, every worker at its step; server 0 says so."""
    newer = payload["weights_from"]
    model.load_state_dict(ckpt.load_checkpoint(Path(newer["path"]))["model"])
    server.continue_from(flatten(list(model.parameters()), indices), payload["start_steps"])
    if newer["shard_step"] is None:  # a shard never saved: the checkpoint is where all begin
        missing = newer["missing"]
        saved = len(missing) < server.strategy.servers
        if context.rank == 0 and (newer["step"] > 0 or saved):
            context.send(
                "warn",
                f"--resume: server shard(s) {', '.join(map(str, missing))} were never saved: "
                f"every server starts from the checkpoint at step {newer['step']}, its "
                "optimizer state anew"
                + (" (the saved shards' progress set aside)" if saved else ""),
            )
        return
    if context.rank == 0:
        context.send(
            "warn",
            f"--resume: the checkpoint at step {newer['step']} is newer than the servers' saved "
            f"shards (step {newer['shard_step']}; they save every "
            f"{server.strategy.checkpoint_every_s:g} s): training continues from the checkpoint "
            f"at step {newer['step']}",
        )


def wait_for_gathered(store, timeout_s: float) -> None:
    """Until the main worker has read the final records (or it is gone, or `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if store.check([GATHERED]):
                return
        except Exception:
            return
        time.sleep(0.05)


def resume_points(
    spec: Spec, run_dir: Path, resume_from: Path
) -> tuple[dict[str, int], dict | None]:
    """Each worker's step to resume at, and the checkpoint the servers take their weights from
    (None: their shards). The shards hold each worker's step when they were last saved (every
    `checkpoint_every_s`); worker 0 saves a checkpoint at each epoch's end. A job killed between
    the two resumes from the newer: from an epoch checkpoint, every worker starts at its step."""
    strategy: PsStrategy = spec.strategy
    saved_step = int(ckpt.load_checkpoint(resume_from)["step"])
    missing = [s for s in range(strategy.servers) if not shard_path(run_dir, s).exists()]
    if missing:
        # Stopped while its processes started, before every server saved its shard: the
        # checkpoint (the starting one, at step 0) is where every worker and server begins.
        newer = {
            "path": str(resume_from),
            "step": saved_step,
            "shard_step": None,
            "missing": missing,
        }
        return dict.fromkeys(map(str, range(strategy.workers)), saved_step), newer
    states = [load_shard(run_dir, s, spec) for s in range(strategy.servers)]
    steps = {
        str(worker): min(
            int(s["worker_steps"].get(str(strategy.servers + worker), 0)) for s in states
        )
        for worker in range(strategy.workers)
    }
    if saved_step <= steps["0"]:
        return steps, None
    newer = {"path": str(resume_from), "step": saved_step, "shard_step": steps["0"]}
    return dict.fromkeys(steps, saved_step), newer


def ps_process(context: WorkerContext, payload: dict) -> dict | None:
    """Every rank of a ps job: servers first, then workers."""
    if context.rank < payload["servers"]:
        return serve(context, payload)
    torch.set_num_threads(1)
    try:
        return run_trainer(
            context, payload, lambda spec, device: PsExchange(spec, context, payload)
        )
    except RuntimeError:  # gloo reports a lost peer as a RuntimeError (DistError or not)
        # A server died under us: the launcher sees its exit, names it and stops the job within
        # a moment; a traceback from here would only bury that line. If it does not, fail.
        time.sleep(PEER_DEATH_GRACE_S)
        raise


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
    early_warnings: Sequence[str] = (),
) -> dict:
    """Start the servers and workers; worker 0's record, with the servers' section."""
    strategy: PsStrategy = spec.strategy
    model, _ = initial_model(spec, strategy.workers, run_dir)
    params = list(model.parameters())
    shards = shard_parameters([p.numel() for p in params], strategy.servers)
    start_steps: dict[str, int] = {}
    weights_from = None  # an epoch checkpoint newer than the servers' shards
    if resume_from is not None:
        start_steps, weights_from = resume_points(spec, run_dir, resume_from)
    else:  # the starting point: what a bare --resume finds before any shard is saved
        ckpt.save_checkpoint(
            run_dir,
            0,
            {
                "spec_hash": spec.spec_hash(),
                "strategy": "ps",
                "model": model.state_dict(),
                "optimizer": None,
                "scaler": None,
                "rng": [],
                "history": None,
                "exchange": {},
            },
            spec.checkpoint.keep_last,
        )
    token = uuid.uuid4().hex[:12]  # names this job's shared buffers
    extra = {
        "servers": strategy.servers,
        "shards": shards,
        "start_steps": start_steps,
        "shard_elements": [sum(params[i].numel() for i in shard) for shard in shards],
        "token": token,
        "weights_from": weights_from,
    }
    gpu = 1.0 if resolve_device(spec.device).type == "cuda" else 0.0
    cpus = float(spec.threads or 1)  # a Ray cluster reserves each process its threads' cores
    resources = [Resources(cpus=cpus)] * strategy.servers
    resources += [Resources(cpus=cpus, gpus=gpu)] * strategy.workers
    expendable = frozenset()
    if strategy.mode != "averaging":  # worker 0 writes the record: it is never expendable
        expendable = frozenset(range(strategy.servers + 1, strategy.processes))

    def name(rank: int) -> str:
        return f"server {rank}" if rank < strategy.servers else f"worker {rank - strategy.servers}"

    try:
        return launch(
            spec,
            run_dir,
            resume_from,
            reporter,
            launcher,
            ps_process,
            resources,
            strategy.servers,
            extra,
            expendable,
            lambda message: role_names(message, name),
            own_gpu=False,  # workers share GPUs: their tensors meet on the host
            early_warnings=early_warnings,
        )
    finally:  # a job stopped before the servers mapped the workers' buffers leaves their files
        for path in SHM_DIR.glob(f"dlscale-{token}-*") if SHM_DIR.is_dir() else ():
            path.unlink(missing_ok=True)
