"""The one training loop every strategy runs: batches in, timed steps, evaluation, checkpoints,
resume and the run record. A strategy changes only the Exchange it hands in."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import torch

from dlscale.atomic import write_json_atomic
from dlscale.data import build_data
from dlscale.jobspec import Spec
from dlscale.models import build_model, count_parameters
from dlscale.train import checkpoint as ckpt
from dlscale.train.allocator import keep_freed_memory
from dlscale.train.batches import StreamSampler, train_batches, val_batches
from dlscale.train.device import check_precision, reset_peak_memory, resolve_device, synchronize
from dlscale.train.env import environment
from dlscale.train.exchange import Exchange
from dlscale.train.faults import Faults
from dlscale.train.history import History, epoch_record
from dlscale.train.metrics import StepTiming
from dlscale.train.ownership import claim_token
from dlscale.train.plan import Plan, check_model_fits_data, check_trainable
from dlscale.train.record import RUN_RECORD, RunRecord
from dlscale.train.reporter import NullReporter, Reporter
from dlscale.train.sampler import GlobalBatchSampler
from dlscale.train.spec_change import check_resumable
from dlscale.train.step import TrainStep, build_optimizer
from dlscale.train.summary import final_figures, worker_summary

PROGRESS_EVERY_S = 0.1  # how often the reporter hears about steps; per-step calls cost time


# Between mid-epoch checkpoints the record is rewritten at most this often: a checkpoint every
# step would otherwise rewrite it every step. A run stopped short has it brought up to its
# newest checkpoint by the parent (faults.record_end).
RECORD_EVERY_S = 10.0


class Trainer:
    """Runs one spec on one device: the single strategy, and each trainer of parallel ones."""

    def __init__(
        self,
        spec: Spec,
        run_dir: Path,
        reporter: Reporter | None = None,
        exchange: Exchange | None = None,
        device: torch.device | None = None,
        early_warnings: Sequence[str] = (),
    ):
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.exchange = exchange or Exchange()
        self.is_main = self.exchange.is_main  # reports, evaluates and writes files
        self.reporter = reporter or NullReporter()
        write = self._write_record if self.is_main else None
        self.faults = Faults(spec.model.name, self.run_dir, self.exchange.rank, write)
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.t_start = time.perf_counter()
        self.device = device or resolve_device(spec.device)
        check_precision(spec.precision, self.device)
        if self.device.type == "cpu" and spec.keep_freed_memory:
            keep_freed_memory()  # no page faults a step for large tensors (train/allocator.py)
        torch.manual_seed(spec.seed)
        self.data = build_data(spec.data, spec.seed, stage=True, run=claim_token(self.run_dir))
        whole = build_model(spec.model.name, spec.model.kwargs, self.data.model_defaults())
        check_model_fits_data(whole, self.data, spec.model.name)
        check_trainable(whole, spec.model.name)
        self.parameters = (count_parameters(whole), count_parameters(whole, trainable_only=True))
        self.module = self.exchange.prepare(whole, self.data, self.device)  # what is trained here
        del whole
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        # A pipeline stage of pooling or reshaping layers trains nothing; torch's optimizers
        # refuse an empty list, so it steps one empty tensor that never gets a gradient.
        trainable = trainable or [torch.nn.Parameter(torch.zeros(0, device=self.device))]
        self.optimizer = build_optimizer(self.exchange.param_groups(trainable), spec.optimizer)
        self.exchange.connect(self.module, self.optimizer)
        self.model = self.exchange.model or self.module  # what the step calls
        if self.exchange.trainers > 1:
            torch.manual_seed(spec.seed + 1 + self.exchange.seed_rank)  # dropout per trainer
        self.step_fn = TrainStep(
            self.model, self.optimizer, self.device, spec.precision, self.exchange, spec.accumulate
        )
        world = self.exchange.data_world
        self.plan = Plan.of(spec, self.data.num_train, world)
        # A loader batch is a whole optimizer step's samples (its K micro-batches): steps,
        # epochs, checkpoints and resume stay at optimizer-step boundaries.
        step_batch = self.plan.step_batch_size
        if self.data.streamed:  # the stream yields each rank's batches itself
            self.sampler = StreamSampler(
                self.data.train, step_batch, self.exchange.data_rank, world
            )
        else:
            self.sampler = GlobalBatchSampler(
                self.data.num_train,
                step_batch,
                spec.seed,
                self.exchange.data_rank,
                world,
                as_lists=spec.loader.workers > 0 or not self.data.in_memory,
            )
        self.train_loader = train_batches(spec, self.data.train, self.sampler, self.device)
        self.val_loader = val_batches(spec, self.data.val)
        self.step = 0
        self.resumed_from: int | None = None
        self.history = History.new(self.plan.total_steps)
        # What the caller said before the run (the machine check, checkpoints a resume skipped)
        # leads the record's warnings; the trainer's own follow, and it says only those.
        self.early_warnings = list(early_warnings)
        self.warnings: list[str] = list(spec.warnings())
        if spec.loader.pin_memory and self.device.type != "cuda":
            self.warnings.append(f"loader.pin_memory is ignored on {self.device.type}")
        self.worker_info: dict = {}  # set by a launcher: where this trainer runs
        self.first_step_at: float | None = None
        # The epoch's training losses so far, summed in step order, and how many.
        self._epoch_loss: tuple[float, int] = (0.0, 0)
        self._record_at = 0.0  # when the record was last written (perf_counter)
        self.finished = False
        self.summaries: list[dict | None] | None = None  # every trainer's, once training ends
        self.environment = environment(self.device)
        self.setup_s = time.perf_counter() - self.t_start

    # ------------------------------------------------------------------ resume

    def resume(self, path: Path) -> None:
        """Continue from a checkpoint of the same spec: weights, optimizer, RNG, history."""
        state = ckpt.load_checkpoint(path, map_location=self.device)
        check_resumable(state, path, self.spec, self.run_dir)
        rank = self.exchange.rank
        self.exchange.load_model(self.module, state["model"])
        self.exchange.load_optimizer(self.optimizer, state["optimizer"])
        if self.step_fn.scaler is not None and state.get("scaler"):
            self.step_fn.scaler.load_state_dict(state["scaler"])
        step = self.exchange.resume_step(int(state["step"]))
        saved = state["history"] if self.is_main or self.exchange.lockstep else None
        self.history = History.from_state(saved, self.plan.total_steps, step)
        self.step = self.resumed_from = step
        self.started_at = state.get("started_at", self.started_at)  # when the run first began
        if step % self.plan.steps_per_epoch and step == int(state["step"]):
            saved = state.get("epoch_loss") or (0.0, 0)
            self._epoch_loss = (float(saved[0]), int(saved[1]))
        if step == 0:  # a ps job stopped before its servers saved an update: say so, not silence
            self.warnings.append(
                f"--resume: {self.run_dir} holds no trained step (every saved state is the "
                "starting one); training starts over at step 0"
            )
        if self.exchange.holds_trainer_state:
            saved_trainers = state.get("trainers") or []
            self.exchange.load_trainer_state(
                saved_trainers[rank] if rank < len(saved_trainers) else None
            )
        rngs = state["rng"]
        if rank < len(rngs) and step == int(state["step"]):
            ckpt.restore_rng(rngs[rank], self.device)
        else:  # no stream saved for this trainer at this step (a ps worker): a fresh one
            torch.manual_seed(self.spec.seed + 1 + self.exchange.seed_rank + 1_000_003 * step)

    def save_checkpoint(self) -> Path | None:
        """Every trainer calls it (the exchange may gather their parts); the main one writes."""
        exchange = self.exchange
        # First: finishing work in flight (a 2bw stage's backwards) moves no weight and no
        # random stream, but what it finishes belongs in this checkpoint.
        trainers = None
        if exchange.holds_trainer_state:
            trainers = exchange.gather(exchange.trainer_state())
        model = exchange.full_state(self.module.state_dict())
        optimizer = exchange.optimizer_state(self.optimizer)
        rngs = exchange.gather(ckpt.rng_state(self.device))
        if not self.is_main:
            return None
        self.faults.check_weights(model, self.step)
        state = {
            "spec_hash": self.spec.spec_hash(),
            "strategy": self.spec.strategy.name,
            "model": model,
            "optimizer": optimizer,
            "scaler": self.step_fn.scaler.state_dict() if self.step_fn.scaler else None,
            "rng": rngs,
            "history": self.history.to_state(),
            "exchange": exchange.extra_state(),
            "trainers": trainers,
            "data_position": self.data_position(),
            "model_source": self.model_source(),
            "started_at": self.started_at,
            # mid-epoch: the epoch's losses so far (its train_loss is their mean at its end)
            "epoch_loss": list(self._epoch_loss)
            if self.step % self.plan.steps_per_epoch
            else [0.0, 0],
        }
        return ckpt.save_checkpoint(self.run_dir, self.step, state, self.spec.checkpoint.keep_last)

    def model_source(self) -> dict:
        """What rebuilds this model and its inputs from a checkpoint alone (`dlscale predict`
        on a checkpoint copied away from its run.json): the spec and the data's layout."""
        data = self.data
        return {
            "spec": self.spec.model_dump(mode="json"),
            "data": {
                "input_shape": list(data.input_shape),
                "num_classes": data.num_classes,
                "task": data.task,
                "vocab_size": data.vocab_size,
            },
        }

    def data_position(self) -> dict:
        """Where training stands in the data: the epoch, the batch within it and, for a stream,
        the file and sample this trainer reads next (a resume starts there)."""
        epoch, batch = divmod(self.step, self.plan.steps_per_epoch)
        where = {"epoch": epoch, "batch": batch}
        if isinstance(self.sampler, StreamSampler):
            where.update(
                self.data.train.position(
                    epoch,
                    batch,
                    self.plan.step_batch_size,
                    self.exchange.data_rank,
                    self.exchange.data_world,
                )
            )
        return where

    # -------------------------------------------------------------------- loop

    def run(self) -> dict | None:
        """Train to the planned step count; the run record on the main trainer (also written to
        run.json), None on the others."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        reset_peak_memory(self.device)
        self.reporter.start(self.describe())
        for message in self.warnings:
            self.reporter.warn(message)
        self.exchange.start()
        if self.is_main:  # a run stopped before its first checkpoint still has its record
            self._write_record("running")
        total = self.plan.total_steps
        last_saved = last_eval = self.step if self.resumed_from is not None else -1
        while self.step < total:
            epoch = self.step // self.plan.steps_per_epoch
            epoch_done = self.run_epoch(epoch)
            if self.step == total:
                self._finish()
            if epoch_done or self.step == total:
                self.end_epoch(epoch)
                self.save_checkpoint()
                last_eval = last_saved = self.step
            if self.is_main:
                self._write_record("running")
        self._finish()
        if last_eval != self.step:  # resumed at the end: still validate
            self.end_epoch(max(0, (self.step - 1) // self.plan.steps_per_epoch))
        if last_saved != self.step:
            self.save_checkpoint()
        if not self.is_main:
            return None
        record = self._write_record("completed")
        self.reporter.finish(record)
        return record

    def run_epoch(self, epoch: int) -> bool:
        """Steps until the epoch or the plan ends; True if the epoch's last batch was run."""
        start_batch = self.step - epoch * self.plan.steps_per_epoch
        self.sampler.set_epoch(epoch, start_batch)
        every = self.spec.checkpoint.every_steps
        non_blocking = getattr(self.train_loader, "pin_memory", False)
        overlaps = self.exchange.comm_overlaps
        timing, steps_log = self.history.timing, self.history.steps
        # Resumed mid-epoch: the losses of the epoch's steps before the checkpoint come with it,
        # so the epoch's train_loss is the mean over all its steps.
        if not start_batch:
            self._epoch_loss = (0.0, 0)
        last_report = 0.0
        t_prev = time.perf_counter()  # a step's data wait starts where the last one's ended
        for batch in self.train_loader:
            t_data = time.perf_counter()
            x, y = batch[0], batch[1]
            if len(batch) > 2:  # read from disk: what reading and decoding it took
                timing.add_io(batch[2])
            comm_s, comm_bytes = self.exchange.comm_totals()
            x = x.to(self.device, non_blocking=non_blocking)
            y = y.to(self.device, non_blocking=non_blocking)
            synchronize(self.device)
            t_copy = time.perf_counter()
            loss = self.faults.user_code(self.step + 1, "", self.step_fn, x, y)
            loss = None if loss is None else float(loss)  # .item() waits: compute is timed
            t_end = time.perf_counter()
            self.step += 1
            self.faults.check_loss(loss, self.step)
            if self.first_step_at is None:
                self.first_step_at = time.time()  # wall clock: comparable across processes
            comm_after, bytes_after = self.exchange.comm_totals()
            waited = 0.0 if overlaps else comm_after - comm_s
            split = StepTiming.between(t_prev, t_data, t_copy, t_end, waited)
            timing.add(split, y.shape[0])
            timing.add_comm(comm_after - comm_s, bytes_after - comm_bytes)
            if loss is not None:
                total, count = self._epoch_loss
                self._epoch_loss = (total + loss, count + 1)
            if steps_log.wants(self.step):
                steps_log.records.append(self._step_record(epoch, loss, split))
            if t_end - last_report >= PROGRESS_EVERY_S and loss is not None:
                last_report = t_end
                rate = y.shape[0] * self.exchange.data_world / split.step_s
                self.reporter.step(self.step, epoch + 1, loss, rate)
                self._check_starving()
            t_prev = t_end
            if every and self.step % every == 0 and self.step % self.plan.steps_per_epoch:
                t_save = time.perf_counter()
                self.save_checkpoint()
                if self.is_main and t_save - self._record_at >= RECORD_EVERY_S:
                    self._write_record("running")  # a stop short refreshes it (record_end)
                t_prev += time.perf_counter() - t_save  # checkpoint time is not training time
            if self.step >= self.plan.total_steps:
                break
        self._check_starving()
        return self.step % self.plan.steps_per_epoch == 0

    def _finish(self) -> None:
        """Training is over for this trainer: the exchange settles (a ps worker tells the
        servers and the main one takes the final weights) and summaries are collected."""
        if not self.finished:
            self.finished = True
            self.summaries = self.exchange.finish(self.worker_summary())

    def _step_record(self, epoch: int, loss: float | None, split: StepTiming) -> dict:
        return {
            "step": self.step,
            "epoch": epoch + 1,
            "loss": loss,
            **asdict(split),
            "step_s": split.step_s,
        }

    def worker_summary(self) -> dict:
        """This trainer's own figures, gathered into run.json's `workers`."""
        return {
            **worker_summary(self.exchange, self.history.timing, self.device, self.worker_info),
            **self.exchange.worker_extras(),
        }

    def _check_starving(self) -> None:
        if not self.is_main:
            return
        staged = getattr(self.spec.data, "stage", None) is not None
        advice = self.history.starving_advice(self.spec.loader, self.device.type, staged)
        if advice:
            self.warnings.append(advice)
            self.reporter.warn(advice)

    def end_epoch(self, epoch: int) -> None:
        """Validate (every trainer calls it: a pipeline evaluates through all its stages)."""
        # The bare module: DDP's forward would wait for the other workers, which do not evaluate.
        validation = self.faults.user_code(
            self.step,
            " (evaluating)",
            self.exchange.evaluate,
            self.module,
            self.val_loader,
            self.device,
            self.spec.precision,
        )
        if not self.is_main:
            return
        record = epoch_record(
            epoch, self.step, self._epoch_loss, validation, self.history.timing, self.t_start
        )
        self.history.epochs.append(record)
        self.reporter.epoch_end(record)

    # ------------------------------------------------------------------ record

    def describe(self) -> dict:
        """What is about to run: the facts a person checks before waiting for a result."""
        return {
            "name": self.spec.name,
            "model": self.spec.model.name,
            "parameters": self.parameters[0],
            "device": str(self.device),
            "precision": self.spec.precision,
            "train_samples": self.data.num_train,
            "val_samples": len(self.data.val),
            "start_step": self.step,
            "resumed": self.resumed_from is not None,
            **({"data_position": self.data_position()} if self.resumed_from else {}),
            "workers": self.exchange.trainers,
            "strategy": self.spec.strategy.name,
            **self.plan.__dict__,
            **self.exchange.describe(),
        }

    def _write_record(self, status: str, error: str | None = None) -> dict:
        # While training, only this trainer's figures are at hand: the others are taken to keep
        # its pace (they do, in lockstep) until the end brings everyone's.
        summaries = self.summaries or [self.worker_summary()]
        peers = 1 if self.summaries else self.exchange.data_world
        spec, data = self.spec, self.data
        record = RunRecord(
            status=status,
            error=error,
            name=spec.name,
            strategy=spec.strategy.name,
            run_dir=str(self.run_dir),
            spec_hash=spec.spec_hash(),
            spec=spec.model_dump(mode="json"),
            started_at=self.started_at,
            updated_at=datetime.now(UTC).isoformat(timespec="seconds"),
            resumed_from_step=self.resumed_from,
            environment=self.environment,
            model={
                "name": spec.model.name,
                "parameters": self.parameters[0],
                "trainable_parameters": self.parameters[1],
            },
            data={
                "train_samples": data.num_train,
                "val_samples": len(data.val),
                "input_shape": list(data.input_shape),
                "num_classes": data.num_classes,
                "task": data.task,
                "vocab_size": data.vocab_size,
                "source": spec.data.name,
                "read_from_disk": not data.in_memory,
                "streamed": data.streamed,
                **({"staging": data.staging} if data.staging else {}),
            },
            plan=dict(self.plan.__dict__),
            timing=self.history.timing.summary(),
            epochs=self.history.epochs,
            steps=self.history.steps.records,
            warnings=[*self.early_warnings, *self.warnings],
            checkpoints=[str(p) for _, p in ckpt.list_checkpoints(self.run_dir)],
            final=final_figures(
                summaries,
                self.history.epochs[-1] if self.history.epochs else {},
                self.step,
                (time.perf_counter() - self.t_start, self.setup_s, self.first_step_at),
                self.device,
                peers,
            ),
            workers=[
                s if s is not None else {"rank": r, "status": "died"}
                for r, s in enumerate(summaries)
            ],
            **self.exchange.sections(summaries),
        ).to_json()
        with ckpt.naming_intact(self.run_dir):
            write_json_atomic(self.run_dir / RUN_RECORD, record)
        self._record_at = time.perf_counter()
        return record
