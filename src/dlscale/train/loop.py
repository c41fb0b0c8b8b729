"""The training loop: batches in, timed steps, evaluation, checkpoints, resume, the run record."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dlscale.data import DataBundle, build_data
from dlscale.errors import UserError, one_line
from dlscale.models import build_model, count_parameters
from dlscale.spec import Spec
from dlscale.train import checkpoint as ckpt
from dlscale.train import distributed
from dlscale.train.device import (
    check_precision,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from dlscale.train.env import environment
from dlscale.train.files import write_json_atomic
from dlscale.train.metrics import StepSampler, StepTiming, TimingTotals, starving_advice
from dlscale.train.record import run_record
from dlscale.train.reporter import NullReporter, Reporter
from dlscale.train.sampler import GlobalBatchSampler
from dlscale.train.step import TrainStep, build_optimizer, evaluate

PROGRESS_EVERY_S = 0.1  # how often the reporter hears about steps; per-step calls cost time


@dataclass
class Plan:
    """How long the run is, in steps and epochs, for this worker's share of the data."""

    steps_per_epoch: int
    total_steps: int
    epochs: int
    batch_size: int
    global_batch_size: int

    @classmethod
    def of(cls, spec: Spec, num_train: int, world_size: int = 1) -> Plan:
        global_batch = spec.batch_size * world_size
        steps_per_epoch = num_train // global_batch
        if steps_per_epoch == 0:
            raise UserError(
                f"batch_size {spec.batch_size}"
                + (f" × {world_size} workers" if world_size > 1 else "")
                + f" is larger than the training set ({num_train} samples)"
            )
        if spec.steps is not None:
            total = spec.steps
            epochs = math.ceil(total / steps_per_epoch)
        else:
            epochs = spec.epochs or 1
            total = epochs * steps_per_epoch
        return cls(steps_per_epoch, total, epochs, spec.batch_size, global_batch)


def epoch_record(
    epoch: int,
    step: int,
    losses: list[float],
    validation: tuple[float, float],
    timing: TimingTotals,
    t_start: float,
) -> dict:
    """One entry of run.json's `epochs`: where training stands after `epoch` (0-based)."""
    val_loss, val_acc = validation
    return {
        "epoch": epoch + 1,
        "step": step,
        "train_loss": sum(losses) / len(losses) if losses else None,
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "samples_per_s": timing.samples_per_s,
        "elapsed_s": time.perf_counter() - t_start,
    }


def check_model_fits_data(model: nn.Module, data: DataBundle, model_name: str) -> None:
    """One forward pass on one real sample, so a shape mismatch is one clear line, not a trace."""
    x = data.train.tensors[0][:1]
    try:
        with torch.no_grad():
            was_training = model.training
            model.eval()
            out = model(x)
            model.train(was_training)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        shape = tuple(data.input_shape)
        raise UserError(
            f"model '{model_name}' cannot take this data's samples of shape {shape}: "
            f"{one_line(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor):
        raise UserError(f"model '{model_name}' must return a tensor of logits, got {type(out)}")
    if out.shape[-1] < data.num_classes:
        raise UserError(
            f"model '{model_name}' outputs {out.shape[-1]} classes but the data has "
            f"{data.num_classes}; set model.kwargs.num_classes"
        )


class InProcessBatches:
    """The sampler's batches gathered in this process: what DataLoader does with no workers."""

    def __init__(self, dataset: TensorDataset, sampler: GlobalBatchSampler):
        self.dataset = dataset
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for index in self.sampler:
            yield self.dataset[index]

    def __len__(self) -> int:
        return len(self.sampler)


class Trainer:
    """Runs one spec on one device: the single strategy, and each worker of parallel ones."""

    def __init__(
        self,
        spec: Spec,
        run_dir: Path,
        reporter: Reporter | None = None,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
    ):
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.rank, self.world_size = rank, world_size
        self.is_main = rank == 0  # the one worker that reports, evaluates and writes files
        self.reporter = reporter or NullReporter()
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.t_start = time.perf_counter()
        self.device = device or resolve_device(spec.device)
        check_precision(spec.precision, self.device)
        torch.manual_seed(spec.seed)
        self.data = build_data(spec.data, spec.seed)
        self.module = build_model(spec.model.name, spec.model.kwargs, self.data.model_defaults())
        check_model_fits_data(self.module, self.data, spec.model.name)
        self.module.to(self.device)
        self.model, self.comm = self.module, None
        if world_size > 1:
            self.model, self.comm = distributed.wrap(self.module, self.device, world_size)
            torch.manual_seed(spec.seed + 1 + rank)  # dropout differs between workers
        self.optimizer = build_optimizer(self.module.parameters(), spec.optimizer)
        self.step_fn = TrainStep(self.model, self.optimizer, self.device, spec.precision)
        self.plan = Plan.of(spec, self.data.num_train, world_size)
        self.sampler = GlobalBatchSampler(
            self.data.num_train,
            spec.batch_size,
            spec.seed,
            rank=rank,
            world_size=world_size,
            as_lists=spec.loader.workers > 0,
        )
        self.train_loader = self._loader()
        self.val_loader = DataLoader(self.data.val, batch_size=max(256, spec.batch_size))
        self.step = 0
        self.resumed_from: int | None = None
        self.timing = TimingTotals()
        self.steps_log = StepSampler(self.plan.total_steps)
        self.epochs_log: list[dict] = []
        self.warnings: list[str] = list(spec.warnings())
        if spec.loader.pin_memory and self.device.type != "cuda":
            self.warnings.append(f"loader.pin_memory is ignored on {self.device.type}")
        self.starving_warned = False
        self.train_wall_s = 0.0
        self.workers: list[dict] = []
        self.worker_info: dict = {}  # set by a launcher: where this worker runs
        self.first_step_at: float | None = None
        self._epoch_losses: list[float] = []
        self.environment = environment(self.device)
        self.setup_s = time.perf_counter() - self.t_start

    def _loader(self) -> Iterable:
        """Batches are fetched whole (`dataset[index_tensor]`), never sample by sample.

        With no worker processes and no pinning, DataLoader has nothing to add and costs ~80 µs
        a step (benchmarks/loop_overhead.py), so the sampler's batches are gathered directly.
        """
        loader = self.spec.loader
        pin = loader.pin_memory and self.device.type == "cuda"
        if loader.workers == 0 and not pin:
            return InProcessBatches(self.data.train, self.sampler)
        extra = {}
        if loader.workers > 0:
            extra = {"persistent_workers": True, "prefetch_factor": loader.prefetch or 2}
        return DataLoader(
            self.data.train,
            sampler=self.sampler,
            batch_size=None,
            num_workers=loader.workers,
            pin_memory=pin,
            # Its own generator: creating an iterator must not draw from the global RNG.
            generator=torch.Generator().manual_seed(self.spec.seed),
            **extra,
        )

    # ------------------------------------------------------------------ resume

    def resume(self, path: Path) -> None:
        """Continue from a checkpoint of the same spec: weights, optimizer, RNG, history."""
        state = ckpt.load_checkpoint(path, map_location=self.device)
        if state.get("spec_hash") != self.spec.spec_hash():
            raise UserError(
                f"{path} was written by a different spec (hash {state.get('spec_hash')}, "
                f"this spec {self.spec.spec_hash()}); start a new run instead of --resume"
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.step_fn.scaler is not None and state.get("scaler"):
            self.step_fn.scaler.load_state_dict(state["scaler"])
        history = state["history"]
        self.epochs_log = list(history["epochs"])
        self.steps_log.records = list(history["steps"])
        self.timing = TimingTotals.from_state(history["timing"])
        self.train_wall_s = history["train_wall_s"]
        self.starving_warned = history["starving_warned"]
        self.step = self.resumed_from = int(state["step"])
        ckpt.restore_rng(state["rng"])
        if self.world_size > 1:  # the checkpoint holds rank 0's stream; give each its own
            torch.manual_seed(self.spec.seed + 1 + self.rank + 1_000_003 * self.step)

    def save_checkpoint(self) -> Path | None:
        if not self.is_main:
            return None
        state = {
            "spec_hash": self.spec.spec_hash(),
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.step_fn.scaler.state_dict() if self.step_fn.scaler else None,
            "rng": ckpt.rng_state(self.device),
            "history": {
                "epochs": self.epochs_log,
                "steps": self.steps_log.records,
                "timing": self.timing.to_state(),
                "train_wall_s": self.train_wall_s,
                "starving_warned": self.starving_warned,
            },
        }
        return ckpt.save_checkpoint(self.run_dir, self.step, state, self.spec.checkpoint.keep_last)

    # -------------------------------------------------------------------- loop

    def run(self) -> dict:
        """Train to the planned step count; returns (and writes) the run record."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        reset_peak_memory(self.device)
        self.reporter.start(self.describe())
        for message in self.warnings:
            self.reporter.warn(message)
        last_saved = last_eval = self.step if self.resumed_from is not None else -1
        while self.step < self.plan.total_steps:
            epoch = self.step // self.plan.steps_per_epoch
            epoch_done = self.run_epoch(epoch)
            if (epoch_done or self.step == self.plan.total_steps) and self.is_main:
                self._end_epoch(epoch)
                last_eval = self.step
                self.save_checkpoint()
                last_saved = self.step
            if self.is_main:
                self._write_record("running")
        if last_eval != self.step and self.is_main:  # resumed at the end: still validate
            self._end_epoch(max(0, (self.step - 1) // self.plan.steps_per_epoch))
        if last_saved != self.step:
            self.save_checkpoint()
        self.workers = distributed.gather(self.worker_summary(), self.world_size)
        record = self._write_record("completed")
        self.reporter.finish(record)
        return record

    def run_epoch(self, epoch: int) -> bool:
        """Steps until the epoch or the plan ends; True if the epoch's last batch was run."""
        start_batch = self.step - epoch * self.plan.steps_per_epoch
        self.sampler.set_epoch(epoch, start_batch)
        every = self.spec.checkpoint.every_steps
        non_blocking = getattr(self.train_loader, "pin_memory", False)
        epoch_losses: list[float] = []
        t_epoch = time.perf_counter()
        last_report = 0.0
        t_prev = time.perf_counter()
        for x, y in self.train_loader:
            t_data = time.perf_counter()
            comm_before = self.comm.totals() if self.comm else (0.0, 0)
            x = x.to(self.device, non_blocking=non_blocking)
            y = y.to(self.device, non_blocking=non_blocking)
            synchronize(self.device)
            t_copy = time.perf_counter()
            loss = float(self.step_fn(x, y))  # .item() waits for the device: compute is timed
            t_end = time.perf_counter()
            self.step += 1
            if self.first_step_at is None:
                self.first_step_at = time.time()  # wall clock: comparable across processes
            timing = StepTiming(t_data - t_prev, t_copy - t_data, t_end - t_copy)
            self.timing.add(timing, y.shape[0])
            if self.comm:  # DDP's backward returns once every bucket's allreduce is done
                seconds, payload = self.comm.totals()
                self.timing.add_comm(seconds - comm_before[0], payload - comm_before[1])
            epoch_losses.append(loss)
            if self.steps_log.wants(self.step):
                self.steps_log.records.append(self._step_record(epoch, loss, timing))
            if t_end - last_report >= PROGRESS_EVERY_S:
                last_report = t_end
                rate = y.shape[0] * self.world_size / timing.step_s
                self.reporter.step(self.step, epoch + 1, loss, rate)
                self._check_starving()
            if every and self.step % every == 0 and self.step % self.plan.steps_per_epoch:
                t_save = time.perf_counter()
                self.save_checkpoint()
                t_epoch += time.perf_counter() - t_save  # checkpoint time is not training time
            if self.step >= self.plan.total_steps:
                break
            t_prev = time.perf_counter()
        self.train_wall_s += time.perf_counter() - t_epoch
        self._epoch_losses = epoch_losses
        self._check_starving()
        return self.step % self.plan.steps_per_epoch == 0

    def _step_record(self, epoch: int, loss: float, timing: StepTiming) -> dict:
        return {
            "step": self.step,
            "epoch": epoch + 1,
            "loss": loss,
            "data_wait_s": timing.data_wait_s,
            "h2d_s": timing.h2d_s,
            "compute_s": timing.compute_s,
            "step_s": timing.step_s,
        }

    def worker_summary(self) -> dict:
        """This worker's own figures, gathered into run.json's `workers`."""
        return {
            "rank": self.rank,
            **self.worker_info,
            "steps": self.timing.steps,
            "samples": self.timing.samples,
            "samples_per_s": self.timing.samples / self.train_wall_s if self.train_wall_s else 0.0,
            **{k: v for k, v in self.timing.summary().items() if k.endswith(("_s", "_share"))},
        }

    def _check_starving(self) -> None:
        if self.starving_warned or not self.is_main:
            return
        loader = self.spec.loader
        advice = starving_advice(self.timing, loader.workers, loader.pin_memory, self.device.type)
        if advice:
            self.starving_warned = True
            self.warnings.append(advice)
            self.reporter.warn(advice)

    def _end_epoch(self, epoch: int) -> None:
        # The bare module: DDP's forward would wait for the other workers, which do not evaluate.
        val_loss, val_acc = evaluate(self.module, self.val_loader, self.device, self.spec.precision)
        record = epoch_record(
            epoch, self.step, self._epoch_losses, (val_loss, val_acc), self.timing, self.t_start
        )
        self.epochs_log.append(record)
        self.reporter.epoch_end(record)

    # ------------------------------------------------------------------ record

    def describe(self) -> dict:
        """What is about to run: the facts a person checks before waiting for a result."""
        params = count_parameters(self.module)
        return {
            "name": self.spec.name,
            "model": self.spec.model.name,
            "parameters": params,
            "device": str(self.device),
            "precision": self.spec.precision,
            "train_samples": self.data.num_train,
            "val_samples": len(self.data.val),
            "start_step": self.step,
            "workers": self.world_size,
            **self.plan.__dict__,
        }

    def _write_record(self, status: str) -> dict:
        record = run_record(self, status)
        if self.is_main:
            write_json_atomic(self.run_dir / "run.json", record)
        return record
