"""The memory-wall arithmetic of `bench width`, worked by hand: the working set, where it lives
(each cache, RAM, past it), the first width past each level, the 1,000-epoch estimate, and the
sysfs and /proc text the levels and the cgroup are read from."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.bench import swap_file
from dlscale.bench.machine import data_caches
from dlscale.bench.memory_cgroup import NoMemoryCgroup, memory_hierarchy, remove_stale_cgroups
from dlscale.bench.swap_file import PREFIX, NoSwap, bounded_swap, stale_swap_files
from dlscale.bench.width import crossings, level_of, memory_estimate_bytes, thousand_epochs_s
from dlscale.units import duration

KiB, MiB = 2**10, 2**20
LEVELS = [("L1", 32 * KiB), ("L2", 512 * KiB), ("L3", 32 * MiB), ("RAM", 300 * MiB)]


def test_the_working_set_is_training_state_and_activations_by_hand():
    # w = 2, batch 1, 784 inputs: Linear 784→2 (1,568 + 2), 2→2 (4 + 2), 2→10 (20 + 10):
    # 1,606 parameters × 16 B (weight, gradient, Adam's two moments) = 25,696 B; activations
    # 1 × (784 + 4·2 + 10) = 802 floats, kept and their gradients: 2 × 4 B × 802 = 6,416 B.
    assert memory_estimate_bytes(2, 1) == 25_696 + 6_416 == 32_112
    # w = 1024, batch 64: 1,863,690 parameters (784·1024 + 1024 + 1024² + 1024 + 10,240 + 10)
    # × 16 = 29,819,040 B; 64 × (784 + 4,096 + 10) × 8 = 2,503,680 B.
    assert memory_estimate_bytes(1024, 64) == 29_819_040 + 2_503_680


@pytest.mark.parametrize(
    ("working_set", "level"),
    [
        (32_112, "L1"),
        (32 * KiB, "L1"),  # exactly the cache's size still fits
        (32 * KiB + 1, "L2"),
        (30 * MiB, "L3"),
        (32 * MiB + 1, "RAM"),
        (300 * MiB + 1, "swap"),
    ],
)
def test_a_working_set_lives_in_the_smallest_level_it_fits(working_set, level):
    assert level_of(working_set, LEVELS, "swap") == level


def test_the_first_width_past_each_level():
    rows = [
        {"width": 2, "memory_estimate_bytes": 32_112},  # L1
        {"width": 64, "memory_estimate_bytes": 900 * KiB},  # past L2
        {"width": 2048, "memory_estimate_bytes": 93 * MiB},  # past L3
        {"width": 4096, "memory_estimate_bytes": 306 * MiB},  # past RAM
    ]
    assert crossings(rows, LEVELS) == {"L1": 64, "L2": 64, "L3": 2048, "RAM": 4096}
    assert crossings(rows[:1], LEVELS) == dict.fromkeys(["L1", "L2", "L3", "RAM"])


def test_a_thousand_epochs_is_step_time_by_steps_an_epoch_by_a_thousand():
    # 60,000 samples at batch 64: 937.5 → 938 steps (the last batch is partial); 0.2 s a step.
    assert thousand_epochs_s(0.2, 60_000, 64) == pytest.approx(0.2 * 938 * 1000) == 187_600
    assert thousand_epochs_s(2.39, 60_000, 1) == pytest.approx(2.39 * 60_000_000)
    assert duration(187_600) == "2.2 days"  # 187,600 / 86,400
    assert duration(36 * 3600) == "36.00 h"  # under two days: hours


def test_the_data_caches_are_read_from_sysfs_innermost_first(tmp_path: Path):
    entries = [("Unified", 3, "32768K"), ("Data", 1, "32K"), ("Instruction", 1, "32K")]
    entries.append(("Unified", 2, "512K"))
    for index, (kind, level, size) in enumerate(entries):
        folder = tmp_path / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("type", kind), ("level", level), ("size", size)):
            (folder / name).write_text(f"{value}\n")
    assert data_caches(str(tmp_path)) == [("L1", 32 * KiB), ("L2", 512 * KiB), ("L3", 32 * MiB)]
    assert data_caches(str(tmp_path / "none")) == []


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "cgroup").write_text(cgroup)
    return tmp_path


def test_the_memory_hierarchy_is_found_from_proc(tmp_path: Path):
    mounts = (
        "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        f"31 25 0:27 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
    )
    (tmp_path / "memory" / "jobs" / "a").mkdir(parents=True)
    proc = fake_proc(tmp_path, mounts, "4:memory:/jobs/a\n1:cpu:/\n0::/\n")
    assert memory_hierarchy(proc) == tmp_path / "memory" / "jobs" / "a"
    v2_only = fake_proc(tmp_path, "32 25 0:28 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/\n")
    with pytest.raises(NoMemoryCgroup, match="no cgroup v1 memory controller is mounted here"):
        memory_hierarchy(v2_only)


def _ended_pid() -> str:
    """The pid of a process that has ended: it names no folder in /proc."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def test_a_swap_file_left_by_a_killed_run_is_found_by_its_dead_pid(tmp_path: Path):
    gone = _ended_pid()
    for pid in (gone, str(os.getpid())):
        (tmp_path / f"{PREFIX}{pid}").write_bytes(b"")
    (tmp_path / "unrelated").write_bytes(b"")
    assert stale_swap_files(tmp_path) == [tmp_path / f"{PREFIX}{gone}"]


def test_a_cgroup_left_by_a_killed_run_is_removed_by_the_next(tmp_path: Path):
    """SIGKILL skips every `finally`: the next run removes the width cgroups of a bench whose
    pid is gone (a plain folder stands in for the cgroup here), and leaves live ones alone."""
    gone = _ended_pid()
    for pid in (gone, str(os.getpid())):
        (tmp_path / f"dlscale-width-{pid}-512").mkdir()
    (tmp_path / "dlscale-job-x").mkdir()
    remove_stale_cgroups(tmp_path)
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == ["dlscale-job-x", f"dlscale-width-{os.getpid()}-512"]


def test_no_swap_file_is_made_where_the_machine_has_the_swap_already(tmp_path: Path):
    with bounded_swap(0, tmp_path) as made:  # any machine has 0 bytes of swap free
        assert made is None
    assert list(tmp_path.iterdir()) == []


def test_a_swap_folder_that_is_missing_or_cannot_hold_the_file_is_one_line(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(swap_file, "free_swap_bytes", lambda: 0)
    missing = tmp_path / "missing"
    with pytest.raises(NoSwap, match="missing"), bounded_swap(MiB, missing):
        pass

    def no_blocks(fd, offset, length):  # tmpfs before 5.x, or a file system without extents
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(swap_file.os, "posix_fallocate", no_blocks)
    with pytest.raises(NoSwap, match="Operation not supported"), bounded_swap(MiB, tmp_path):
        pass
    assert list(tmp_path.iterdir()) == []  # the half-made file is gone
    with pytest.raises(NoSwap, match="no-such-mkswap"):  # util-linux not installed
        swap_file._run([str(tmp_path / "no-such-mkswap"), "file"])


def test_a_swap_file_that_would_crowd_the_disk_is_refused_in_one_line(tmp_path: Path, monkeypatch):
    # 3 GiB free, 2 GiB kept free: 1,024 MiB to spare, and 4 GiB asked for.
    monkeypatch.setattr(swap_file, "free_swap_bytes", lambda: 0)
    usage = shutil.disk_usage(tmp_path)._replace(free=3 * 2**30)
    monkeypatch.setattr(swap_file.shutil, "disk_usage", lambda folder: usage)
    expected = re.escape(f"{tmp_path} has 1024 MiB to spare for a swap file")
    with pytest.raises(NoSwap, match=expected), bounded_swap(4 * 2**30, tmp_path):
        pass
    assert list(tmp_path.iterdir()) == []
