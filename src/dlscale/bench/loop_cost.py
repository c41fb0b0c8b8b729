"""The fixed cost of one step of dlscale's own training loop on this machine, beyond its ops.

A step of the loop (`Trainer.run_epoch`) does more than the model's forward, backward and update:
the sampler hands out a batch and it is gathered, the batch is copied to the device, the step's
timers and records are kept, the loss is read back and checked, progress events go out. None of
that is an op of the model, so the per-op model does not price it; on a small model it is most
of the step. It is measured on a model so small that its compute and bytes are negligible, as
the loop's step less a bare training step (zero_grad, forward, loss, backward, Adam, the loss
read back: what the per-op cost is measured on and prices) of the same model, optimizer and
batch, timed in the same round so that a machine whose speed drifts cancels out.

The same way, what torch's DistributedDataParallel adds to that bare step, as dlscale's ddp
wraps every worker's model at any worker count (its forward's bookkeeping, the reducer's
autograd hooks, a bucket's copies and the comm hook's one-process all-reduce), in a process of
its own that joins a one-process gloo group (`measure_ddp_cost`).
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dlscale.jobspec import parse_spec
from dlscale.launch.base import Resources, WorkerContext
from dlscale.launch.local import LocalLauncher
from dlscale.profiler.calibrate import ROUNDS, settle_allocator, stable_median
from dlscale.train.ddp_hook import AllreduceTimer, wrap
from dlscale.train.device import synchronize
from dlscale.train.loop import Trainer
from dlscale.train.score import compute_loss

# Eight values a sample, four hidden layers of eight, ten classes, batch 4: about 700 parameters,
# so each op's compute and bytes are nanoseconds and the step is its ops' fixed costs.
LOOP_INPUT = 8
LOOP_HIDDEN = (8, 8, 8, 8)
LOOP_CLASSES = 10
LOOP_BATCH = 4
# Steps an epoch: its start (the sampler's shuffle, a new iterator) is paid once per epoch, as in
# training, and shared among them.
LOOP_EPOCH_STEPS = 50


def _spec(device: torch.device, steps: int):
    """One epoch of `steps` batches of the probe's model on synthetic data."""
    return parse_spec(
        {
            "name": "bench-loop-cost",
            "model": {"name": "mlp", "kwargs": {"hidden": list(LOOP_HIDDEN)}},
            "data": {
                "name": "synthetic",
                "shape": [LOOP_INPUT],
                "num_classes": LOOP_CLASSES,
                # Room for the validation split the reader keeps aside.
                "num_samples": 2 * LOOP_BATCH * steps,
            },
            "batch_size": LOOP_BATCH,
            "epochs": 1,
            "device": str(device),
        }
    )


def loop_step_cost(rounds: list[tuple[float, float]]) -> float:
    """The loop's own cost per step from (bare step s, loop step s) pairs, each pair timed in one
    round: the median of their differences, never below zero (a loop step timed faster than the
    bare one is noise, not a negative cost)."""
    return max(0.0, statistics.median(loop - bare for bare, loop in rounds))


def _timed_round(run, calls_per_run: int, min_time_s: float) -> float:
    """Seconds per call of `run()` (which makes `calls_per_run` calls), run at least once and
    for at least `min_time_s`."""
    runs, start = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - start < min_time_s:
        run()
        runs += 1
    return (time.perf_counter() - start) / (runs * calls_per_run)


def bare_steps(model, optimizer, x, y, steps: int, device: torch.device) -> None:
    """`steps` bare training steps (zero_grad, forward, loss, backward, update, the loss read
    back: what the per-op cost is measured on and prices), the device synchronised after."""
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = compute_loss(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
    synchronize(device)


def loop_rounds(device: torch.device, min_time_s: float) -> list[tuple[float, float]]:
    """(bare step s, loop step s) of the probe's model in each of the last ROUNDS rounds; rounds
    repeat until the loop's steps agree (calibrate.stable_median, spread logged)."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(_spec(device, LOOP_EPOCH_STEPS), Path(scratch))
        steps = trainer.plan.steps_per_epoch
        x, y, *_ = next(iter(trainer.train_loader))
        x, y = x.to(device), y.to(device)
        model, optimizer = trainer.model, trainer.optimizer

        def epoch() -> None:
            trainer.step = 0
            trainer.run_epoch(0)

        def bare() -> None:
            bare_steps(model, optimizer, x, y, steps, device)

        pairs: list[tuple[float, float]] = []

        def one_round() -> float:
            bare_s = _timed_round(bare, steps, min_time_s / (2 * ROUNDS))
            loop_s = _timed_round(epoch, steps, min_time_s / (2 * ROUNDS))
            pairs.append((bare_s, loop_s))
            return loop_s

        settle_allocator()
        epoch()  # warm-up: first calls, allocator, caches
        bare()
        stable_median(one_round)
        return pairs[-ROUNDS:]


def measure_loop_cost(device: torch.device, min_time_s: float) -> dict:
    """The loop's fixed cost per step, with the figures it came from."""
    rounds = loop_rounds(device, min_time_s)
    return {
        "loop_step_s": loop_step_cost(rounds),
        "bare_step_s": statistics.median(bare for bare, _ in rounds),
        "probe_step_s": statistics.median(loop for _, loop in rounds),
        "probe_batch": LOOP_BATCH,
    }


def ddp_rounds(device: torch.device, min_time_s: float) -> tuple[list[tuple[float, float]], int]:
    """(bare step s, DDP step s) of the probe's model in each of the last ROUNDS rounds, and
    how many parameter tensors it has; in a process that has joined a gloo group.

    The bare step is `loop_rounds`' one; the DDP step is the same on a copy of the model
    wrapped as a ddp worker wraps it (ddp_hook.wrap: DistributedDataParallel, dlscale's comm
    hook, gradients as bucket views), with an optimizer of the same kind and settings. Rounds
    alternate the two, so that a machine whose speed drifts cancels out."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(_spec(device, LOOP_EPOCH_STEPS), Path(scratch))
        x, y, *_ = next(iter(trainer.train_loader))
        x, y = x.to(device), y.to(device)
        twin = copy.deepcopy(trainer.model)
        wrapped = wrap(twin, AllreduceTimer(dist.get_world_size()))
        optimizer = trainer.optimizer
        twin_optimizer = type(optimizer)(twin.parameters(), **optimizer.defaults)
        pairs = [(trainer.model, optimizer), (wrapped, twin_optimizer)]

        def steps(model, optimizer) -> None:
            bare_steps(model, optimizer, x, y, LOOP_EPOCH_STEPS, device)

        found: list[tuple[float, float]] = []

        def one_round() -> float:
            bare, ddp = (
                _timed_round(
                    lambda pair=pair: steps(*pair), LOOP_EPOCH_STEPS, min_time_s / (2 * ROUNDS)
                )
                for pair in pairs
            )
            found.append((bare, ddp))
            return ddp

        try:
            settle_allocator()
            for pair in pairs:  # warm-up: first calls, allocator, DDP's first-step bucketing
                steps(*pair)
            stable_median(one_round)
        finally:
            # Released before the group goes down (strategies/ddp.py DdpExchange.close says why).
            wrapped.reducer = None
        tensors = sum(1 for p in twin.parameters() if p.requires_grad)
        return found[-ROUNDS:], tensors


def ddp_cost_worker(context: WorkerContext, payload: dict) -> dict:
    """The DDP probe's one process: a launcher's worker, its threads and core set as a ddp
    worker's are, in a gloo group of one."""
    dist.init_process_group("gloo", rank=context.rank, world_size=context.world_size)
    try:
        rounds, tensors = ddp_rounds(torch.device("cpu"), payload["min_time_s"])
    finally:
        dist.destroy_process_group()
    return {
        "ddp_step_s": loop_step_cost(rounds),
        "ddp_bare_step_s": statistics.median(bare for bare, _ in rounds),
        "ddp_probe_step_s": statistics.median(ddp for _, ddp in rounds),
        "ddp_probe_tensors": tensors,
        "ddp_bucket_view": True,  # measured as workers run now (an op a tensor, none back)
    }


def measure_ddp_cost(min_time_s: float) -> dict:
    """What DDP adds to the probe's step on this machine's CPU, with the figures it came from:
    one process, started by the local launcher as a ddp worker is."""
    payload = {"min_time_s": min_time_s}
    (found,) = LocalLauncher().run(ddp_cost_worker, payload, 1, Resources(cpus=1.0))
    return found
