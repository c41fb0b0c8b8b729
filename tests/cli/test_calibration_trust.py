"""A calibration measured on a busy machine never becomes the `local` entry predictions use, and
every prediction names the calibration it used and how far to trust it.

The readings are injected (a result as `bench machine` returns it, with the figures a busy
machine gives), so nothing here depends on how loaded the test machine is.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.api import bench
from dlscale.api.profiling import ProfileRequest, profile, profile_json
from dlscale.bench import plausible
from dlscale.bench.machine import machine_hardware
from dlscale.cli.main import app
from dlscale.hardware import get_hardware, local_entry_path, save_local, trust

runner = CliRunner()
IDLE = {"training_op_overhead_s": 20e-6, "spread": {"median": 0.02, "worst": 0.08, "probes": 40}}
# What the issue saw: 100 ms an op in a training step against 1 µs a bare op (234 ms predicted
# for a LeNet step measured at 3 ms), and probes whose rounds never agreed.
BUSY = {"training_op_overhead_s": 0.1, "spread": {"median": 0.45, "worst": 2.0, "probes": 40}}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def machine_result(readings: dict) -> dict:
    """A `bench machine` result of a small CPU with `readings` in place of the timed ones."""
    result = {
        "schema": "dlscale.bench.machine/1",
        "measured_at": "2026-11-27T05:00:00+00:00",
        "device": "cpu",
        "kind": "cpu",
        "name": "Test CPU",
        "vendor": "Test",
        "memory_bytes": 8 * 2**30,
        "last_level_cache_bytes": 2**20,
        "torch_version": "2.x",
        "threads": 2,
        "quick": True,
        "matmul": [
            {"precision": "fp32", "size": n, "time_s": 2 * n**3 / 1e10, "flops_per_s": 1e10}
            for n in (64, 256)
        ],
        "matmul_skipped_as_slow": {},
        "peak_flops": {"fp32": 1e10},
        "bandwidth": {"tensor_bytes": 2**26, "copy_bytes_per_s": 1e10, "triad_bytes_per_s": 1e10},
        "host_link": None,
        "op_overhead_s": {"add_s": 1e-6, "mm_s": 2e-6},
        "loop": {
            "loop_step_s": 2e-4,
            "bare_step_s": 1e-3,
            "probe_step_s": 1.2e-3,
            "probe_batch": 4,
        },
        "conv_flops_per_s": {"forward": [[200, 128, 1e9]], "backward": [[200, 128, 1e9]]},
        "attention_flops_per_s": {"full": {"forward": [[64, 1e9]], "backward": [[64, 1e9]]}},
        "op_efficiency": {"relu": 0.8},
        "optimizer_efficiency": [[1e6, 1.5], [2.6e8, 0.7]],
        "link": {"bytes_per_s": 1e9, "latency_s": 1e-5, "fit_max_error": 0.1},
        "elapsed_s": 1.0,
        "load": {"loadavg_1m_before": 0.1, "loadavg_1m_after": 2.0, "cores": 2},
    }
    result.update(json.loads(json.dumps(readings)))
    result["warnings"] = plausible.check(result)
    return result


def bench_machine(monkeypatch, readings: dict, *args: str):
    monkeypatch.setattr(bench, "bench_machine", lambda **_: machine_result(readings))
    # Wide enough that no path a test prints wraps, however long the temporary folder's name.
    return runner.invoke(app, ["bench", "machine", *args], env={"COLUMNS": "400"})


def test_the_verdict_on_a_calibration_reads_its_own_figures():
    assert trust.unreliable(machine_result(IDLE)) == []
    reasons = trust.unreliable(machine_result(BUSY))
    assert len(reasons) == 2 and all("\n" not in reason for reason in reasons)
    assert "100000 µs" in reasons[0] and "100000× a bare op's" in reasons[0]
    assert "median spread 45%" in reasons[1]
    # A saved entry's tables carry the same figures: an entry saved before this check is judged
    # the same way when a prediction reads it.
    saved = machine_hardware(machine_result(BUSY)).measured
    assert trust.unreliable(saved) == reasons


def test_an_unreliable_measurement_is_never_saved_as_local(home, tmp_path, monkeypatch):
    out = tmp_path / "out"
    result = bench_machine(monkeypatch, BUSY, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert not local_entry_path().exists()
    said = " ".join(result.stdout.split())
    assert "not saved as hardware 'local': its readings are unreliable" in said
    assert "Run 'dlscale bench machine' again when the machine is idle" in said
    assert "--force" in said and str(out / "machine.json") in said
    kept = json.loads((out / "machine.json").read_text())
    assert kept["unreliable"] == trust.unreliable(machine_result(BUSY))


def test_an_unreliable_measurement_keeps_the_saved_local_entry(home, tmp_path, monkeypatch):
    good = bench_machine(monkeypatch, IDLE, "--out", str(tmp_path / "good"))
    assert "saved as hardware 'local'" in good.stdout
    before = local_entry_path().read_bytes()
    busy = bench_machine(monkeypatch, BUSY, "--out", str(tmp_path / "busy"))
    assert busy.exit_code == 0 and local_entry_path().read_bytes() == before
    assert "the saved 'local' entry (measured 2026-11-27T05:00) is kept" in " ".join(
        busy.stdout.split()
    )


def test_a_forced_unreliable_entry_says_so_in_every_prediction(home, tmp_path, monkeypatch):
    forced = bench_machine(monkeypatch, BUSY, "--force", "--out", str(tmp_path / "o"))
    assert "saved as hardware 'local', marked unreliable" in " ".join(forced.stdout.split())
    local = get_hardware("local")
    calibration = trust.calibration(local)
    assert calibration["entry"] == "local" and calibration["reliable"] is False
    assert calibration["measured_at"] == "2026-11-27T05:00:00+00:00"
    profiled = profile(ProfileRequest("lenet", hardware=("local",)))
    shown = profile_json(profiled)["hardware"][0]
    assert shown["calibration"] == calibration
    text = runner.invoke(app, ["profile", "lenet", "--hardware", "local"])
    assert text.exit_code == 0, text.output
    assert "calibration 'local' (measured 2026-11-27T05:00, --quick): UNRELIABLE" in " ".join(
        text.stdout.split()
    )
    shown = runner.invoke(app, ["hardware", "show", "local"], env={"COLUMNS": "300"})
    assert "UNRELIABLE" in shown.stdout and "calibration 'local'" in shown.stdout
    # A datasheet entry has no calibration to name.
    assert trust.calibration(get_hardware("a100-40gb")) is None


def test_a_trusted_calibration_is_named_with_its_spread(home):
    save_local(machine_hardware(machine_result(IDLE)))
    line = trust.calibration_line(trust.calibration(get_hardware("local")))
    expected = "calibration 'local' (measured 2026-11-27T05:00, --quick): trusted, probes spread 2%"
    assert line == expected


def test_the_pipeline_planner_ignores_an_unreliable_calibration(home):
    """The busy entry made the planner split LeNet as conv1 alone against everything else."""
    from dlscale.strategies.pipeline.plan import local_calibration

    assert local_calibration() is None  # nothing measured: balanced by FLOPs
    save_local(machine_hardware(machine_result(BUSY)))
    assert local_calibration() is None
    save_local(machine_hardware(machine_result(IDLE)))
    assert local_calibration().name == "local"


def test_estimate_and_bench_batch_name_the_calibration_they_used(home, tmp_path):
    from dlscale.bench.batch import run_batch_bench

    save_local(machine_hardware({**machine_result(BUSY), "unreliable": ["busy"]}))
    spec = Path(__file__).parents[2] / "examples" / "mlp-digits.yaml"
    estimate = runner.invoke(app, ["estimate", str(spec), "--steps", "3", "--warmup", "1"])
    assert estimate.exit_code == 0, estimate.output
    assert "calibration 'local' (measured 2026-11-27T05:00, --quick): UNRELIABLE" in " ".join(
        estimate.stdout.split()
    )
    batch = run_batch_bench("lenet", [2], None, 1)
    assert batch["calibration"] == trust.calibration(get_hardware("local"))
    assert batch["calibration"]["reliable"] is False


def test_a_noisier_measurement_keeps_the_saved_entry_unless_forced(home, monkeypatch):
    """Both reliable (median spread under 10%), but 9% against 2%: the saved entry stays, and
    the one line says why; --force replaces it."""
    save_local(machine_hardware(machine_result(IDLE)))
    noisier = {**IDLE, "spread": {"median": 0.09, "worst": 0.3, "probes": 40}}
    noisier["loop"] = {**machine_result({})["loop"], "loop_step_s": 5e-4}
    said = " ".join(bench_machine(monkeypatch, noisier).stdout.split())
    assert "not saved: this measurement is worse than the saved 'local' entry (its probes " in said
    assert "spread 9% (median) against 2%)" in said
    assert get_hardware("local").overhead_per_step_s == pytest.approx(2e-4)  # the saved one
    forced = bench_machine(monkeypatch, noisier, "--force")
    assert forced.exit_code == 0 and "saved as hardware 'local'" in forced.stdout
    assert get_hardware("local").overhead_per_step_s == pytest.approx(5e-4)
