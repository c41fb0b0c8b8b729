"""Refuse before harm: a model this machine cannot hold, more processes than it can run; and a
word, with the fix, when a run will crawl (cores oversubscribed, a busy machine)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dlscale import api
from dlscale.api import capacity
from dlscale.api.experiments import scale
from dlscale.api.profiling import ProfileRequest, profile
from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.launch.processes import available_cores
from dlscale.profiler.memory import ModelState
from dlscale.units import binary_bytes

SMALL = {
    "name": "small",
    "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
    "data": {"name": "synthetic", "shape": [20], "num_classes": 4, "num_samples": 64},
    "batch_size": 8,
    "steps": 2,
    "optimizer": {"name": "adam"},
    "device": "cpu",
}


def spec(**changes):
    return parse_spec({**SMALL, **changes})


def write(folder: Path, **changes) -> Path:
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump({**SMALL, **changes}, sort_keys=False))
    return path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    return result.stderr


# ------------------------------------------------------------------ 4: memory before building


def test_a_model_larger_than_memory_is_refused_with_the_profilers_figure_and_advice(tmp_path):
    """The defect: `hidden: [200000, 200000]` went on to allocate 160 GB and failed in the
    allocator (first a traceback, then its message); nothing said what the model needs."""
    huge = {"name": "mlp", "kwargs": {"hidden": [200000, 200000]}}
    path = write(tmp_path, model=huge)
    stderr = one_line_exit_2(invoke("train", path, "--out", tmp_path / "run"))
    # The figure is the profiler's own: weights, gradients and Adam's two moments, on meta.
    static_bytes = profile(ProfileRequest(str(path))).memory.static_bytes
    assert static_bytes > 16 * 160e9 / 4  # 4 × 160 GB: weights, gradients, 2 moments
    assert binary_bytes(static_bytes) in stderr and "does not fit" in stderr
    assert "strategy: {name: pipeline" in stderr  # the profiler's advice: split it
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def test_replicas_that_fit_alone_but_not_together_are_refused_naming_how_many_fit(monkeypatch):
    """Each local ddp worker holds a whole replica, its data and a process of its own."""
    one_process = capacity.PROCESS_BYTES  # the model and data here are tiny beside it
    monkeypatch.setattr(capacity, "available_memory_bytes", lambda device: int(2.5 * one_process))
    monkeypatch.setattr(capacity, "available_cores", lambda: 8)
    with pytest.raises(UserError) as caught:
        api.train(spec(strategy={"name": "ddp", "workers": 4}), out_dir="unused")
    message = str(caught.value)
    assert "4 processes need" in message and "use at most 2 processes" in message
    assert "--cluster ray" in message


def test_the_memory_figure_counts_each_local_replica(monkeypatch):
    seen = []
    monkeypatch.setattr(capacity, "available_memory_bytes", lambda device: 2**50)
    monkeypatch.setattr(capacity, "available_cores", lambda: 8)
    real = capacity.host_need

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    monkeypatch.setattr(capacity, "host_need", spy)
    for strategy in (
        {"name": "single"},
        {"name": "ddp", "workers": 3},
        {"name": "ps", "workers": 3, "servers": 2},
    ):
        capacity.check_run(spec(strategy=strategy), "local", None)
    single, ddp, ps = seen
    model_and_data = single.total_bytes  # this process: no new one
    # ddp: 3 replicas, 3 copies of the data, 3 new processes; ps: 3 workers' replicas and one
    # sharded across the servers, data in all 5, 5 new processes.
    assert ddp.total_bytes - 3 * capacity.PROCESS_BYTES == pytest.approx(3 * model_and_data)
    assert ps.model_states == 4 and ps.processes == 5 and ddp.model_states == 3


def test_estimate_checks_the_model_before_it_builds_it(tmp_path):
    huge = {"name": "mlp", "kwargs": {"hidden": [200000, 200000]}}
    path = write(tmp_path, model=huge, strategy={"name": "ddp", "workers": 2})
    with pytest.raises(UserError, match=r"model 'mlp' on this machine .* does not fit"):
        api.estimate(path)


def test_a_gpu_holds_a_whole_model_state_and_a_pipeline_stage_its_share(monkeypatch):
    gpu = SimpleNamespace(name="Test GPU", total_memory=10 * 2**30)  # 9 GiB usable
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    state = ModelState(4 * 2**30, 4 * 2**30, 8 * 2**30)  # weights, gradients, Adam: 16 GiB
    cuda = torch.device("cuda")
    with pytest.raises(UserError, match="model 'mlp' on Test GPU: the model does not fit"):
        capacity.check_gpu(spec(), state, cuda)
    capacity.check_gpu(spec(strategy={"name": "pipeline", "stages": 2}), state, cuda)  # 8 GiB
    # The half precision it offers is one the GPU runs: fp16 on a V100 (7.0), bf16 from 8.0.
    for major, half in ((7, "fp16"), (8, "bf16")):
        gpu.major = major
        with pytest.raises(UserError, match=rf"less state, {half}\)"):
            capacity.check_gpu(spec(), state, cuda)
    host = capacity.host_need(spec(strategy={"name": "ddp", "workers": 2}), state, 0, True, cuda)
    assert (host.model_states, host.state_bytes) == (2, 4 * 2**30)  # only weights on the host


# ------------------------------------------------------------------ 5: processes per machine


def test_more_local_processes_than_the_machine_can_run_are_refused_in_one_line(tmp_path):
    """The defect: `ddp workers: 1000` would have started 1000 torch processes."""
    path = write(tmp_path, strategy={"name": "ddp", "workers": 1000})
    stderr = one_line_exit_2(invoke("train", path, "--out", tmp_path / "run"))
    limit = capacity.MAX_PROCESSES_PER_CORE * available_cores()
    assert "1000 processes" in stderr and f"at most {limit}" in stderr
    assert "--cluster ray" in stderr


def test_dataloader_workers_count_as_processes_in_a_run_and_in_the_loader_bench(tmp_path):
    """The same class: `loader.workers: 1000`, or `bench loader --workers 1000`, would have
    started a thousand DataLoader processes."""
    path = write(tmp_path, strategy={"name": "ddp", "workers": 2}, loader={"workers": 500})
    stderr = one_line_exit_2(invoke("train", path, "--out", tmp_path / "run"))
    assert "strategy 'ddp' with loader.workers: 500 would start 1002 processes" in stderr
    stderr = one_line_exit_2(invoke("bench", "loader", "--workers", "0,1000", "--steps", "2"))
    assert "bench loader would start 1001 processes" in stderr
    assert not (tmp_path / "run").exists()


def test_validate_says_what_would_stop_the_spec_here_and_still_accepts_it(tmp_path):
    """A spec may be meant for a cluster: on this machine its problems are warnings."""
    # 1600 training samples: a batch of 1 for each of 1000 workers fits the data (else train
    # refuses it anywhere, and validate with it)
    data = {**SMALL["data"], "num_samples": 2000}
    path = write(tmp_path, strategy={"name": "ddp", "workers": 1000}, batch_size=1, data=data)
    result = invoke("validate", path)
    assert result.exit_code == 0 and "valid" in result.stdout
    said = " ".join(result.stderr.split())  # rich wraps warnings at the terminal's width
    assert "on this machine: strategy 'ddp' would start 1000 processes here" in said


def test_a_sweep_whose_trials_start_too_many_processes_is_refused_before_any(tmp_path):
    path = write(
        tmp_path,
        strategy={"name": "ddp", "workers": 1000},
        sweep={"grid": {"optimizer.lr": [0.01, 0.1]}},
    )
    with pytest.raises(UserError, match="1000 processes"):
        api.sweep(path, tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


def test_scale_checks_its_largest_run_before_the_first_starts(tmp_path):
    with pytest.raises(UserError, match="a run would start 1000 processes"):
        scale(write(tmp_path), [1, 1000], tmp_path / "scale", steps=2)
    assert not (tmp_path / "scale" / "workers-1").exists()


# ------------------------------------------------------------------ 6: oversubscription


def test_oversubscribed_cores_and_a_busy_machine_are_named_with_the_fix():
    warn = capacity.slow_start_warnings
    assert warn(processes=2, threads=1, cores=2, load_1m=1.5) == []
    (crowded,) = warn(processes=6, threads=1, cores=2, load_1m=0.0)
    assert "6 processes on 2 cores" in crowded and "--cluster ray" in crowded
    (threads,) = warn(processes=2, threads=3, cores=2, load_1m=0.0)
    assert "2 processes × 3 threads on 2 cores" in threads and "threads: 1" in threads
    (busy,) = warn(processes=1, threads=2, cores=2, load_1m=5.0)
    assert "load average 5.0" in busy and "threads: 1" in busy
    (busy,) = warn(processes=1, threads=1, cores=2, load_1m=5.0)
    assert "load average 5.0" in busy and "threads: 1" not in busy  # already the fix


def test_a_busy_machine_is_said_at_the_start_and_threads_set_the_runs_own(
    monkeypatch, tmp_path, reporter
):
    monkeypatch.setattr(capacity, "load_average_1m", lambda: 7.5)
    monkeypatch.setattr(capacity, "available_cores", lambda: 2)
    before = torch.get_num_threads()
    record = api.train(spec(threads=1), out_dir=tmp_path, reporter=reporter)
    assert record.environment["torch_threads"] == 1
    assert torch.get_num_threads() == before  # the caller's own count is given back
    assert any("load average 7.5 on 2 cores" in w for w in reporter.of("warn"))
    assert reporter.events[0][0] == "warn"  # said before training starts


@pytest.mark.slow
def test_each_worker_runs_the_specs_threads_and_oversubscription_is_named(
    monkeypatch, tmp_path, reporter
):
    monkeypatch.setattr(capacity, "available_cores", lambda: 2)
    job = spec(threads=2, strategy={"name": "ddp", "workers": 2})
    record = api.train(job, out_dir=tmp_path, reporter=reporter)
    assert record.environment["torch_threads"] == 2  # worker 0's, not the launcher's 1
    assert any("2 processes × 2 threads on 2 cores" in w for w in reporter.of("warn"))


def test_threads_is_checked_and_leaves_the_spec_hash_alone():
    assert spec(threads=2).spec_hash() == spec().spec_hash()  # a run resumes on other cores
    with pytest.raises(UserError, match="threads"):
        spec(threads=0)
