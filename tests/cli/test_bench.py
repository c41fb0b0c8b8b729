"""`dlscale bench`: the measurements, the `local` hardware entry, the JSON and PNG, the CLI.

Timings on a shared machine are noisy, so speeds are only checked to be positive and finite;
what is checked exactly is everything computed from them (FLOP counts, peaks, shares, markers).
The pure parts (FLOP counts, cache sizes, the per-sample dataset) are in tests/unit/test_bench.py.
"""

import copy
import io
import json
import math
import multiprocessing
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale.bench import matmul as matmul_bench
from dlscale.bench import width as width_bench
from dlscale.bench.loader import run_loader_bench
from dlscale.bench.machine import machine_hardware, run_machine_bench
from dlscale.bench.matmul import matmul_flops, run_matmul_bench
from dlscale.bench.output import write_outputs
from dlscale.bench.width import memory_estimate_bytes, parameter_count, run_width_bench
from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.hardware import get_hardware, local_entry_path, save_local
from dlscale.jobspec import parse_spec

MiB = 2**20
runner = CliRunner()


@pytest.fixture
def dlscale_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("DLSCALE_HOME", str(home))
    return home


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_measurement() -> dict:
    """One real `--quick` measurement of this CPU (small products and tensors, short timings:
    every probe runs), for the test of what it holds and the test of the command that prints it.
    Its fixed probes (shapes, convolutions, attention, Adam, the link) take most of a minute
    whatever the sizes, so it is taken once."""
    return run_machine_bench(
        sizes=[32, 64], quick=True, device="cpu", bandwidth_bytes=8 * MiB, min_run_time_s=0.02
    )


def test_machine_bench_saves_a_local_entry_the_catalogue_loads(dlscale_home, quick_measurement):
    result = copy.deepcopy(quick_measurement)
    assert result["quick"] is True and result["device"] == "cpu"
    assert {row["precision"] for row in result["matmul"]} == {"fp64", "fp32", "bf16"}
    for row in result["matmul"]:
        assert row["flops_per_s"] == pytest.approx(matmul_flops(row["size"]) / row["time_s"])
        assert 0 < row["flops_per_s"] < math.inf
    for precision, peak in result["peak_flops"].items():
        rows = [r for r in result["matmul"] if r["precision"] == precision]
        assert peak == max(r["flops_per_s"] for r in rows)
    bandwidth = result["bandwidth"]
    assert bandwidth["tensor_bytes"] == 8 * MiB
    assert bandwidth["copy_bytes_per_s"] > 0 and bandwidth["triad_bytes_per_s"] > 0
    assert 0 < result["op_overhead_s"]["add_s"] < 0.01 and result["host_link"] is None
    # Rates are only checked to be real numbers: the attention probes and the matmul peak run at
    # different moments, so on a loaded machine their ratio says nothing about the code.
    for kind in ("causal", "full"):  # fused attention by keys per query
        for phase in ("forward", "backward"):
            curve = result["attention_flops_per_s"][kind][phase]
            assert {keys for keys, _ in curve} <= {64, 256, 1024} and curve
            assert all(0 < rate < math.inf for _, rate in curve)

    path = save_local(machine_hardware(result))
    assert path == local_entry_path() and path.is_relative_to(dlscale_home)
    local = get_hardware("local")
    assert local.kind == "cpu" and local.display_name.startswith("this machine: ")
    assert local.peak_flops == pytest.approx(result["peak_flops"])
    best = max(bandwidth["copy_bytes_per_s"], bandwidth["triad_bytes_per_s"])
    assert local.memory_bandwidth_bytes_per_s == pytest.approx(best)
    # The roofline's per-op term is the cost of an op inside a training step, which includes
    # autograd and the optimizer, so it is dearer than a bare dispatch.
    assert local.op_overhead_s == pytest.approx(result["training_op_overhead_s"])
    assert local.op_overhead_s > result["op_overhead_s"]["add_s"]
    # dlscale's own loop per step: a real epoch of a tiny model less its bare steps, added to
    # every step predicted on the entry.
    loop = result["loop"]
    assert loop["probe_step_s"] > 0 and loop["bare_step_s"] > 0 and loop["loop_step_s"] >= 0
    assert local.overhead_per_step_s == pytest.approx(loop["loop_step_s"])
    # What DDP adds to the same tiny model's bare step, in a one-process gloo group (its 5
    # linear layers: 10 tensors); the entry keeps the part beyond its reducer's ops (a copy a
    # tensor, a division a bucket).
    assert loop["ddp_probe_step_s"] > 0 and loop["ddp_bare_step_s"] > 0
    assert loop["ddp_step_s"] >= 0 and loop["ddp_probe_tensors"] == 10 and loop["ddp_bucket_view"]
    assert local.dispatch_s == pytest.approx(result["op_overhead_s"]["add_s"])
    assert local.ddp_fixed_step_s == pytest.approx(
        max(0.0, loop["ddp_step_s"] - 11 * local.dispatch_s)
    )
    assert local.compute_efficiency == 1.0 and local.memory_efficiency == 1.0
    assert local.memory_bytes == result["memory_bytes"]
    fp32_at_64 = next(r for r in result["matmul"] if (r["precision"], r["size"]) == ("fp32", 64))
    measured = local.measured["matmul_flops_per_s"]["fp32"]["64"]
    assert measured == pytest.approx(fp32_at_64["flops_per_s"])
    assert local.sources[0].startswith("measured by dlscale bench machine on ")
    keys, rate = result["attention_flops_per_s"]["full"]["forward"][0]
    assert local.attention_rate("fp32", 1e6, keys, False) == pytest.approx(rate)
    # Products by shape: every combination of 4, 32, 256, 2,048 and 8,192 for M, K and N up to
    # 256 × 2,048 × 2,048 multiply-adds (the 2048³ square is not, 32 × 2,048 × 8,192 is), kept in
    # the entry, where a product at a grid point runs at that point's rate.
    grid = result["matmul_shape_flops_per_s"]
    sides = (4, 32, 256, 2048, 8192)
    shapes = {(m, k, n) for m in sides for k in sides for n in sides if m * k * n <= 2**30}
    assert {tuple(point[:3]) for point in grid} == shapes and len(grid) == len(shapes) == 105
    assert (2048, 2048, 2048) not in shapes and (32, 2048, 8192) in shapes
    assert all(0 < point[3] < math.inf for point in grid)
    m, k, n, rate = grid[1]
    assert local.gemm_rate("fp32", m, k, n) == pytest.approx(rate)
    # The same shapes timed with their operands evicted (a write of twice the last-level
    # cache before each call): what a step whose state passes the cache is priced at.
    cold, cache = result["matmul_shape_cold_flops_per_s"], result["last_level_cache_bytes"]
    if cache is None:  # a machine whose cache size nothing states: no cold grid, all hot
        assert cold is None and not local.reads_cold(2**40)
    else:
        assert [point[:3] for point in cold] == [point[:3] for point in grid]
        assert all(0 < point[3] < math.inf for point in cold)
        expected = min(rate, cold[1][3])  # never faster cold than hot
        assert local.gemm_rate("fp32", m, k, n, cold=True) == pytest.approx(expected)
        # As much of the cache as the copies by working set found this process holds: a
        # doubling from 1 MiB, the cache itself, or none; a step past it is priced cold.
        # (A cache under 1 MiB has no such probe: the reported size stands.)
        sizes = [size for size, _ in result["cache_copy_bytes_per_s"] or []]
        assert sizes[:-1] == [MiB * 2**i for i in range(len(sizes) - 1)]
        assert sizes[-1:] == ([cache] if cache >= MiB else [])
        held = result["effective_cache_bytes"]
        assert held in (0, *sizes) if sizes else held is None
        held = cache if held is None else held
        assert local.reads_cold(held + 1) and not local.reads_cold(held)
    # Adam's update in a training step, by one tensor's working set: 1 MiB (cached) to 256 MiB.
    curve = result["optimizer_efficiency"]
    sizes = [size for size, _ in curve]
    assert sizes == sorted(sizes) and sizes[0] < 2 * MiB and sizes[-1] >= 256 * MiB
    assert all(0 < share <= 20 for _, share in curve)
    assert local.op_efficiency("addcdiv_", sizes[0]) == pytest.approx(curve[0][1])
    assert 0 < local.op_efficiency("addcdiv_") <= 1.0  # the streaming share, for model layers
    # Each probe was timed in rounds: the spread is kept with the entry, and shown as the
    # uncertainty of a prediction on it; a worse measurement does not replace it.
    assert result["spread"]["probes"] > 10 and result["spread"]["worst"] >= 0
    assert local.measured["spread"] == pytest.approx(result["spread"])
    assert local.measured["link"]["bytes_per_s"] > 0  # two local processes, gloo
    # The same all-reduce beside compute over alone: the contention the scaling model prices.
    assert local.measured["link"]["contention"] >= 1
    from dlscale.api.bench import worse_than_saved
    from dlscale.api.profiling import ProfileRequest, profile, profile_json

    assert worse_than_saved(result) is None  # the same quality: not worse
    assert result["rejected"] == []  # products up to n = 64 say nothing of the peak: no check
    doubtful = {**result, "suspect": [*result["suspect"], "training_op_overhead_s"]}
    assert "values rejected or doubtful against" in worse_than_saved(doubtful)
    profiled = profile(ProfileRequest("lenet", hardware=("local",)))
    shown = profile_json(profiled)["hardware"][0]
    assert shown["step_spread"] == pytest.approx(result["spread"]["median"])
    assert shown["loop_s"] == pytest.approx(loop["loop_step_s"])
    parts = ("forward_s", "backward_s", "optimizer_s", "h2d_s", "loop_s")
    assert shown["step_s"] == pytest.approx(sum(shown[part] for part in parts))
    # LeNet's products run on the measured matmul and conv curves: measured phases are counted.
    assert shown["phase_sources"]["measured"] > 0

    link = {f"{m}_{d}_bytes_per_s": 1e10 for m in ("pinned", "pageable") for d in ("h2d", "d2h")}
    link["pinned_h2d_bytes_per_s"] = 2.5e10
    gpu_like = {**result, "kind": "gpu", "vendor": "NVIDIA", "host_link": link}
    save_local(machine_hardware(gpu_like))
    local = get_hardware("local")
    assert local.kind == "gpu" and local.host_link_bytes_per_s == pytest.approx(2.5e10)
    assert local.measured["host_link"]["pageable_d2h_bytes_per_s"] == pytest.approx(1e10)


def test_matmul_bench_without_gpu_writes_json_and_png(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run_matmul_bench([32, 64], "fp32", min_run_time_s=0.02)
    json_path, png_path = write_outputs("matmul", result, tmp_path / "out")
    record = json.loads(json_path.read_text())
    assert record["gpu_available"] is False and "no CUDA GPU" in record["note"]
    assert [row["size"] for row in record["rows"]] == [32, 64]
    assert all(row["gpu_time_s"] is None and row["cpu_flops_per_s"] > 0 for row in record["rows"])
    assert record["gpu_wins_from_size"] is None and is_png(png_path)
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        run_matmul_bench([32], "fp8")


def fake_matmul_time_s(n, precision, device, min_run_time_s, with_transfer=False):
    """A CPU at 100 GFLOP/s; a GPU at 10 TFLOP/s with 10 µs launch cost; copies at 10 GB/s."""
    if device.type == "cpu":
        return n**3 / 1e11
    copies_s = 3 * 4 * n * n / 1e10 if with_transfer else 0.0  # a, b there; the result back
    return 1e-5 + n**3 / 1e13 + copies_s


def test_matmul_crossover_with_a_gpu(tmp_path, monkeypatch):
    """The GPU path, timed by a model: with copies the GPU wins at a larger size than without."""
    monkeypatch.setattr(matmul_bench, "time_matmul_s", fake_matmul_time_s)
    monkeypatch.setattr(matmul_bench, "MAX_CPU_PRODUCT_S", 1e-3)  # n = 512 takes 1.3 ms
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Model GPU")
    monkeypatch.setattr(matmul_bench, "available_memory_bytes", lambda device: 16 * 2**30)
    args = ["bench", "matmul", "--sizes", "64,128,256,512,1024", "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "matmul.json").read_text())
    # n = 64: GPU 10.0 µs > CPU 2.6 µs. n = 128: GPU 10.2 µs < CPU 21 µs, but the copies add
    # 12·128²/1e10 s = 19.7 µs (29.9 µs in all). n = 256: 90 µs with copies < CPU 168 µs.
    assert record["gpu_wins_from_size"] == 128
    assert record["gpu_wins_with_transfer_from_size"] == 256
    last = record["rows"][-1]
    assert last["cpu_time_s"] is None and last["gpu_time_s"] == pytest.approx(1e-5 + 1024**3 / 1e13)
    assert "CPU not timed from n = 1024" in record["note"]
    assert "GPU faster from n = 128" in " ".join(result.stdout.split())
    assert is_png(tmp_path / "matmul.png")


def test_loader_bench_rows_per_worker_count(tmp_path: Path):
    spec = parse_spec(
        {
            "name": "tiny-loader",
            "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
            "data": {"name": "synthetic", "shape": [3, 8, 8], "num_samples": 200},
            "batch_size": 16,
            "device": "cpu",
        }
    )
    result = run_loader_bench(spec, workers=[0, 1], steps=6)
    rows = result["rows"]
    assert [(r["loading"], r["workers"]) for r in rows] == [
        ("in-memory", 0),
        ("per-sample", 0),
        ("per-sample", 1),
    ]
    for row in rows:
        assert row["samples_per_s"] > 0 and row["steps"] == 6 and row["pin_memory"] is False
        # its steps' spread (90th over 10th percentile, less 1), and whether that is noisy
        assert row["step_spread"] >= 0 and row["noisy"] == (row["step_spread"] > 0.25)
        shares = (row["data_wait_share"], row["h2d_share"], row["compute_share"])
        assert all(0 <= share <= 1 for share in shares)
        assert sum(shares) == pytest.approx(1.0)
    assert "pin_memory" in result["note"]
    assert multiprocessing.active_children() == []  # the DataLoader workers have exited
    json_path, png_path = write_outputs("loader", result, tmp_path)
    assert len(json.loads(json_path.read_text())["rows"]) == 3 and is_png(png_path)
    with pytest.raises(UserError, match="steps must be at least"):
        run_loader_bench(spec, workers=[0], steps=2)


def test_width_bench_marks_the_cache_and_skips_what_would_not_fit(tmp_path, monkeypatch):
    # A cache just too small for width 32's training state, and free memory for width 32 only.
    cache = 16 * parameter_count(16) + 1
    monkeypatch.setattr(width_bench, "last_level_cache_bytes", lambda device: cache)
    free = 2 * memory_estimate_bytes(32, 8)
    monkeypatch.setattr(width_bench, "available_memory_bytes", lambda device: free)
    result = run_width_bench([16, 32, 64], batch_size=8, device="cpu", min_run_time_s=0.02)
    rows = {row["width"]: row for row in result["rows"]}
    for width in (16, 32):
        row = rows[width]
        assert row["state_bytes"] == 16 * parameter_count(width) and row["skipped"] is None
        assert row["flops_per_s"] == pytest.approx(row["flops"] / row["step_time_s"])
        assert row["time_per_parameter_s"] == pytest.approx(row["step_time_s"] / row["parameters"])
    assert rows[64]["step_time_s"] is None and " free" in rows[64]["skipped"]
    assert result["state_exceeds_cache_from_width"] == 32
    assert result["weight_matrix_exceeds_cache_from_width"] is None  # 4·64² B < cache
    json_path, png_path = write_outputs("width", result, tmp_path)
    assert json.loads(json_path.read_text())["rows"][2]["skipped"] and is_png(png_path)
    # A row whose steps spread past 25% is marked noisy (a ±3104% row's GFLOP/s was shown bare)
    from rich.console import Console

    from dlscale.cli.bench import width_table

    rows[16]["step_spread"], rows[32]["step_spread"] = 31.04, 0.05
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(width_table(result))
    lines = console.export_text().splitlines()
    (w16,) = [line for line in lines if line.lstrip("│ ").startswith("16 ")]
    (w32,) = [line for line in lines if line.lstrip("│ ").startswith("32 ")]
    assert "±3104%" in w16 and "noisy" in w16 and "noisy" not in w32
    assert "rerun on an idle machine" in " ".join(" ".join(lines).split())


def test_cli_machine_quick_writes_files_and_saves_nothing(
    tmp_path, dlscale_home, monkeypatch, quick_measurement
):
    """The command around the measurement: what `--quick` asks for, the tables, the files, and
    `--no-save` kept. The measurement is the module's real quick one (what it holds is checked
    above), handed back by the function the command calls."""
    from dlscale.api import bench as api_bench

    asked = []

    def measured(**options):
        asked.append(options)
        return copy.deepcopy(quick_measurement)

    monkeypatch.setattr(api_bench, "bench_machine", measured)
    args = ["bench", "machine", "--quick", "--no-save", "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert asked == [{"quick": True, "device": "auto", "threads": None}]
    assert "peak matmul fp32" in result.stdout and "not saved" in result.stdout
    record = json.loads((tmp_path / "machine.json").read_text())
    assert record["peak_flops"]["fp32"] > 0 and is_png(tmp_path / "machine.png")
    assert not local_entry_path().exists()


def test_machine_bench_runs_at_the_threads_asked_and_gives_them_back(monkeypatch):
    """`bench machine --threads 1` calibrates what a spec with `threads: 1` trains with; the
    caller's own thread count comes back after, as after a run."""
    from dlscale.api import bench as api_bench
    from dlscale.bench import machine as machine_bench

    before = torch.get_num_threads()
    during = []
    monkeypatch.setattr(
        machine_bench,
        "run_machine_bench",
        lambda **options: during.append(torch.get_num_threads()) or {"threads": during[-1]},
    )
    asked = 2 if before == 1 else 1  # not the count the process already has
    assert api_bench.bench_machine(quick=True, device="cpu", threads=asked) == {"threads": asked}
    assert api_bench.bench_machine(quick=True, device="cpu") == {"threads": before}
    assert during == [asked, before] and torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["matmul", "--sizes", "abc"], "--sizes: 'abc' is not an integer"),
        (["matmul", "--sizes", "64,0"], "--sizes: 0 is below the minimum of 1"),
        (["width", "--widths", "-8"], "--widths: -8 is below the minimum of 1"),
        (["width", "--batch", "0"], "--batch: must be a positive integer"),
        (["machine", "--threads", "0"], "--threads: must be a positive integer"),
        (["machine", "--device", "tpu"], "bench machine measures cpu or cuda devices, not 'tpu'"),
        (["machine", "--device", "gpu:0"], "bench machine measures cpu or cuda devices"),
        (["loader", "--workers", "0,x"], "--workers: 'x' is not an integer"),
        (["loader", "--workers", "0,2,0"], "--workers: 0 is given twice"),
        (["width", "--widths", "8,16,8"], "--widths: 8 is given twice"),
        (["width", "--widths", "8", "--threads", "4096"], "--threads 4096 is more than the"),
        (["matmul", "--sizes", "64,64"], "--sizes: 64 is given twice"),
    ],
)
def test_cli_bad_arguments_are_one_line_and_exit_2(args, expected):
    result = runner.invoke(app, ["bench", *args])
    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    if args[0] == "machine":  # refused before it says it measures
        assert "measuring" not in result.stdout


def test_batch_bench_stops_before_memory_runs_out(tmp_path, monkeypatch):
    """Rows up to the budget are measured; the first predicted over it ends the sweep unrun."""
    from dlscale.bench import batch as batch_bench

    monkeypatch.setattr(batch_bench, "available_memory_bytes", lambda device: 64 * 2**20)
    result = batch_bench.run_batch_bench("mlp", [4, 16, 1 << 20, 1 << 21], {"hidden": [8]}, 2, 0.5)
    rows = result["rows"]
    assert [row["batch_size"] for row in rows] == [4, 16, 1 << 20]  # 2**21 never tried
    assert [row["status"] for row in rows] == ["measured", "measured", "over memory budget"]
    assert rows[0]["measured_samples_per_s"] > 0 and rows[2]["measured_step_s"] is None
    assert rows[2]["predicted_memory_bytes"] > result["memory_budget_bytes"] == 32 * 2**20
    assert result["predicted_on"] is None and rows[0]["predicted_step_s"] is None
    json_path, png_path = write_outputs("batch", result, tmp_path)
    assert json_path.exists() and png_path.stat().st_size > 10_000


def test_a_bench_never_replaces_an_earlier_result_in_its_out_folder(tmp_path, dlscale_home):
    """A second bench into the same --out is refused before it measures (one line, exit 2):
    the first one's JSON and plot stay as they were. Another bench's results may share it."""
    out = tmp_path / "results"
    first = runner.invoke(app, ["bench", "matmul", "--sizes", "8", "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    again = runner.invoke(app, ["bench", "matmul", "--sizes", "16", "--out", str(out)])
    assert again.exit_code == 2
    assert f"--out {out} already holds matmul.json" in " ".join(again.stderr.split())
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    (out / "matmul.json").unlink()  # a plot alone is a result too
    assert runner.invoke(app, ["bench", "matmul", "--sizes", "8", "--out", str(out)]).exit_code == 2


def test_batch_bench_takes_every_zoo_model_and_a_factory_with_its_shape(tmp_path, monkeypatch):
    """The defects: `bench batch --model lstm` (a zoo model: a sequence classifier) was fed
    next-token targets and refused (`expected (1, 64, 256)`); a package.module:factory, which
    --help offers, was told to give --input-shape, an option bench batch had not."""
    (tmp_path / "tiny_factory.py").write_text(
        "import torch\n"
        "def build(num_classes=10):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from dlscale.bench import batch as batch_bench

    lstm = batch_bench.run_batch_bench("lstm", [2], None, 1, 0.5)
    assert [row["status"] for row in lstm["rows"]] == ["measured"]
    factory = runner.invoke(
        app,
        [
            "bench",
            "batch",
            "--model",
            "tiny_factory:build",
            "--input-shape",
            "3x2x2",
            "--batches",
            "1,2",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert factory.exit_code == 0, factory.output
    saved = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert saved["input_shape"] == [3, 2, 2] and len(saved["rows"]) == 2


def test_bench_loader_refuses_data_read_from_disk_in_one_line(tmp_path):
    """The defect: `bench loader --spec` of a WebDataset spec ended in a traceback
    (`'WebDatasetStream' object has no attribute 'tensors'`): it times per-sample loading of
    a data set held in memory. Too many workers no longer offers --cluster ray, which it has
    not."""
    spec = tmp_path / "wds.yaml"
    spec.write_text(
        "name: wds\nmodel: {name: mlp}\nbatch_size: 8\n"
        f"data: {{name: webdataset, urls: '{tmp_path}/train-000000.tar', num_classes: 4}}\n"
    )
    result = runner.invoke(app, ["bench", "loader", "--spec", str(spec), "--steps", "8"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert "reads its data (webdataset) from disk" in said and "dlscale bench io" in said
    many = runner.invoke(app, ["bench", "loader", "--workers", "0,1000", "--steps", "8"])
    assert many.exit_code == 2 and "use fewer" in many.stderr
    assert "--cluster" not in many.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["levels", "SPEC", "--max-threads", "0"], "--max-threads must be at least 1 (got 0)"),
        (["sparsity", "SPEC", "--finetune-steps", "-1"], "--finetune-steps: must be 0 or more"),
        (["sparsity", "SPEC", "--levels", "0,0.5,0.5"], "--levels: 0.5 is given twice"),
    ],
)
def test_counts_the_benches_took_silently_are_refused(tmp_path, args, expected):
    """The defects: `--max-threads 0` ran (as the cores' count) while -1 was refused; a
    negative --finetune-steps was run and recorded; a level given twice was measured twice."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 8\n")
    args = [str(spec) if arg == "SPEC" else arg for arg in args]
    result = runner.invoke(app, ["bench", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.stderr.split())
    assert not (tmp_path / "out").exists()


def test_the_loader_table_marks_a_noisy_row_and_says_so():
    """The defect: the same `bench loader` gave 609 and 98,097 samples/s on one setting, run
    to run, with no spread shown: each row now shows its steps' spread and a noisy one says
    so, with the caption's advice."""
    from rich.console import Console

    from dlscale.cli.bench import loader_table

    row = {
        "loading": "in-memory",
        "workers": 0,
        "pin_memory": False,
        "samples_per_s": 609.0,
        "step_time_s": 0.105,
        "step_spread": 3.2,
        "noisy": True,
        "data_wait_share": 0.07,
        "h2d_share": 0.0,
        "compute_share": 0.93,
    }
    result = {
        "spec": "s",
        "model": "mlp",
        "batch_size": 64,
        "device": "cpu",
        "warmup_steps_excluded": 5,
        "note": None,
        "rows": [row],
    }
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(loader_table(result))
    text = " ".join(console.export_text().split())
    assert "±320% noisy" in text and "rerun on an idle machine" in text
