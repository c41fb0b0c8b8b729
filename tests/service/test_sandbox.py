"""The sandbox's parts without a job: the bubblewrap command (what is bound, read-only or not,
who the process becomes), the cgroup hierarchy found from /proc (v1 and v2, over fake trees:
this machine has v1 only), the limits written and the usage read back, and a server that cannot
sandbox refusing to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.service import cgroups, sandbox
from dlscale.service.config import ServiceConfig
from tests.service.live import free_port

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
"""
V1_OWN = "9:pids:/system.slice/dlscale.service\n4:memory:/system.slice/dlscale.service\n"
V1_OWN += "2:cpu,cpuacct:/system.slice/dlscale.service\n0::/\n"


def pairs(command: list[str], flag: str) -> list[tuple[str, str]]:
    return [(command[i + 1], command[i + 2]) for i, a in enumerate(command) if a == flag]


def test_the_sandbox_binds_its_folder_its_python_and_the_system_read_only_and_nothing_else(
    tmp_path,
):
    folder = tmp_path / "data" / "jobs" / "0123456789abcdef"
    box = sandbox.Box(folder, writable=True, uid=1_900_000_123, read_only=("inputs", "spec.yaml"))
    command = sandbox.command(box, ["python", "-P", "-m", "x"], info_fd=7)
    writable = pairs(command, "--bind")
    assert writable == [(str(folder), str(folder))]  # the one writable place
    read_only = dict(pairs(command, "--ro-bind") + pairs(command, "--ro-bind-try"))
    assert read_only[str(folder / "inputs")] == str(folder / "inputs")
    assert "/etc/shadow" not in read_only and "/etc" not in read_only
    assert not any(str(tmp_path / "data") == p or p.endswith("service.db") for p in read_only)
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--new-session", "--clearenv"):
        assert flag in command
    assert command[command.index("--info-fd") + 1] == "7"
    switch = command[command.index("--") + 1 :]
    assert switch[:4] == [
        sandbox.SETPRIV,
        "--reuid=1900000123",
        "--regid=1900000123",
        "--clear-groups",
    ]
    assert "--no-new-privs" in switch and switch[-4:] == ["python", "-P", "-m", "x"]
    validation = sandbox.command(sandbox.Box(folder, writable=False, uid=None), ["true"], 3)
    assert pairs(validation, "--bind") == [] and validation[-2:] == ["--", "true"]


def test_the_environment_passes_on_no_secret():
    env = sandbox.environment(
        sandbox.Box(Path("/x"), True, None, environment={"DLSCALE_CPUS": "2"}),
        {"DLSCALE_TOKEN": "dls_secret", "AWS_SECRET_ACCESS_KEY": "k", "LANG": "C", "TZ": "UTC"},
    )
    assert "DLSCALE_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["LANG"] == "C" and env["DLSCALE_CPUS"] == "2" and env["HF_HUB_OFFLINE"] == "1"


def fake_proc(tmp_path: Path, mounts: str, own: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mounts)
    (proc / "cgroup").write_text(own)
    return proc


def test_the_v1_hierarchy_is_found_per_controller_under_the_servers_own_cgroup(tmp_path):
    hierarchy_root = tmp_path / "sys"
    proc = fake_proc(
        tmp_path,
        V1_MOUNTS.replace("/sys/fs/cgroup", str(hierarchy_root)),
        V1_OWN,
    )
    for controller in ("cpu,cpuacct", "memory", "pids"):
        (hierarchy_root / controller / "system.slice" / "dlscale.service").mkdir(parents=True)
    found = cgroups.detect(proc)
    assert found.version == 1
    assert found.own["memory"] == hierarchy_root / "memory/system.slice/dlscale.service"
    assert found.own["cpu"] == hierarchy_root / "cpu,cpuacct/system.slice/dlscale.service"
    group = cgroups.JobCgroup(found, "dlscale-job-x")
    group.create(cgroups.Limits(cpus=2, memory_bytes=3 << 30, pids=1024))
    memory = found.own["memory"] / "dlscale-job-x"
    assert (memory / "memory.limit_in_bytes").read_text() == str(3 << 30)
    cpu = found.own["cpu"] / "dlscale-job-x"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert (found.own["pids"] / "dlscale-job-x" / "pids.max").read_text() == "1024"
    (memory / "memory.max_usage_in_bytes").write_text("123456\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (found.own["pids"] / "dlscale-job-x" / "pids.events").write_text("max 7\n")
    (cpu / "cpu.stat").write_text("nr_periods 10\nnr_throttled 3\nthrottled_time 1500000000\n")
    assert group.usage() == cgroups.Usage(123456, 2, 7, 1.5)


def test_the_v2_hierarchy_hands_its_controllers_down_after_moving_the_server_into_a_leaf(tmp_path):
    unified = tmp_path / "unified"
    own = unified / "user.slice" / "serve"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text("4242\n")
    mounts = f"30 23 0:27 / {unified} rw,nosuid - cgroup2 cgroup2 rw\n"
    found = cgroups.detect(fake_proc(tmp_path, mounts, "0::/user.slice/serve\n"))
    assert found.version == 2 and found.own["memory"] == own
    assert (own / "dlscale-server" / "cgroup.procs").read_text() == "4242"
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    group = cgroups.JobCgroup(found, "dlscale-job-y")
    group.create(cgroups.Limits(cpus=1, memory_bytes=1 << 30, pids=512))
    job = own / "dlscale-job-y"
    assert (job / "memory.max").read_text() == str(1 << 30)
    assert (job / "cpu.max").read_text() == "100000 100000"
    assert group.procs_files() == [str(job / "cgroup.procs")]


def test_a_hierarchy_without_the_controllers_says_which_are_missing(tmp_path):
    unified = tmp_path / "unified"
    (unified / "serve").mkdir(parents=True)
    (unified / "serve" / "cgroup.controllers").write_text("cpu\n")
    mounts = f"30 23 0:27 / {unified} rw - cgroup2 cgroup2 rw\n"
    with pytest.raises(cgroups.CgroupsUnavailable, match="lacks the memory, pids controller"):
        cgroups.detect(fake_proc(tmp_path, mounts, "0::/serve\n"))
    (tmp_path / "none").mkdir()
    with pytest.raises(cgroups.CgroupsUnavailable, match="no cgroup hierarchy"):
        cgroups.detect(fake_proc(tmp_path / "none", "", "0::/\n"))


def test_each_job_has_an_unprivileged_uid_of_its_own():
    config = ServiceConfig(data_dir=Path("/tmp/x"))
    uids = {config.job_uid(f"{i:016x}") for i in range(1000)}
    assert len(uids) == 1000 and min(uids) >= config.job_uid_base >= 1_000_000
    assert config.job_uid("00000000000000ab") == config.job_uid("00000000000000ab")
    assert ServiceConfig(data_dir=Path("/tmp/x"), unsafe_single_user=True).job_uid("ab") is None


def test_a_server_that_cannot_sandbox_its_jobs_refuses_to_start(tmp_path):
    """No bubblewrap on the PATH: one line saying why and what to do; --unsafe-single-user
    starts (and says it is unsafe)."""
    command = [sys.executable, "-m", "dlscale.service", "--data-dir", str(tmp_path / "d")]
    command += ["--port", str(free_port())]
    env = {"PATH": str(tmp_path), "DLSCALE_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "jobs cannot be sandboxed" in done.stderr and "bwrap not found" in done.stderr
    assert "--unsafe-single-user" in done.stderr and "Traceback" not in done.stderr
    unsafe = subprocess.Popen(
        [*command, "--unsafe-single-user"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        said = [unsafe.stdout.readline(), unsafe.stdout.readline()]
    finally:
        unsafe.terminate()
        unsafe.wait(timeout=30)
    assert "unsandboxed and unlimited" in said[0] and said[1].startswith("dlscale serve: http")
