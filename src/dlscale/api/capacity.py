"""Does a run fit this machine: memory for what its processes hold, cores for how many there are;
refused in one line before anything is built or started, or a warning when it will crawl."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlscale.bench.memory import load_averages
from dlscale.data import DataBundle, build_data
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.jobspec import LoaderSpec, SingleStrategy, Spec
from dlscale.launch import local
from dlscale.launch.processes import available_cores
from dlscale.models import build_model
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION, split_advice
from dlscale.profiler.memory import ModelState, model_state
from dlscale.train.device import resolve_device
from dlscale.train.step import build_optimizer
from dlscale.units import binary_bytes as _b

# Up to 4 processes per core still train, each on a quarter of a core: tests and experiments
# oversubscribe small machines on purpose (4 workers on 2 cores), and get a warning. Far beyond
# that a run only switches between processes (1000 ddp workers on 2 cores would each get 1/500
# of a core, and need ~150 GB just to import torch): that is a cluster's job.
MAX_PROCESSES_PER_CORE = 4
# A spawned worker's own memory before it holds any model or data: torch, gloo and our imports.
# Measured as Private_Dirty of such a process on the development machine: 143 MiB.
PROCESS_BYTES = 150 * 2**20


@dataclass(frozen=True)
class HostNeed:
    """What a run holds in this machine's memory at once."""

    model_states: int  # model states held here (see StrategySection.model_states)
    state_bytes: int  # one model state
    state_kind: str  # what a model state is: on a GPU run only its weights stay on the host
    processes: int  # processes here, each with its own copy of the data
    data_bytes: int
    new_processes: int  # started for the run (a single run trains in this one)

    @property
    def total_bytes(self) -> int:
        return (
            self.model_states * self.state_bytes
            + self.processes * self.data_bytes
            + self.new_processes * PROCESS_BYTES
        )


def check_run(spec: Spec, cluster: str, reporter) -> list[str]:
    """Refuse a run this machine cannot hold (UserError); warn `reporter` if it will crawl, and
    return those warnings for the run's record."""
    is_local = cluster == "local"
    cores = available_cores()
    if is_local:
        check_process_count(*local_processes(spec), cores)
    check_memory(spec, is_local)
    if not is_local:
        return []
    threads = spec.threads or default_threads(spec.strategy.processes)
    found = slow_start_warnings(spec.strategy.processes, threads, cores, load_average_1m())
    for message in found if reporter is not None else []:
        reporter.warn(message)
    return found


def local_problems(spec: Spec) -> list[str]:
    """What would stop the spec on this machine, for `validate` to show as warnings: the spec
    itself is fine, and may be meant for a cluster."""
    try:
        check_run(spec, "local", None)
    except UserError as exc:
        return [f"on this machine: {exc}"]
    return []


def local_processes(spec: Spec) -> tuple[int, str]:
    """Processes a run starts here, with what starts them: each trainer's DataLoader workers are
    processes too (the trainers of a parameter-server job; its servers load no data)."""
    strategy = spec.strategy
    what = f"strategy '{strategy.name}'"
    loaders = spec.loader.workers
    if not loaders:
        return strategy.processes, what
    processes = strategy.processes + strategy.trainers * loaders
    return processes, f"{what} with loader.workers: {loaders}"


def check_process_count(processes: int, what: str, cores: int, spread: bool = True) -> None:
    """More local processes than MAX_PROCESSES_PER_CORE per core: one line, before any starts.
    `spread`: the command can place them on a Ray cluster (--cluster ray) instead."""
    limit = MAX_PROCESSES_PER_CORE * cores
    if processes > limit:
        elsewhere = ", or spread them over machines with --cluster ray" if spread else ""
        raise UserError(
            f"{what} would start {processes} processes here; this machine runs at most {limit} "
            f"({MAX_PROCESSES_PER_CORE} per core, {cores} cores): use fewer{elsewhere}"
        )


def check_trials(trials: list[Spec], cluster: str, what: str = "a trial") -> None:
    """The process count of each run of a sweep, scale or compare, before the first starts."""
    if cluster == "local":
        processes = max(local_processes(trial)[0] for trial in trials)
        check_process_count(processes, what, available_cores())


def check_global_batches(runs: list[Spec]) -> None:
    """Each run's global batch against its training set, before the first of a scale or
    compare starts: a count whose batch passes the data was refused only when its turn came,
    after the others had run."""
    from dlscale.train.plan import Plan

    sizes: dict[str, int] = {}
    for run in runs:
        key = run.data.model_dump_json() + f"/{run.seed}"
        if key not in sizes:
            sizes[key] = build_data(run.data, run.seed).num_train
        Plan.of(run, sizes[key], run.strategy.replicas)


def check_one_process(spec: Spec) -> None:
    """The memory check for a spec trained in this one process (`estimate` times a few steps)."""
    check_memory(spec.model_copy(update={"strategy": SingleStrategy()}), is_local=True)


def check_memory(spec: Spec, is_local: bool) -> None:
    """The model's weights, gradients and optimizer state (as the profiler counts them, on the
    meta device) and its data, for every process that holds them here, against free memory."""
    device = resolve_device(spec.device)
    data = build_data(spec.data, spec.seed)
    # A model that cannot be built on meta is left to the real build, which names its problem;
    # its data and processes are still counted.
    state = model_state_of(spec, data) or ModelState(0, 0, 0)
    if device.type == "cuda" and is_local:
        check_gpu(spec, state, device)
    # A loader batch is a whole optimizer step's samples: its accumulated micro-batches.
    step_batch = spec.batch_size * spec.accumulate
    host = host_need(spec, state, data_bytes(data, step_batch, spec.loader), is_local, device)
    available = available_memory_bytes(torch.device("cpu"))
    if host.total_bytes > available:
        raise host_error(spec, host, available)


def model_state_of(spec: Spec, data: DataBundle) -> ModelState | None:
    def build():
        return build_model(spec.model.name, spec.model.kwargs, data.model_defaults())

    try:
        return model_state(build, lambda params: build_optimizer(params, spec.optimizer))
    except Exception:  # a factory that needs real tensors; or a broken one, found by the run
        return None


def data_bytes(data: DataBundle, batch_size: int, loader: LoaderSpec) -> int:
    """Data each process holds: all of it when in memory; when read from disk, the batches the
    loader has in flight (the shuffle buffer of a stream among them)."""
    if data.in_memory:
        return data.resident_bytes
    # Each loader worker reads its own batches through its own shuffle buffer, and keeps
    # `prefetch` batches ready; the trainer holds the batch it trains on.
    readers = max(1, loader.workers)
    in_flight = readers * (loader.prefetch or 2) + 1
    buffered = readers * getattr(data.train, "shuffle_buffer", 0) + in_flight * batch_size
    return buffered * data.sample_bytes


def host_need(spec: Spec, state: ModelState, data: int, is_local: bool, device) -> HostNeed:
    """On a cluster, this machine holds the parent's starting model and data; locally, every
    process's. A GPU run keeps each process's weights on the host while it builds its model."""
    if not is_local:
        return HostNeed(1, state.weights_bytes, "weights", 1, data, 0)
    processes = spec.strategy.processes
    new = 0 if spec.strategy.in_process else processes
    if device.type == "cuda":
        return HostNeed(processes, state.weights_bytes, "weights", processes, data, new)
    kind = "weights, gradients and optimizer state"
    return HostNeed(spec.strategy.model_states, state.total_bytes, kind, processes, data, new)


def host_error(spec: Spec, host: HostNeed, available: int) -> UserError:
    if host.state_bytes > available and host.state_kind != "weights":
        return UserError(
            f"model '{spec.model.name}' on this machine ({_b(available)} of memory available): "
            f"{split_advice(host.state_bytes, available, spec.precision)}; a local pipeline's "
            "stages share this machine's memory, so place them on several (--cluster ray)"
        )
    parts = [
        f"{host.model_states} × {_b(host.state_bytes)} of {host.state_kind}",
        f"{host.processes} × {_b(host.data_bytes)} of data",
    ]
    if host.new_processes:
        parts.append(f"{host.new_processes} × {_b(PROCESS_BYTES)} to run a process")
    need = f"about {_b(host.total_bytes)} of memory here ({', '.join(parts)})"
    if host.processes == 1:
        return UserError(
            f"the model and its data need {need}, {_b(available)} available: use a smaller "
            "model or data set, or a machine with more memory"
        )
    fit = int(host.processes * available // host.total_bytes)
    fix = f"use at most {fit} processes" if fit else "use a smaller model or data set"
    return UserError(
        f"{host.processes} processes need {need}, {_b(available)} available: {fix}, or spread "
        "them over machines (--cluster ray)"
    )


def gpu_half(properties) -> str:
    """The half precision to offer on a GPU: bf16 where it has bf16 units (compute capability
    8.0 and later: Ampere, Hopper, ...), else fp16 (a V100's 7.0)."""
    major = getattr(properties, "major", None)
    return "fp16" if isinstance(major, int) and major < 8 else "bf16"


def check_gpu(spec: Spec, state: ModelState, device: torch.device) -> None:
    """Each GPU holds a whole model state, or for a pipeline at least its stage's share."""
    stages = spec.strategy.stages
    properties = torch.cuda.get_device_properties(device)
    # The profiler's share of a device that training can use (no CUDA context is made here:
    # mem_get_info would hold one in this process on the workers' GPU for the whole run).
    usable = int(properties.total_memory * USABLE_MEMORY_FRACTION)
    if state.total_bytes / stages > usable:
        raise UserError(
            f"model '{spec.model.name}' on {properties.name}: "
            f"{split_advice(state.total_bytes, usable, spec.precision, half=gpu_half(properties))}"
        )


def default_threads(processes: int) -> int:
    """torch's intra-op threads per process when the spec sets none: a single run keeps this
    process's; local workers get the launcher's equal share of the cores."""
    return torch.get_num_threads() if processes == 1 else local.threads_per_worker(processes)


def load_average_1m() -> float:
    """Runnable processes, averaged over the last minute (0 where the system does not say)."""
    averages = load_averages()
    return averages[0] if averages else 0.0


def slow_start_warnings(processes: int, threads: int, cores: int, load_1m: float) -> list[str]:
    """What will make a run crawl on this machine, each with its fix. A loaded 2-core machine ran
    the demo 45× slower with two torch threads than with one: OpenMP threads meet at the end
    of every parallel region, each step has many, and a thread without a core holds up all."""
    found = []
    if processes > cores:
        found.append(
            f"{processes} processes on {cores} cores: they take turns, so this trains slower "
            f"than {cores} would; spread them over machines with --cluster ray"
        )
    elif processes * threads > cores:
        who = f"{threads} threads"
        if processes > 1:
            who = f"{processes} processes × {who}"
        found.append(
            f"{who} on {cores} cores: the threads wait for each other; set "
            f"`threads: {max(1, cores // processes)}` in the spec"
        )
    if load_1m > cores:
        fix = (
            "set `threads: 1` in the spec, or wait for the machine to quieten"
            if threads > 1
            else "wait for the machine to quieten, or run it elsewhere"
        )
        found.append(
            f"this machine is busy (load average {load_1m:.1f} on {cores} cores over the last "
            f"minute): training will be slower than usual; {fix}"
        )
    return found
