"""`bench width --memory-limit`: a real cgroup v1 memory cgroup made, limited, entered by the
child, read and removed (also when the block fails), and the bench run through it; skipped with
the reason where this machine cannot make one (no v1 memory controller, not root)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dlscale.bench import width_wall
from dlscale.bench.memory_cgroup import NoMemoryCgroup, limited, memory_hierarchy
from dlscale.bench.output import write_outputs
from dlscale.cli.bench import width_table
from dlscale.cli.main import app

MiB = 2**20
runner = CliRunner()


def hierarchy_or_reason() -> tuple[Path | None, str]:
    try:
        return memory_hierarchy(), ""
    except NoMemoryCgroup as why:
        return None, str(why)


PARENT, WHY_NOT = hierarchy_or_reason()
needs_cgroup = pytest.mark.skipif(PARENT is None, reason=f"no memory cgroup: {WHY_NOT}")


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def allocate(megabytes: int) -> list[str]:
    """A child that touches `megabytes` MiB, then prints its memory cgroup's path."""
    code = (
        f"block = bytearray({megabytes} * 2**20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "print([l for l in open('/proc/self/cgroup') if ':memory:' in l][0].strip())\n"
    )
    return [sys.executable, "-c", code]


@needs_cgroup
def test_a_child_in_the_cgroup_is_charged_there_and_killed_past_its_limit():
    name = "dlscale-test-wall"
    with limited(PARENT, name, 64 * MiB, 0) as (group, _):
        assert (group.folder / "memory.limit_in_bytes").read_text().strip() == str(64 * MiB)
        fits = subprocess.run(group.command(allocate(16)), capture_output=True, text=True)
        assert fits.returncode == 0, fits.stderr
        assert fits.stdout.strip().endswith(f"/{name}")  # the child ran inside it
        assert group.usage().peak_bytes >= 16 * MiB
        too_big = subprocess.run(group.command(allocate(256)), capture_output=True, text=True)
        assert too_big.returncode == -signal.SIGKILL  # no swap past the limit: killed
        assert group.usage().oom_kills >= 1
    assert not group.folder.exists()


@needs_cgroup
def test_the_cgroup_is_removed_with_what_runs_in_it_when_the_block_fails():
    name = "dlscale-test-wall-fails"
    with (
        pytest.raises(RuntimeError, match="a bench failed"),
        limited(PARENT, name, 64 * MiB, 0) as (group, _),
    ):
        sleeper = subprocess.Popen(group.command(["sleep", "60"]))
        deadline = time.monotonic() + 10
        while sleeper.pid not in group.pids() and time.monotonic() < deadline:
            time.sleep(0.01)  # until its shell has moved itself in (it then execs sleep)
        assert sleeper.pid in group.pids()
        raise RuntimeError("a bench failed")
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not group.folder.exists()


@pytest.mark.slow  # one child process importing torch: seconds, more on a busy machine
@needs_cgroup
def test_the_width_bench_times_each_width_in_the_limited_cgroup(tmp_path: Path):
    # Width 2 is timed in a child in a 600 MiB cgroup; width 100,000 needs ~2.4 TiB and is
    # skipped before a process starts. No swap: nothing is added to the machine.
    record = width_wall.run_wall_bench(
        [2, 100_000], 1, 600 * MiB, swap_bytes=0, min_run_time_s=0.01, threads=1
    )
    small, huge = record["rows"]
    assert small["step_time_s"] > 0 and small["memory"]["oom_kills"] == 0
    baseline = small["baseline_bytes"]
    assert 0 < baseline <= small["memory"]["peak_bytes"] <= 600 * MiB
    assert record["process_baseline_bytes"] == baseline
    ram = next(level for level in record["levels"] if level["name"] == "RAM")
    assert ram["bytes"] == 600 * MiB - baseline  # the limit less the process's own memory
    assert small["level"] in ("L1", "L2", "L3") and huge["level"] == "over the limit"
    assert huge["step_time_s"] is None and "over the 600 MiB limit + 0 B swap" in huge["skipped"]
    assert record["working_set_exceeds_from_width"]["RAM"] == 100_000
    # 60,000 MNIST samples at batch 1: 60,000 steps an epoch, a thousand epochs.
    assert small["thousand_epochs_s"] == pytest.approx(small["step_time_s"] * 60_000_000)
    console = Console(width=200, record=True)
    console.print(width_table(record))
    text = console.export_text()
    assert "1,000 epochs" in text and "RAM here: a cgroup of 600 MiB less the measuring" in text
    assert is_png(write_outputs("width", record, tmp_path)[1])
    assert not list(PARENT.glob("dlscale-width-*"))  # every width's cgroup removed


def test_without_a_memory_cgroup_the_bench_says_so_and_stays_in_free_memory(
    tmp_path: Path, monkeypatch
):
    def refuse():
        raise NoMemoryCgroup("cgroup /x is not writable by this user (run as root)")

    monkeypatch.setattr(width_wall, "memory_hierarchy", refuse)
    args = ["bench", "width", "--widths", "2", "--batch", "1", "--memory-limit", "100MiB"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert "no memory-limited cgroup here (cgroup /x is not writable" in line
    assert "within half the free memory" in line
    assert json.loads((tmp_path / "width.json").read_text())["rows"][0]["step_time_s"] > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--swap", "1GiB"], "--swap and --swap-dir take effect only with --memory-limit"),
        (["--memory-limit", "lots"], "--memory-limit: 'lots' is not a size"),
        (["--memory-limit", "1TiB"], "--memory-limit 1 TiB needs ~1 TiB, over 50% of the"),
        (["--dataset-size", "0"], "--dataset-size: must be a positive integer (got 0)"),
        (["--threads", "0"], "--threads: must be a positive integer (got 0)"),
    ],
)
def test_bad_memory_wall_options_are_one_line(tmp_path: Path, args, expected):
    result = runner.invoke(app, ["bench", "width", "--widths", "2", *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert expected in line
