"""Strategies `pipeline` and `hybrid`: the model split into stages, one process each.

`pipeline`: S stages (torch.distributed.pipelining: `pipeline()` traces the model and cuts it
at the planned module boundaries; `PipelineStage` carries activations forward and gradients back
over torch.distributed point-to-point; `ScheduleGPipe` / `Schedule1F1B` order the microbatches).
`naive` is GPipe with one microbatch: the whole batch passes through one stage at a time.
`2bw` (PipeDream-2BW, twobw.py) is dlscale's own: 1F1B without a flush between steps over
point-to-point sends of its own (p2p.py), each batch's gradient applied one update late.

`hybrid`: D replicas of that pipeline (D × S processes, rank = replica × S + stage), each on its
share of every global batch; after backward, each stage averages its gradients with the same
stage of the other replicas.

Every stage runs the one training loop with a `PipelineExchange`, so devices (NCCL between
GPUs), bf16/fp16, checkpoints and resume come from the loop as for every strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlscale.jobspec import PipelineStrategy, Spec
from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.strategies.parent import initial_model, launch
from dlscale.strategies.pipeline.exchange import PipelineExchange
from dlscale.strategies.pipeline.plan import microbatch_size, plan_stages, split_model
from dlscale.strategies.worker import run_trainer
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import resolve_device
from dlscale.train.reporter import Reporter


def stage_process(context: WorkerContext, payload: dict) -> dict | None:
    return run_trainer(
        context, payload, lambda spec, device: PipelineExchange(spec, context, payload, device)
    )


def check(spec: Spec, meta_model, data) -> None:
    """What `run` refuses before any process starts, for `validate`: microbatches that do not
    divide the batch, no split that fits max_memory_per_worker (planned on the meta device).
    No model (its factory needs real tensors): tracing it to place the stages fails as `run`'s
    would (CannotTrace)."""
    plan_stages(spec, meta_model, data, spec.strategy.split)


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
    early_warnings: Sequence[str] = (),
) -> dict:
    """Plan the split, start S × D stage processes; the last stage of replica 0's record."""
    strategy: PipelineStrategy = spec.strategy
    model, data = initial_model(spec, strategy.replicas, run_dir)
    split = strategy.split
    if resume_from is not None:  # the split the run began with (a new calibration may differ)
        split = ckpt.load_checkpoint(resume_from).get("exchange", {}).get("boundaries", split)
    plan = plan_stages(spec, model, data, split)
    # Each stage process traces the model again; tracing it here first turns a model torch.export
    # cannot take into one line before any process starts.
    split_model(model, data.example(microbatch_size(spec))[0], plan.boundaries)
    gpu = 1.0 if resolve_device(spec.device).type == "cuda" else 0.0
    return launch(
        spec,
        run_dir,
        resume_from,
        reporter,
        launcher,
        stage_process,
        Resources(cpus=float(spec.threads or 1), gpus=gpu),
        main_rank=strategy.stages - 1,
        extra={"boundaries": plan.boundaries, "split": plan.to_dict()},
        early_warnings=early_warnings,
    )
