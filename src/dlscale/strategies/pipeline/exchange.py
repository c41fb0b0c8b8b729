"""A pipeline stage's exchange: its part of the model, the schedule that runs forward and
backward over the microbatches, tied gradients summed across stages, and (hybrid) gradients
averaged with the same stage of the other replicas.

Rank = replica × S + stage. The last stage of replica 0 sees the loss: it is the main trainer
(reports, evaluates, writes). Every stage records the time it spends computing (forward and
backward of its microbatches); the rest of a schedule step is the bubble.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn

from dlscale.jobspec import PipelineStrategy, Spec
from dlscale.launch.base import WorkerContext
from dlscale.strategies.pipeline.p2p import DistTransport, exchange_shapes
from dlscale.strategies.pipeline.plan import microbatch_size, split_model, tied_groups
from dlscale.strategies.pipeline.section import pipeline_sections
from dlscale.strategies.pipeline.twobw import TwoBWStage
from dlscale.strategies.worker import average_gradients, backend_for, join
from dlscale.train.device import autocast
from dlscale.train.exchange import Exchange
from dlscale.train.score import IGNORED_TARGET, compute_loss, count_correct


def thread_progress_lock() -> None:
    """Give tqdm a thread lock before torch.fx's Interpreter, which opens a (disabled) tqdm bar
    on every stage call, makes tqdm create its default one: a multiprocessing lock, whose POSIX
    semaphore the resource tracker then reported as leaked when Ctrl-C ended the workers
    ("There appear to be 4 leaked semaphore objects", one a stage process of a 2 × 2 hybrid,
    found by trying it). No bar of a worker is ever shown, and no other process shares one.
    Without tqdm installed, torch uses a bar of its own that takes no lock."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def filled(x: torch.Tensor, y: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A training batch shortened by skipped samples (data.skip_bad), made whole again: the
    stages exchange microbatches of the shapes the first batch set (torch's PipelineStage), and
    a short one stopped the run. The rows added copy the batch's first ones; their targets are
    IGNORED_TARGET, which the loss leaves out."""
    short = batch - y.shape[0]
    if short <= 0 or y.shape[0] == 0:
        return x, y
    fill = torch.arange(short, device=y.device) % y.shape[0]
    ignored = torch.full_like(y[fill], IGNORED_TARGET)
    return torch.cat([x, x[fill]]), torch.cat([y, ignored])


class Autocast(nn.Module):
    """A stage's forward under the run's mixed precision (what autocast does for one process)."""

    def __init__(self, inner: nn.Module, device: torch.device, precision: str):
        super().__init__()
        self.inner, self.device, self.precision = inner, device, precision

    def forward(self, *args):
        with autocast(self.device, self.precision):
            return self.inner(*args)


class PipelineExchange(Exchange):
    optimizer_sharded = True  # each stage's optimizer holds its own parameters' state

    def __init__(self, spec: Spec, context: WorkerContext, payload: dict, device: torch.device):
        self.spec, self.context, self.payload, self.device = spec, context, payload, device
        strategy: PipelineStrategy = spec.strategy
        self.name, self.strategy = strategy.name, strategy
        self.stages, self.replicas = strategy.stages, strategy.replicas
        self.rank = context.rank
        self.trainers = self.stages * self.replicas
        self.replica, self.index = divmod(context.rank, self.stages)
        self.data_rank, self.data_world = self.replica, self.replicas
        self.first, self.last = self.index == 0, self.index == self.stages - 1
        self.main_rank = self.stages - 1
        self.forward_s = self.backward_s = self.schedule_s = self.sync_s = 0.0
        self.sent_bytes = 0
        self.scaler = None
        self.steps_run = 0  # training steps this process ran (the slot count's length)
        self.filled = False  # this step's batch was made whole (`filled`)
        self.twobw: TwoBWStage | None = None
        self.took = False  # 2bw: this step hands the optimizer a gradient

    # ---- setting up

    def prepare(self, model: nn.Module, data, device: torch.device) -> nn.Module:
        self.data = data
        example = data.example(microbatch_size(self.spec))[0]
        boundaries = self.payload["boundaries"]
        # torch.export bakes a module's mode into the graph (dropout's p, BatchNorm's batch
        # statistics), so evaluation runs a second trace of the stage, made in eval mode, whose
        # weights are refreshed from the trained ones before every evaluation.
        evaluating = split_model(copy.deepcopy(model).eval(), example, boundaries)
        self.eval_module = evaluating.get_stage_module(self.index).to(device)
        stage = split_model(model, example, boundaries).get_stage_module(self.index)
        # Each tied parameter: this stage's copies (maybe none) and its shape; every stage takes
        # part in summing their gradients.
        mine = dict(stage.named_parameters(remove_duplicate=False))
        everywhere = dict(model.named_parameters(remove_duplicate=False))
        self.tied = [
            ([mine[n] for n in group if n in mine], everywhere[min(group)].shape)
            for group in tied_groups(model)
        ]
        self.module = stage.to(device)
        return self.module

    def connect(self, module: nn.Module, optimizer) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        join(self.context, backend_for(self.device), self.strategy.timeout_s)
        thread_progress_lock()
        stages, replicas = self.stages, self.replicas
        # Every rank creates every group, in the same order (torch.distributed's rule).
        pipes = [dist.new_group([r * stages + s for s in range(stages)]) for r in range(replicas)]
        self.pipe_group = pipes[self.replica]
        self.replica_group = None
        if replicas > 1:
            same_stage = [
                dist.new_group([r * stages + s for r in range(replicas)]) for s in range(stages)
            ]
            self.replica_group = same_stage[self.index]
        micro = self.strategy.microbatches_run
        if self.strategy.schedule == "2bw":
            self.optimizer = optimizer
            self._connect_2bw(module, stages)
        else:
            stage = PipelineStage(
                self._autocast(module), self.index, stages, self.device, group=self.pipe_group
            )
            self._time_calls(stage)
            schedule = Schedule1F1B if self.strategy.schedule == "1f1b" else ScheduleGPipe
            self.schedule = schedule(stage, n_microbatches=micro, loss_fn=self._loss)
        evaluating = PipelineStage(
            self._autocast(self.eval_module), self.index, stages, self.device, group=self.pipe_group
        )
        self.eval_schedule = ScheduleGPipe(evaluating, n_microbatches=micro, loss_fn=compute_loss)

    def _connect_2bw(self, module: nn.Module, stages: int) -> None:
        """2bw runs its own schedule (twobw.py) over point-to-point sends on a group of its
        own, every replica's made by every rank in the same order."""
        groups = [
            dist.new_group([r * stages + s for s in range(stages)]) for r in range(self.replicas)
        ]
        base = self.replica * stages
        self.transport = DistTransport(
            groups[self.replica],
            None if self.first else base + self.index - 1,
            None if self.last else base + self.index + 1,
            self.device,
        )
        example = self.data.example(microbatch_size(self.spec))[0]
        in_meta, out_meta = exchange_shapes(module, example, self.transport, self.spec.precision)
        self.twobw = TwoBWStage(
            module,
            self.index,
            stages,
            self.strategy.microbatches_run,
            self.transport,
            in_meta,
            out_meta,
            self.device,
            self.spec.precision,
        )

    def _autocast(self, module: nn.Module) -> nn.Module:
        if self.spec.precision == "fp32":
            return module
        return Autocast(module, self.device, self.spec.precision)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.filled and bool((targets == IGNORED_TARGET).all()):
            loss = logits.float().sum() * 0.0  # a microbatch of filling only: nothing to learn
        else:
            loss = compute_loss(logits, targets)
        return self.scaler.scale(loss) if self.scaler is not None else loss  # fp16

    def _time_calls(self, stage) -> None:
        """Count the stage's compute (its forward and backward of each microbatch) and the
        bytes it sends to its neighbours."""

        def timed(call, total: str):
            def run(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    setattr(self, total, getattr(self, total) + time.perf_counter() - t0)

            return run

        stage.forward_one_chunk = timed(stage.forward_one_chunk, "forward_s")
        stage.backward_one_chunk = timed(stage.backward_one_chunk, "backward_s")

        def counted(get_ops):  # what this stage sends: activations forward, gradients back
            def run(*args, **kwargs):
                ops = get_ops(*args, **kwargs)
                self.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
                return ops

            return run

        stage.get_fwd_send_ops = counted(stage.get_fwd_send_ops)
        stage.get_bwd_send_ops = counted(stage.get_bwd_send_ops)

    # ---- the step

    def _run_schedule(self, x, y, losses: list, train: bool = True):
        run = self.schedule.step if train else self.eval_schedule.eval
        if self.first and self.last:
            return run(x, target=y, losses=losses)
        if self.first:
            return run(x)
        if self.last:
            return run(target=y, losses=losses)
        return run()

    def forward_backward(self, step, x: torch.Tensor, y: torch.Tensor):
        self.scaler, self.step = step.scaler, step
        self.steps_run += 1
        self.filled = y.shape[0] < self.spec.batch_size  # samples skipped (data.skip_bad)
        x, y = filled(x, y, self.spec.batch_size)
        t0 = time.perf_counter()
        losses: list[torch.Tensor] = []
        if self.twobw is not None:
            losses = self.twobw.step(x if self.first else None, y if self.last else None)
            self.took = self.twobw.take_gradient()  # the batch before's; none in step 0
        else:
            self._run_schedule(x, y, losses)
        self.schedule_s += time.perf_counter() - t0
        if not losses:
            return None
        loss = torch.stack(losses).detach().mean()
        return loss / self.scaler.get_scale() if self.scaler is not None else loss

    def after_backward(self, step) -> None:
        """Tied copies get the sum of their gradients; replicas average theirs."""
        if self.twobw is not None and not self.took:
            return  # 2bw's first step: no gradient yet (zeros would still decay the weights)
        t0 = time.perf_counter()
        for copies, shape in self.tied:
            total = torch.zeros(shape, device=self.device)
            for param in copies:
                if param.grad is not None:
                    total += param.grad
            dist.all_reduce(total, group=self.pipe_group)
            for param in copies:
                param.grad = total.clone()
        if self.replica_group is not None:
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
            average_gradients(grads, self.replica_group, self.replicas)
        self.sync_s += time.perf_counter() - t0

    def after_update(self, step) -> None:
        if self.twobw is not None and self.took:
            self.twobw.updated()

    def finish(self, summary: dict):
        """2bw: the backwards still in flight, and the last batch's update, before the record."""
        if self.twobw is not None and self.steps_run:
            t0 = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self.twobw.drain()
            self.took = self.twobw.take_gradient(drained=True)
            if self.took:
                self.after_backward(self.step)
                self.step.apply()
                self.twobw.updated()
            self.transport.flush()
            self.schedule_s += time.perf_counter() - t0
            summary = {**summary, **self.worker_extras()}
        return super().finish(summary)

    def agree_on_overflow(self, found_inf: list[torch.Tensor]) -> None:
        for flag in found_inf:  # every stage of every replica skips, or none does
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)

    def comm_totals(self) -> tuple[float, int]:
        sent = self.transport.sent_bytes if self.twobw is not None else 0
        return self.sync_s, self.sent_bytes + sent

    # ---- evaluation and state

    def evaluate(self, module: nn.Module, loader, device, precision: str):
        """Replica 0 evaluates through its pipeline's eval-mode stages (forward only, the
        loader's batches cut into training batches and the last one padded: the stages'
        buffers have that shape); its last stage scores it. Every stage reads the same loader
        (in memory, from disk or streamed), so all run the same number of batches."""
        if self.replica != 0:
            return None
        self.eval_module.load_state_dict(module.state_dict())
        batch = self.spec.batch_size
        total_loss, correct, seen, scored = 0.0, 0, 0, 0
        with torch.no_grad():
            for whole_x, whole_y, *_ in loader:
                for start in range(0, len(whole_y), batch):
                    x, y = whole_x[start : start + batch], whole_y[start : start + batch]
                    real = len(y)
                    # Pad to the whole batch with copies of its first rows (again and again
                    # when fewer than a batch are left); they are not scored.
                    fill = torch.arange(batch - real) % real
                    x, padded = torch.cat([x, x[fill]]), torch.cat([y, y[fill]])
                    output = self._run_schedule(x.to(device), padded.to(device), [], train=False)
                    if self.last:
                        logits, y = output[:real].float(), y.to(device)
                        total_loss += float(compute_loss(logits, y)) * real
                        right, count = count_correct(logits, y)
                        correct, seen, scored = correct + right, seen + count, scored + real
        if not self.last:
            return None
        return (total_loss / scored, correct / seen) if seen else (None, None)

    def full_state(self, state: dict) -> dict | None:
        """The stages' states merged (replica 0's: every replica holds the same weights)."""
        states = self.gather(state if self.replica == 0 else {})
        if not self.is_main:
            return None
        return {name: value for part in states for name, value in part.items()}

    def load_model(self, module: nn.Module, state: dict) -> None:
        module.load_state_dict({name: state[name] for name in module.state_dict()})

    def extra_state(self) -> dict:
        return {"boundaries": self.payload["boundaries"]}

    @property
    def holds_trainer_state(self) -> bool:
        return self.twobw is not None

    def trainer_state(self) -> dict:
        """2bw: the batch in flight finished, and its gradient, not yet applied."""
        assert self.twobw is not None
        return self.twobw.settle()

    def load_trainer_state(self, saved: dict | None) -> None:
        # A checkpoint without it (written before 2bw saved its batch in flight) resumes with
        # that batch's gradient lost: the pipeline fills again from the resumed step.
        if saved is not None and self.twobw is not None:
            self.twobw.restore(saved)

    # ---- the record

    def describe(self) -> dict:
        return {"pipeline": self.payload["split"]}

    def worker_extras(self) -> dict:
        forward_s, backward_s, sent = self.forward_s, self.backward_s, self.sent_bytes
        staleness = [0] * self.steps_run  # a flushing schedule applies each gradient at once
        if self.twobw is not None:
            forward_s, backward_s = self.twobw.forward_s, self.twobw.backward_s
            sent += self.transport.sent_bytes
            staleness = self.twobw.log.staleness
        busy = forward_s + backward_s
        return {
            "role": "stage",
            "replica": self.replica,
            "stage": self.index,
            "forward_s": forward_s,
            "backward_s": backward_s,
            "busy_s": busy,
            "schedule_s": self.schedule_s,
            "sync_s": self.sync_s,
            "sent_bytes": sent,
            "bubble": 1.0 - busy / self.schedule_s if self.schedule_s else 0.0,
            "steps_run": self.steps_run,
            "staleness": {str(k): v for k, v in sorted(Counter(staleness).items())},
        }

    def sections(self, summaries: list[dict | None]) -> dict[str, dict]:
        return pipeline_sections(self.strategy, self.payload["split"], summaries)
