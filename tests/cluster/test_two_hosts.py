"""Every strategy across the testbed's hosts, started as a user would: `dlscale train SPEC
--cluster ray --address HEAD` on host-a, no interface named by hand. Each host's name resolves
to 127.0.1.1, as on a stock Debian host. Where a one-host run is deterministic, the cross-host
run ends with its weights; each record says on which host (name and address) each process ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from dlscale import api
from dlscale.spec import parse_spec
from tests.cluster.conftest import BIN, clean_environment

BASE = {
    "model": {"name": "lenet"},
    "data": {"name": "digits", "image_size": 28},
    "batch_size": 32,
    "steps": 12,
    "device": "cpu",
    "seed": 0,
    "optimizer": {"name": "sgd", "lr": 0.05},
}
ADDRESSES = {"host-a": "10.77.0.1", "host-b": "10.77.0.2", "host-c": "10.77.0.3"}


def write_spec(tmp_path: Path, name: str, spec: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**BASE, "name": name, **spec}))
    return path


def on_cluster(bed, tmp_path: Path, verb: str, spec: dict, name: str, *extra: str):
    """`dlscale VERB` on host-a against the testbed's cluster: (exit code, output, out folder)."""
    out = tmp_path / name
    argv = [str(BIN / "dlscale"), verb, str(write_spec(tmp_path, name, spec))]
    argv += ["--cluster", "ray", "--address", bed.address, "--out", str(out), *extra]
    done = bed.run(0, argv, env=clean_environment(), timeout=600)
    return done.returncode, done.stdout + done.stderr, out


def train_on(bed, tmp_path: Path, spec: dict, name: str):
    code, output, out = on_cluster(bed, tmp_path, "train", spec, name)
    assert code == 0, output
    return json.loads((out / "run.json").read_text())


def local_run(tmp_path: Path, spec: dict, name: str) -> dict:
    return api.train(parse_spec({**BASE, "name": name, **spec}), out_dir=tmp_path / f"{name}-1")


def same_weights(first: dict, second: dict) -> None:
    a, b = (
        torch.load(Path(r["checkpoints"][-1]), weights_only=True)["model"] for r in (first, second)
    )
    for name, value in a.items():
        assert torch.allclose(b[name], value, rtol=1e-5, atol=1e-6), name


def hosts_of(entries: list[dict]) -> list[str]:
    """Each process's host name, checked against the address recorded beside it."""
    for entry in entries:
        assert ADDRESSES[entry["host"]] == entry["address"], entry
    return [entry["host"] for entry in entries]


def test_ddp_across_hosts_with_no_interface_named(hosts, tmp_path: Path):
    spec = {"strategy": {"name": "ddp", "workers": 2}}
    placed = train_on(hosts, tmp_path, spec, "ddp")
    assert len(set(hosts_of(placed["workers"]))) == 2
    same_weights(local_run(tmp_path, spec, "ddp"), placed)


def test_parameter_averaging_with_its_server_and_workers_on_three_hosts(hosts, tmp_path: Path):
    strategy = {"name": "ps", "mode": "averaging", "workers": 2, "servers": 1, "local_steps": 3}
    placed = train_on(hosts, tmp_path, {"strategy": strategy}, "avg")
    where = hosts_of(placed["workers"]) + hosts_of(placed["ps"]["per_server"])
    assert sorted(where) == ["host-a", "host-b", "host-c"]
    assert placed["ps"]["data_plane"] == "gloo"  # tensors between hosts cross the link
    local = local_run(tmp_path, {"strategy": strategy}, "avg")
    assert local["ps"]["data_plane"] == "shm"  # on one host: shared memory
    same_weights(local, placed)


def test_async_parameter_server_across_three_hosts(hosts, tmp_path: Path):
    strategy = {"name": "ps", "mode": "async", "workers": 2, "servers": 1}
    placed = train_on(hosts, tmp_path, {"strategy": strategy}, "async")
    where = hosts_of(placed["workers"]) + hosts_of(placed["ps"]["per_server"])
    assert sorted(where) == ["host-a", "host-b", "host-c"]
    assert placed["ps"]["data_plane"] == "gloo"
    assert placed["ps"]["updates"] == 2 * placed["plan"]["total_steps"]


def test_a_pipeline_with_its_stages_on_two_hosts(hosts, tmp_path: Path):
    spec = {"strategy": {"name": "pipeline", "stages": 2, "microbatches": 4}}
    placed = train_on(hosts, tmp_path, spec, "pipe")
    assert len(set(hosts_of(placed["workers"]))) == 2
    same_weights(local_run(tmp_path, spec, "pipe"), placed)


def test_tensor_parallel_over_gloo_between_two_hosts(hosts, tmp_path: Path):
    spec = {"strategy": {"name": "tensor", "degree": 2}}
    placed = train_on(hosts, tmp_path, spec, "tensor")
    assert len(set(hosts_of(placed["workers"]))) == 2
    same_weights(local_run(tmp_path, spec, "tensor"), placed)


def test_a_sweeps_trial_slots_live_on_every_host(hosts, tmp_path: Path):
    spec = {"sweep": {"grid": {"optimizer.lr": [0.02, 0.05, 0.1]}}}
    code, output, out = on_cluster(hosts, tmp_path, "sweep", spec, "sweep", "--parallel", "3")
    assert code == 0, output
    trials = json.loads((out / "results.json").read_text())["trials"]
    assert [t["status"] for t in trials] == ["completed"] * 3
    assert sorted(t["runs"][0]["host"] for t in trials) == ["host-a", "host-b", "host-c"]


def test_streamed_shards_staged_once_on_each_hosts_own_disk(hosts, tmp_path: Path):
    api.convert_data("digits", tmp_path / "shards", shard_size="64KB")
    data = {
        "name": "webdataset",
        "urls": str(tmp_path / "shards" / "train-*.tar"),
        "val_urls": str(tmp_path / "shards" / "val-*.tar"),
        "shuffle_buffer": 200,
        "stage": str(hosts.local / "stage"),  # the same path, a different disk on each host
    }
    spec = {"model": {"name": "mlp"}, "data": data, "strategy": {"name": "ddp", "workers": 2}}
    placed = train_on(hosts, tmp_path, spec, "staged")
    used = set(hosts_of(placed["workers"]))
    assert len(used) == 2
    sources = sorted(p.name for p in (tmp_path / "shards").glob("*.tar"))
    for host in hosts.hosts:
        staged = sorted(p.name for p in (host.disk / "stage").rglob("*.tar"))
        assert staged == (sources if host.name in used else []), host.name
    per_worker = placed["plan"]["total_steps"] * placed["plan"]["batch_size"]
    assert [w["samples_read"] for w in placed["workers"]] == [per_worker, per_worker]
