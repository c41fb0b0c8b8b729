"""Parameter servers: averaging equals large-batch SGD, async/downpour train, stragglers, bounds."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.strategies.parent import role_names
from dlscale.strategies.ps import wire
from dlscale.strategies.ps.layout import shard_parameters
from dlscale.strategies.ps.wire import SHM_DIR, choose_data_plane
from tests.conftest import EXAMPLES
from tests.small_runs import SGD, base_spec, final_weights, synthetic_images

BASE = base_spec("ps-eq", synthetic_images(800), optimizer=SGD, device="cpu", seed=3)


def ps_spec(mode: str, **strategy) -> dict:
    return {"name": "ps", "mode": mode, **strategy}


def test_shards_are_balanced_by_size_and_never_split_a_tensor():
    sizes = [100, 60, 50, 10, 5, 1]
    shards = shard_parameters(sizes, 2)
    assert sorted(i for shard in shards for i in shard) == list(range(6))
    loads = [sum(sizes[i] for i in shard) for shard in shards]
    assert loads == [111, 115] or loads == [115, 111]  # largest first, to the lighter server
    assert shard_parameters(sizes, 1) == [list(range(6))]
    with pytest.raises(UserError, match="more than the model's 6 parameter tensors"):
        shard_parameters(sizes, 7)


def test_processes_are_named_by_role_in_errors():
    message = "worker 0 (pid 7) was killed by SIGKILL; then worker 2 failed: lost peer"

    def servers(rank: int) -> str:
        return f"server {rank}" if rank < 2 else f"worker {rank - 2}"

    assert role_names(message, servers) == (
        "server 0 (pid 7) was killed by SIGKILL; then worker 0 failed: lost peer"
    )


def test_ps_spec_is_validated_and_unused_settings_warned():
    with pytest.raises(UserError, match=r"straggler\.worker 3 does not exist"):
        parse_spec(
            {
                **BASE,
                "batch_size": 8,
                "strategy": {"name": "ps", "workers": 3, "straggler": {"worker": 3, "factor": 2}},
            }
        )
    spec = parse_spec({**BASE, "batch_size": 8, "strategy": ps_spec("async", local_steps=4)})
    assert "strategy.local_steps is ignored by ps mode 'async'" in spec.warnings()
    spec = parse_spec(
        {
            **BASE,
            "batch_size": 8,
            "optimizer": {"name": "adagrad", "lr": 0.01},
            "strategy": ps_spec("downpour", n_fetch=2),
        }
    )
    assert spec.strategy.n_fetch == 2 and spec.warnings() == []


def shm_files() -> set[Path]:
    return set(SHM_DIR.glob("dlscale-*")) if SHM_DIR.is_dir() else set()


def test_the_data_plane_is_shared_memory_only_on_one_host_with_room(monkeypatch, tmp_path):
    assert choose_data_plane("auto", hosts=1, needed_bytes=1 << 20) == ("shm", None)
    assert choose_data_plane("gloo", hosts=1, needed_bytes=1 << 20) == ("gloo", None)
    assert choose_data_plane("auto", hosts=2, needed_bytes=1 << 20) == ("gloo", None)
    plane, why = choose_data_plane("shm", hosts=2, needed_bytes=1 << 20)
    assert plane == "gloo" and "not possible (the processes run on 2 hosts); using gloo" in why
    plane, why = choose_data_plane("shm", hosts=1, needed_bytes=1 << 60)
    assert plane == "gloo" and re.search(r"MiB free and the buffers need [\d,]+ MiB", why)
    assert choose_data_plane("auto", hosts=1, needed_bytes=1 << 60) == ("gloo", None)
    monkeypatch.setattr(wire, "SHM_DIR", tmp_path / "missing")
    plane, why = choose_data_plane("shm", hosts=1, needed_bytes=1)
    assert plane == "gloo" and "does not exist here" in why


@pytest.mark.slow
@pytest.mark.parametrize("plane", ["shm", "gloo"])
def test_averaging_one_local_step_equals_one_process_at_n_times_b(tmp_path: Path, plane: str):
    """Plain SGD, local_steps 1: the mean of the workers' updated weights is exactly one SGD step
    on the union of their batches. Two servers, so the shards are reassembled too; on both data
    planes, and the shared buffers leave nothing behind in /dev/shm."""
    single = parse_spec({**BASE, "batch_size": 16, "steps": 12})
    ps = parse_spec(
        {
            **BASE,
            "batch_size": 8,
            "steps": 12,
            "strategy": ps_spec("averaging", workers=2, servers=2, data_plane=plane),
        }
    )
    api.train(single, out_dir=tmp_path / "single")
    before = shm_files()
    record = api.train(ps, out_dir=tmp_path / "ps")
    assert record.ps["data_plane"] == plane
    assert shm_files() <= before
    reference, averaged = final_weights(tmp_path / "single"), final_weights(tmp_path / "ps")
    for name, expected in reference.items():
        difference = (averaged[name] - expected).norm() / expected.norm()
        assert difference <= 1e-5, (name, float(difference))
    stats = record.ps
    assert stats["mode"] == "averaging" and record.final.step == 12
    assert [s["updates"] for s in stats["per_server"]] == [12, 12]  # one average a step each
    assert sum(s["elements"] for s in stats["per_server"]) == 41_282
    assert all(w.steps == 12 and w.samples == 12 * 8 for w in record.workers)
    on_disk = json.loads((tmp_path / "ps" / "run.json").read_text())
    assert on_disk["ps"]["per_server"] == stats["per_server"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["averaging", "async", "downpour"])
def test_digits_examples_reach_93_percent(tmp_path: Path, mode: str, request):
    if mode == "async":  # trained once a session: a fault test compares with it too
        output, record = request.getfixturevalue("ps_async_digits")
    else:
        result = CliRunner().invoke(
            app, ["train", str(EXAMPLES / f"ps-{mode}-digits.yaml"), "--out", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
        output, record = result.output, json.loads((tmp_path / "run.json").read_text())
    assert record["final"]["val_accuracy"] >= 0.93, record["final"]
    stats = record["ps"]
    assert stats["workers"] == 3 and len(record["workers"]) == 3
    assert stats["updates_per_s"] > 0 and stats["bytes_per_s"] > 0
    if mode == "averaging":
        assert stats["staleness_histogram"] == {}
    else:  # every push recorded its staleness; with 3 workers some are stale
        pushes = sum(w["steps"] for w in record["workers"]) // (2 if mode == "downpour" else 1)
        assert sum(stats["staleness_histogram"].values()) == pushes * stats["servers"]
        assert stats["max_staleness"] >= 1
    assert "parameter servers" in output and mode in output
    # Accuracy against wall time, for comparisons; the last point is the final model's.
    assert [e["epoch"] for e in record["epochs"]] == list(range(1, 21))
    assert record["epochs"][-1]["val_accuracy"] == record["final"]["val_accuracy"]


def straggler_run(tmp_path: Path, name: str, mode: str, **strategy) -> dict:
    spec = parse_spec(
        {
            **BASE,
            "name": name,
            "batch_size": 16,
            "steps": 40,
            "strategy": ps_spec(
                mode, workers=2, **strategy, straggler={"worker": 1, "factor": 4.0}
            ),
        }
    )
    return api.train(spec, out_dir=tmp_path / name).ps


@pytest.mark.slow
def test_a_straggler_holds_back_synchronous_training_but_not_asynchronous(tmp_path: Path):
    """Counted, not timed: how far the fast worker got ahead of the straggler (worker 1, four
    times slower) in pushes or averaging rounds, as the servers saw it."""
    synchronous = straggler_run(tmp_path, "avg", "averaging")
    asynchronous = straggler_run(tmp_path, "async", "async")
    bounded = straggler_run(tmp_path, "ssp", "async", max_staleness=1)
    # Averaging: nobody starts round r + 1 before everyone has finished round r.
    assert synchronous["max_clock_gap"] <= 1, synchronous["max_clock_gap"]
    # A staleness bound of 1: a worker more than one push ahead waits before its next pull.
    assert bounded["max_clock_gap"] <= 2, bounded["max_clock_gap"]
    assert sum(s["staleness_wait_s"] for s in bounded["per_server"]) > 0
    # Async: the fast worker never waits, so it runs further ahead than the bound ever allows.
    assert asynchronous["max_clock_gap"] > 2, asynchronous["max_clock_gap"]


@pytest.mark.slow
def test_one_async_worker_equals_one_process(tmp_path: Path):
    """DESIGN's invariant: with one worker nothing is stale, and the server's SGD step on each
    pushed gradient is the step one process takes."""
    single = parse_spec({**BASE, "batch_size": 16, "steps": 12})
    ps = parse_spec(
        {**BASE, "batch_size": 16, "steps": 12, "strategy": ps_spec("async", workers=1)}
    )
    api.train(single, out_dir=tmp_path / "single")
    record = api.train(ps, out_dir=tmp_path / "ps")
    assert record.ps["staleness_histogram"] == {"0": 12}
    reference, served = final_weights(tmp_path / "single"), final_weights(tmp_path / "ps")
    for name, expected in reference.items():
        difference = (served[name] - expected).norm() / expected.norm()
        assert difference <= 1e-5, (name, float(difference))


def test_more_servers_than_tensors_is_one_line(tmp_path: Path):
    spec = parse_spec(
        {
            **BASE,
            "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
            "batch_size": 8,
            "steps": 2,
            "strategy": ps_spec("async", servers=5),
        }
    )
    with pytest.raises(UserError, match=r"strategy\.servers 5 is more than"):
        api.train(spec, out_dir=tmp_path)
