"""The Ray launcher against a real two-node Ray cluster that the test starts on 127.0.0.1."""

import os

# Ray swaps a loopback head address for this machine's network address unless it runs in its
# single-machine mode; tests keep all traffic on 127.0.0.1. Set before Ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from pathlib import Path

import pytest
import ray  # installed by `make` (the `ray` extra): a missing Ray fails here, never skips
import torch

from dlscale import api
from dlscale.api.data import convert_data
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.train.record import RunRecord

SPEC = {
    "name": "ray-ddp",
    "model": {"name": "lenet"},
    "data": {"name": "digits", "image_size": 28},
    "batch_size": 32,
    "epochs": 2,
    "device": "cpu",
    "strategy": {"name": "ddp", "workers": 2},
}


def assert_same_final_weights(*records: RunRecord) -> None:
    """The last checkpoints of two runs hold the same weights (to float rounding)."""
    first, second = (
        torch.load(Path(r.checkpoints[-1]), weights_only=True)["model"] for r in records
    )
    for name, value in first.items():
        assert torch.allclose(second[name], value, rtol=1e-5, atol=1e-7), name


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    two_nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    )
    two_nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    yield two_nodes
    two_nodes.shutdown()


@pytest.mark.slow
@pytest.mark.heavy
def test_hybrid_on_a_cluster_of_two_nodes_with_two_cpus_each(tmp_path: Path):
    """2 replicas × 2 stages: four actors over two nodes, the local run's weights. First in the
    file, so that its cluster never runs beside the shared one."""
    from ray.cluster_utils import Cluster

    strategy = {"name": "hybrid", "data_parallel": 2, "stages": 2, "microbatches": 2}
    spec = parse_spec(
        {
            **SPEC,
            "name": "ray-hybrid",
            "epochs": None,
            "steps": 6,
            "optimizer": {"name": "sgd", "lr": 0.05},
            "strategy": strategy,
        }
    )
    local = api.train(spec, out_dir=tmp_path / "local")
    four = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1"}
    )
    four.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    try:
        placed = api.train(spec, out_dir=tmp_path / "ray", cluster="ray", address=four.address)
    finally:
        four.shutdown()
    assert placed.status == "completed" and len(placed.workers) == 4
    assert len({worker.node for worker in placed.workers}) == 2
    assert_same_final_weights(local, placed)


@pytest.mark.slow
@pytest.mark.heavy
def test_ddp_on_a_two_node_ray_cluster(cluster, tmp_path: Path):
    local = api.train(parse_spec(SPEC), out_dir=tmp_path / "local")
    placed = api.train(
        parse_spec(SPEC), out_dir=tmp_path / "ray", cluster="ray", address=cluster.address
    )
    assert placed.status == "completed" and placed.distributed["backend"] == "gloo"
    nodes = {worker.node for worker in placed.workers}
    assert len(nodes) == 2, "one worker per node: each node has one CPU"
    # Same data plane, same math: the launcher changes where workers run, not what they compute.
    assert placed.final.val_accuracy == pytest.approx(local.final.val_accuracy)
    assert not ray.is_initialized()  # the launcher disconnects what it connected


@pytest.mark.slow
@pytest.mark.heavy
def test_parameter_servers_on_a_two_node_ray_cluster(cluster, tmp_path: Path):
    """The ps strategy through the same launcher interface: a server and a worker as actors (the
    cluster has one CPU a node), the tensors over gloo point-to-point between the nodes, as
    between two hosts; the local run shares memory instead. Same numbers either way."""
    strategy = {"name": "ps", "mode": "async", "workers": 1}
    spec = parse_spec(
        {**SPEC, "name": "ray-ps", "optimizer": {"name": "sgd", "lr": 0.05}, "strategy": strategy}
    )
    local = api.train(spec, out_dir=tmp_path / "local")
    spec = parse_spec(
        {
            **SPEC,
            "name": "ray-ps",
            "optimizer": {"name": "sgd", "lr": 0.05},
            "strategy": {**strategy, "data_plane": "gloo"},
        }
    )
    placed = api.train(spec, out_dir=tmp_path / "ray", cluster="ray", address=cluster.address)
    assert (local.ps["data_plane"], placed.ps["data_plane"]) == ("shm", "gloo")
    assert placed.status == "completed" and placed.ps["updates"] == local.ps["updates"]
    # One worker: no staleness, so the run is deterministic and both launchers agree exactly.
    assert placed.ps["staleness_histogram"] == {"0": placed.ps["updates"]}
    assert placed.final.val_accuracy == pytest.approx(local.final.val_accuracy)
    assert not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.heavy
def test_a_pipeline_across_the_two_nodes(cluster, tmp_path: Path):
    """Stage 1 on one node, stage 2 on the other: activations and gradients cross between
    them, and the weights are those of the same pipeline run as local processes."""
    strategy = {"name": "pipeline", "stages": 2, "microbatches": 4}
    spec = parse_spec(
        {
            **SPEC,
            "name": "ray-pipeline",
            "epochs": None,
            "steps": 8,
            "optimizer": {"name": "sgd", "lr": 0.05},
            "strategy": strategy,
        }
    )
    local = api.train(spec, out_dir=tmp_path / "local")
    placed = api.train(spec, out_dir=tmp_path / "ray", cluster="ray", address=cluster.address)
    assert placed.status == "completed"
    assert len({worker.node for worker in placed.workers}) == 2
    assert_same_final_weights(local, placed)


@pytest.mark.slow
@pytest.mark.heavy
def test_each_worker_streams_its_own_part_of_the_shards(cluster, tmp_path: Path):
    """WebDataset shards on storage both nodes reach: each Ray worker opens them itself and
    reads its own part of every epoch (the driver sends a spec, never data), and the weights
    are those of the same run as local processes."""
    convert_data("digits", tmp_path / "shards", shard_size="64KB")
    data = {
        "name": "webdataset",
        "urls": str(tmp_path / "shards" / "train-*.tar"),
        "val_urls": str(tmp_path / "shards" / "val-*.tar"),
        "shuffle_buffer": 200,
    }
    spec = parse_spec(
        {
            **SPEC,
            "name": "ray-shards",
            "model": {"name": "mlp"},
            "data": data,
            "optimizer": {"name": "sgd", "lr": 0.05},
        }
    )
    local = api.train(spec, out_dir=tmp_path / "local")
    placed = api.train(spec, out_dir=tmp_path / "ray", cluster="ray", address=cluster.address)
    assert placed.status == "completed" and placed.data.streamed is True
    assert len({worker.node for worker in placed.workers}) == 2
    per_worker = placed.plan.total_steps * placed.plan.batch_size
    assert [w.samples_read for w in placed.workers] == [per_worker, per_worker]
    assert_same_final_weights(local, placed)


@pytest.mark.slow
@pytest.mark.heavy
def test_more_workers_than_the_cluster_can_place(cluster, tmp_path: Path):
    spec = parse_spec({**SPEC, "strategy": {"name": "ddp", "workers": 3}})
    with pytest.raises(
        UserError, match="has 2 CPUs; 3 workers needing 3 CPUs in all cannot be placed"
    ):
        api.train(spec, out_dir=tmp_path, cluster="ray", address=cluster.address)


def test_an_address_that_does_not_answer(tmp_path: Path):
    with pytest.raises(UserError, match=r"the Ray cluster at 127.0.0.1:9 does not answer"):
        api.train(parse_spec(SPEC), out_dir=tmp_path, cluster="ray", address="127.0.0.1:9")


@pytest.mark.slow
@pytest.mark.heavy
def test_sweep_trials_as_ray_tasks_on_two_nodes(cluster, tmp_path: Path):
    """One-CPU trials on two one-CPU nodes: two at a time, one on each, on two long-lived
    actors (the third trial runs on one of the first two's); a failing one recorded."""
    import yaml

    spec = {
        "name": "ray-sweep",
        "model": {"name": "mlp", "kwargs": {"hidden": 32}},
        "data": {"name": "digits"},
        "batch_size": 64,
        "epochs": 2,
        "device": "cpu",
        "sweep": {"grid": {"batch_size": [32, 64, 16, 5000]}},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = api.sweep(path, tmp_path / "out", cluster="ray", address=cluster.address)
    assert result.slots == 2 and result.cluster == "ray"
    first, second, third, failed = result.trials
    assert first.status == second.status == third.status == "completed"
    pids = [trial.runs[0].pid for trial in (first, second, third)]
    assert pids[2] in pids[:2]  # an actor ran trial after trial
    assert {first.runs[0].node, second.runs[0].node} == {
        node["NodeID"] for node in ray_nodes(cluster.address)
    }
    assert failed.status == "failed" and "larger than the training set" in failed.error


def ray_nodes(address: str) -> list[dict]:
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        return [node for node in ray.nodes() if node["Alive"]]
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.heavy
def test_a_killed_worker_actor_is_named_with_the_signal_and_the_resume_hint(cluster, tmp_path):
    """The defect: `worker 0 on ... died: The actor died unexpectedly before finishing this
    task...`, without the signal that a local run names, nor how to continue."""
    import signal

    from dlscale.launch.base import WorkerFailed
    from tests.conftest import RecordingReporter, alive

    class Killer(RecordingReporter):
        killed: int | None = None

        def step(self, step, epoch, loss, samples_per_s):
            super().step(step, epoch, loss, samples_per_s)
            if self.killed is None and list(tmp_path.glob("checkpoints/step-*.pt")):
                self.killed = min(actor_pids())  # one of the two workers
                os.kill(self.killed, signal.SIGKILL)

    spec = parse_spec({**SPEC, "name": "ray-kill", "epochs": 20})
    killer = Killer()
    with pytest.raises(WorkerFailed) as failed:
        api.train(spec, out_dir=tmp_path, cluster="ray", address=cluster.address, reporter=killer)
    message = str(failed.value)
    assert killer.killed is not None and not alive(killer.killed)
    assert "died" in message and "SIGKILL" in message, message
    assert message.endswith(f"continue with --resume --out {tmp_path}"), message
    assert "\n" not in message


def actor_pids() -> list[int]:
    """This machine's processes running a dlscale worker actor (Ray names them by the task)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(
                b"ray::_RayWorker.run"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found
