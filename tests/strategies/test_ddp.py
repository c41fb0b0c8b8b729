"""Synchronous data parallel against its reference: N workers at batch B == one process at N·B."""

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from tests.conftest import EXAMPLES
from tests.small_runs import SGD, base_spec, final_weights, synthetic_images

BASE = base_spec("ddp-eq", synthetic_images(800), steps=12, optimizer=SGD, device="cpu", seed=3)


@pytest.mark.slow
def test_two_workers_at_batch_b_equal_one_process_at_2b(tmp_path: Path):
    single = parse_spec({**BASE, "batch_size": 16})
    ddp = parse_spec({**BASE, "batch_size": 8, "strategy": {"name": "ddp", "workers": 2}})
    api.train(single, out_dir=tmp_path / "single")
    record = api.train(ddp, out_dir=tmp_path / "ddp")
    reference, parallel = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    for name, expected in reference.items():
        difference = (parallel[name] - expected).norm() / expected.norm()
        assert difference <= 1e-5, (name, float(difference))

    # What the run shows: global batch, per-worker figures, the allreduce payload (the gradients).
    assert record.plan.global_batch_size == 16 and record.final.step == 12
    dist = record.distributed
    assert dist["workers"] == 2 and dist["backend"] == "gloo"
    assert dist["allreduce_payload_bytes_per_step"] == 41_282 * 4  # every fp32 gradient, once
    assert dist["bytes_sent_per_worker_per_step"] == 41_282 * 4  # ring: 2(N−1)/N × payload
    assert [w.rank for w in record.workers] == [0, 1]
    assert all(w.steps == 12 and w.samples == 12 * 8 for w in record.workers)
    assert 0 < dist["allreduce_share"] < 1
    on_disk = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert on_disk["workers"] == record.to_json()["workers"]


@pytest.mark.slow
def test_ddp_digits_example_reaches_95_percent(tmp_path: Path):
    result = CliRunner().invoke(
        app, ["train", str(EXAMPLES / "ddp-digits.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "2 workers × 32" in " ".join(result.stdout.split())
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["final"]["val_accuracy"] >= 0.95


def test_a_port_in_use_is_one_line(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = parse_spec({**BASE, "batch_size": 8, "strategy": {"name": "ddp", "port": port}})
        with pytest.raises(UserError, match=f"port {port} on 127.0.0.1 is already in use"):
            api.train(spec, out_dir=tmp_path)


def test_single_strategy_refuses_a_cluster(tmp_path: Path):
    with pytest.raises(UserError, match="strategy 'single' runs in this process"):
        api.train(parse_spec({**BASE, "batch_size": 8}), out_dir=tmp_path, cluster="ray")


@pytest.mark.slow
def test_scale_runs_each_worker_count_and_plots(tmp_path: Path, monkeypatch):
    """With this machine measured (a stand-in `local` entry: a desktop CPU's figures, 1
    calibration thread, a gloo link of 1 GB/s and 0.5 ms), each row has its prediction."""
    from dataclasses import replace

    from dlscale.hardware.catalogue import get_hardware, save_local

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))  # the entry stays this test's
    link = {"bytes_per_s": 1e9, "latency_s": 5e-4, "fit_max_error": 0.1}
    save_local(
        replace(get_hardware("i7-7700k"), name="local", measured={"threads": 1, "link": link})
    )
    args = ["scale", str(EXAMPLES / "mlp-digits.yaml"), "--workers", "1,2", "--steps", "10"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "predicted" in result.output and "local-gloo" in " ".join(result.output.split())
    data = json.loads((tmp_path / "scale.json").read_text())
    rows = data["rows"]
    assert data["predicted_on"] == "local" and data["link"] == "local-gloo"
    one, two = rows
    assert one["predicted_efficiency"] == pytest.approx(1.0)
    assert 0 < two["predicted_efficiency"] < 1  # the all-reduce costs something
    # Against the predicted one-worker row, as the measured efficiency is against the measured
    # one (both pay DDP's own work), not against one device without DDP.
    per_worker = two["predicted_samples_per_s"] / 2
    assert two["predicted_efficiency"] == pytest.approx(per_worker / one["predicted_samples_per_s"])
    for row in rows:
        ratio = row["predicted_samples_per_s"] / row["samples_per_s"]
        assert row["predicted_over_measured"] == pytest.approx(ratio)
    assert [row["workers"] for row in rows] == [1, 2]
    assert [row["global_batch_size"] for row in rows] == [64, 128]
    assert rows[0]["efficiency"] == 1.0
    assert rows[1]["efficiency"] == pytest.approx(
        rows[1]["samples_per_s"] / (2 * rows[0]["samples_per_s"])
    )
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    assert (tmp_path / "workers-2" / "run.json").exists()


def test_local_workers_are_pinned_to_their_own_cores(monkeypatch):
    from dlscale.launch import local

    calls = []
    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(local.os, "sched_setaffinity", lambda pid, cores: calls.append(cores))
    local._pin_to_cores(local_rank=1, workers=2, threads=2)
    assert calls == [[2, 3]]
    local._pin_to_cores(local_rank=1, workers=4, threads=2)  # 8 cores wanted, 4 there: no pin
    monkeypatch.setenv("DLSCALE_PIN", "0")
    local._pin_to_cores(local_rank=0, workers=2, threads=1)
    assert calls == [[2, 3]]


def test_a_peer_that_lost_its_partner_is_one_line_and_a_defect_keeps_its_traceback(
    monkeypatch, capsys
):
    """The survivors of a killed worker fail too ('connection closed by peer'): the job names
    the dead one in one line, without the survivor's traceback (which once reached the user's
    terminal when the survivor reported first). A failure with no dead peer shows its trace."""
    import queue
    from types import SimpleNamespace

    from dlscale.launch import local

    monkeypatch.setattr(local, "DEATH_NOTICE_S", 0.2)
    dead, survivor = SimpleNamespace(exitcode=-9, pid=41), SimpleNamespace(exitcode=1, pid=42)
    trace = "Traceback (most recent call last):\n  RuntimeError: closed by peer\n"
    no_results = queue.Queue()  # no other worker reported: the dead peer is the cause
    failed = local._first_cause(
        [dead, survivor], no_results, 1, "RuntimeError: closed by peer", trace
    )
    assert str(failed).startswith("worker 0 (pid 41) was killed by SIGKILL")
    assert capsys.readouterr().err == ""
    failed = local._first_cause([survivor], no_results, 0, "ValueError: a defect", trace)
    assert str(failed) == "worker 0 failed: ValueError: a defect"
    assert capsys.readouterr().err == trace
