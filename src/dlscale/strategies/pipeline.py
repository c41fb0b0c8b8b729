"""Strategies `pipeline` and `hybrid`: the model split into stages, one process each.

`pipeline`: S stages (torch.distributed.pipelining: `pipeline()` traces the model and cuts it
at the planned module boundaries; `PipelineStage` carries activations forward and gradients back
over torch.distributed point-to-point; `ScheduleGPipe` / `Schedule1F1B` order the microbatches).
`naive` is GPipe with one microbatch: the whole batch passes through one stage at a time.

`hybrid`: D replicas of that pipeline (D × S processes, rank = replica × S + stage), each on its
share of every global batch; after backward, each stage averages its gradients with the same
stage of the other replicas (allreduce over a process group of those D ranks).

Parameters shared between stages (GPT's tied embedding and output head: each stage holds a copy)
get the sum of every copy's gradient, so the copies stay equal, as the one tensor would be.
Every stage records the time it spends computing (forward and backward of its microbatches);
the rest of a schedule step is the pipeline bubble (waiting, and sending between stages).
"""

from __future__ import annotations

import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dlscale.errors import UserError, one_line
from dlscale.hardware.catalogue import load_catalogue
from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.models import build_model, count_parameters
from dlscale.profiler.split import SplitPlan, plan_split
from dlscale.profiler.trace import trace_step
from dlscale.spec import PipelineStrategy, Spec, parse_spec
from dlscale.strategies.events import EventReporter, default_launcher
from dlscale.strategies.parent import evaluate_and_save, require_cpu_fp32, warned_events
from dlscale.strategies.ps import build_ps_model
from dlscale.train.device import peak_memory
from dlscale.train.files import write_json_atomic
from dlscale.train.loop import InProcessBatches, Plan, epoch_record
from dlscale.train.metrics import StepTiming, TimingTotals
from dlscale.train.record import process_group_record
from dlscale.train.reporter import NullReporter, Reporter
from dlscale.train.sampler import GlobalBatchSampler
from dlscale.train.step import build_optimizer, compute_loss, count_correct


def predicted_bubble(stages: int, microbatches: int) -> float:
    """Idle share of a GPipe or 1F1B step: (S − 1) / (M + S − 1) (Huang et al., 2019)."""
    return (stages - 1) / (microbatches + stages - 1)


def microbatch_size(spec: Spec) -> int:
    strategy: PipelineStrategy = spec.strategy
    micro = strategy.microbatches_run
    if spec.batch_size % micro:
        raise UserError(
            f"batch_size {spec.batch_size} does not split into {micro} equal microbatches"
        )
    return spec.batch_size // micro


def plan_stages(spec: Spec, model: nn.Module, data) -> SplitPlan:
    """The split, from a step traced at one microbatch on the meta device: balanced by the time
    predicted on `local` when this machine was measured (`dlscale bench machine`), else FLOPs."""
    strategy: PipelineStrategy = spec.strategy
    micro = microbatch_size(spec)
    sample = data.train.tensors[0][0]
    try:
        trace = trace_step(
            lambda: build_model(spec.model.name, spec.model.kwargs, data.model_defaults()),
            sample, micro, "fp32",
            lambda params: build_optimizer(params, spec.optimizer), spec.optimizer.name,
        )  # fmt: skip
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise UserError(
            f"model '{spec.model.name}' cannot take samples of shape {tuple(sample.shape)}: "
            f"{one_line(exc)}"
        ) from None
    local = load_catalogue().get("local")
    return plan_split(
        model, trace, strategy.stages, strategy.schedule, strategy.microbatches_run,
        strategy.split, local, strategy.max_memory_per_worker,
    )  # fmt: skip


def split_model(model: nn.Module, example: torch.Tensor, boundaries: list[str]):
    """torch's pipeline frontend: trace `model` on one microbatch and cut it at `boundaries`."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    try:
        with warnings.catch_warnings():  # torch.export's deprecation chatter, not the user's
            warnings.simplefilter("ignore", FutureWarning)
            return pipeline(
                model, mb_args=(example,),
                split_spec=dict.fromkeys(boundaries, SplitPoint.BEGINNING),
            )  # fmt: skip
    except Exception as exc:  # torch.export's many error types: one line for the user
        message = f"the model cannot be split into pipeline stages: {one_line(exc)}"
        raise UserError(message) from None


def tied_groups(model: nn.Module) -> list[set[str]]:
    """Names that refer to one parameter (GPT's tied embedding and head)."""
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    return [set(names) for names in by_tensor.values() if len(names) > 1]


# ------------------------------------------------------------------------------------ stage


class StageWorker:
    """One stage of one replica: its part of the model, its optimizer, the schedule."""

    def __init__(self, spec: Spec, context: WorkerContext, payload: dict):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.spec, self.strategy, self.context = spec, spec.strategy, context
        self.t_start = time.perf_counter()
        stages, replicas = self.strategy.stages, self.strategy.replicas
        self.replica, self.index = divmod(context.rank, stages)
        self.first, self.last = self.index == 0, self.index == stages - 1
        model, self.data = build_ps_model(spec)
        micro = microbatch_size(spec)
        example = self.data.train.tensors[0][:micro]
        self.module = split_model(model, example, payload["boundaries"]).get_stage_module(
            self.index
        )
        # Each tied parameter: this stage's copies (maybe none) and its shape; every stage takes
        # part in summing their gradients.
        params = dict(self.module.named_parameters(remove_duplicate=False))
        everywhere = dict(model.named_parameters(remove_duplicate=False))
        self.tied = [
            ([params[n] for n in group if n in params], everywhere[min(group)].shape)
            for group in tied_groups(model)
        ]
        self.parameters = count_parameters(model)  # tied tensors once, as the model has them
        del model
        # Built before the process group (see the ps strategy: an optimizer created after
        # init_process_group slowed gloo sends 8× on the development machine).
        self.optimizer = build_optimizer(list(self.module.parameters()), spec.optimizer)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{context.master_addr}:{context.master_port}",
            rank=context.rank,
            world_size=context.world_size,
            timeout=timedelta(seconds=self.strategy.timeout_s),
        )
        # Every rank creates every group, in the same order (torch.distributed's rule).
        pipes = [dist.new_group([r * stages + s for s in range(stages)]) for r in range(replicas)]
        self.pipe_group = pipes[self.replica]
        self.replica_group = None
        if replicas > 1:
            same_stage = [
                dist.new_group([r * stages + s for r in range(replicas)]) for s in range(stages)
            ]
            self.replica_group = same_stage[self.index]
        stage = PipelineStage(
            self.module, self.index, stages, torch.device("cpu"), group=self.pipe_group
        )
        self.forward_s = self.backward_s = 0.0
        self.counting = True
        self._time_calls(stage)
        schedule = Schedule1F1B if self.strategy.schedule == "1f1b" else ScheduleGPipe
        self.schedule = schedule(
            stage, n_microbatches=self.strategy.microbatches_run, loss_fn=compute_loss
        )
        self.plan = Plan.of(spec, self.data.num_train, replicas)
        self.sampler = GlobalBatchSampler(
            self.data.num_train, spec.batch_size, spec.seed, self.replica, replicas
        )
        self.loader = InProcessBatches(self.data.train, self.sampler)
        self.step = 0
        self.timing = TimingTotals()
        self.schedule_s = self.sync_s = self.optimizer_s = 0.0
        self.epochs: list[dict] = []
        self.reports = self.replica == 0 and self.last
        self.events = EventReporter(context) if self.reports else NullReporter()
        self.setup_s = time.perf_counter() - self.t_start

    def _time_calls(self, stage) -> None:
        """Count the stage's compute: its forward and backward of each microbatch."""
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def timed_forward(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                if self.counting:
                    self.forward_s += time.perf_counter() - t0

        def timed_backward(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return backward(*args, **kwargs)
            finally:
                self.backward_s += time.perf_counter() - t0

        stage.forward_one_chunk, stage.backward_one_chunk = timed_forward, timed_backward

    def _run_schedule(self, x, y, losses: list, train: bool = True):
        run = self.schedule.step if train else self.schedule.eval
        if self.first and self.last:
            return run(x, target=y, losses=losses)
        if self.first:
            return run(x)
        if self.last:
            return run(target=y, losses=losses)
        return run()

    def _sync_gradients(self) -> None:
        """Tied copies get the sum of their gradients; replicas average theirs."""
        for copies, shape in self.tied:
            total = torch.zeros(shape)
            for param in copies:
                if param.grad is not None:
                    total += param.grad
            dist.all_reduce(total, group=self.pipe_group)
            for param in copies:
                param.grad = total.clone()
        if self.replica_group is None:
            return
        params = [p for p in self.module.parameters() if p.grad is not None]
        if params:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=self.replica_group)
            flat /= self.strategy.replicas
            offset = 0
            for param in params:
                n = param.numel()
                param.grad.copy_(flat[offset : offset + n].view_as(param))
                offset += n

    def describe(self, split: dict) -> dict:
        return {
            "name": self.spec.name,
            "model": self.spec.model.name,
            "parameters": self.parameters,
            "device": "cpu",
            "precision": self.spec.precision,
            "train_samples": self.data.num_train,
            "val_samples": len(self.data.val),
            "start_step": 0,
            "workers": self.strategy.stages * self.strategy.replicas,
            "pipeline": split,
            **self.plan.__dict__,
        }

    def run(self, split: dict) -> dict:
        self.events.start(self.describe(split))
        self.t_train = time.perf_counter()
        self.module.train()
        while self.step < self.plan.total_steps:
            epoch = self.step // self.plan.steps_per_epoch
            self.sampler.set_epoch(epoch, self.step - epoch * self.plan.steps_per_epoch)
            losses: list[float] = []
            t_prev = time.perf_counter()
            for x, y in self.loader:
                t_data = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                microbatch_losses: list[torch.Tensor] = []
                self._run_schedule(x, y, microbatch_losses)
                t_sync = time.perf_counter()
                self.schedule_s += t_sync - t_data
                self._sync_gradients()
                t_opt = time.perf_counter()
                self.sync_s += t_opt - t_sync
                self.optimizer.step()
                t_end = time.perf_counter()
                self.optimizer_s += t_end - t_opt
                self.step += 1
                self.timing.add(StepTiming(t_data - t_prev, 0.0, t_end - t_data), len(y))
                if microbatch_losses:
                    losses.append(float(torch.stack(microbatch_losses).detach().mean()))
                    rate = len(y) * self.strategy.replicas / max(t_end - t_prev, 1e-9)
                    self.events.step(self.step, epoch + 1, losses[-1], rate)
                t_prev = time.perf_counter()
                if self.step >= self.plan.total_steps:
                    break
            at_end = self.step % self.plan.steps_per_epoch == 0
            if at_end or self.step >= self.plan.total_steps:
                self._end_epoch(epoch, losses)
        return self.summary()

    def _end_epoch(self, epoch: int, losses: list[float]) -> None:
        """Replica 0 evaluates through its pipeline (forward only, whole batches padded to the
        training batch: the stages' buffers have that shape); its last stage scores it."""
        if self.replica != 0:
            return
        self.counting = False
        self.module.eval()
        val_x, val_y = self.data.val.tensors
        batch = self.spec.batch_size
        total_loss, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for start in range(0, len(val_y), batch):
                x, y = val_x[start : start + batch], val_y[start : start + batch]
                real = len(y)
                if real < batch:  # pad with copies of the first rows; they are not scored
                    x = torch.cat([x, val_x[: batch - real]])
                padded = torch.cat([y, val_y[: batch - real]])
                output = self._run_schedule(x, padded, [], train=False)
                if self.last:
                    logits = output[:real]
                    total_loss += float(compute_loss(logits, y)) * real
                    right, count = count_correct(logits, y)
                    correct, seen = correct + right, seen + count
        self.module.train()
        self.counting = True
        if self.last:
            validation = (total_loss / len(val_y), correct / seen) if seen else (None, None)
            record = epoch_record(epoch, self.step, losses, validation, self.timing, self.t_start)
            self.epochs.append(record)
            self.events.epoch_end(record)

    def summary(self) -> dict:
        wall = time.perf_counter() - self.t_train
        busy = self.forward_s + self.backward_s
        result = {
            "role": "stage",
            "replica": self.replica,
            "stage": self.index,
            "node": self.context.node,
            "steps": self.step,
            "samples": self.timing.samples,
            "train_wall_s": wall,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "busy_s": busy,
            "schedule_s": self.schedule_s,
            "sync_s": self.sync_s,
            "optimizer_s": self.optimizer_s,
            "bubble": 1.0 - busy / self.schedule_s if self.schedule_s else 0.0,
            "setup_s": self.setup_s,
            "peak_memory_bytes": peak_memory(torch.device("cpu"))[0],
        }
        if self.replica == 0:  # every replica holds the same weights; one copy is enough
            state = self.module.state_dict()
            result["state"] = {name: value.detach().numpy().copy() for name, value in state.items()}
        if self.reports:
            result["epochs"] = self.epochs
            result["timing"] = self.timing.to_state()
        return result


def stage_process(context: WorkerContext, payload: dict) -> dict:
    spec = parse_spec(payload["spec"])
    worker = StageWorker(spec, context, payload)
    try:
        return worker.run(payload["split"])
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------ parent


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
) -> dict:
    """Plan the split, start S × D stage processes, assemble, evaluate and save the model."""
    launcher = default_launcher(launcher)
    reporter = reporter or NullReporter()
    strategy: PipelineStrategy = spec.strategy
    require_cpu_fp32(spec, "processes")
    if resume_from is not None:
        raise UserError(f"strategy '{strategy.name}' cannot --resume yet: start a new run")
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    model, data = build_ps_model(spec)
    Plan.of(spec, data.num_train, strategy.replicas)  # a batch too large is one line, here
    split = plan_stages(spec, model, data)
    # Each stage process traces the model again; tracing it here first turns a model torch.export
    # cannot take into one line before any process starts.
    split_model(model, data.train.tensors[0][: microbatch_size(spec)], split.boundaries)
    payload = {
        "spec": spec.model_dump(mode="json"),
        "run_dir": str(run_dir),
        "boundaries": split.boundaries,
        "split": split.to_dict(),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    warnings, collect = warned_events(spec, reporter)

    processes = strategy.stages * strategy.replicas
    results = launcher.run(
        stage_process, payload, processes, Resources(cpus=1.0), strategy.port, collect
    )
    state = {}
    for result in results:
        state.update(result.get("state", {}))
    model.load_state_dict({name: torch.tensor(value) for name, value in state.items()})
    main = results[strategy.stages - 1]  # the last stage of replica 0 reported
    final = evaluate_and_save(spec, run_dir, model, data, main["steps"])
    record = pipeline_record(
        spec, run_dir, model, data, results, split, warnings, final, started_at,
        time.perf_counter() - t_start,
    )  # fmt: skip
    write_json_atomic(run_dir / "run.json", record)
    reporter.finish(record)
    return record


def pipeline_record(
    spec, run_dir, model, data, results, split, warnings, final, started_at, wall_s
) -> dict:
    """run.json for pipeline and hybrid: the common schema, plus `pipeline` (stages, bubble)."""
    strategy: PipelineStrategy = spec.strategy
    main = results[strategy.stages - 1]
    plan = Plan.of(spec, data.num_train, strategy.replicas)
    samples = sum(r["samples"] for r in results if r["stage"] == 0)
    train_wall = max(r["train_wall_s"] for r in results)
    replica0 = [r for r in results if r["replica"] == 0]
    private = ("state", "epochs", "timing")
    stages = [
        {**planned.to_dict(), **{k: v for k, v in measured.items() if k not in private}}
        for planned, measured in zip(split.stages, replica0, strict=True)
    ]
    record = process_group_record(
        spec, run_dir, model, data, plan, main, warnings, final, started_at, wall_s,
        (samples, train_wall, strategy.replicas),
        max(r["peak_memory_bytes"] for r in results),
    )  # fmt: skip
    return {
        **record,
        "pipeline": {
            "strategy": strategy.name,
            "stages": strategy.stages,
            "data_parallel": strategy.replicas,
            "schedule": strategy.schedule,
            "microbatches": strategy.microbatches_run,
            "split": split.boundaries,
            "balanced_by": split.balanced_by,
            "bubble_measured": sum(s["bubble"] for s in stages) / len(stages),
            "bubble_predicted": predicted_bubble(strategy.stages, strategy.microbatches_run),
            "per_stage": stages,
            "replicas": [
                {key: r[key] for key in ("replica", "stage", "sync_s", "busy_s", "bubble")}
                for r in results
            ],
        },
        "workers": [{k: v for k, v in r.items() if k not in private} for r in results],
    }
