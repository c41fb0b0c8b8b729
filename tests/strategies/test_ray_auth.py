"""Joining a real `ray start --head` cluster with token authentication on: CLI and launcher.

`ray.cluster_utils.Cluster` (test_ray.py) never turns authentication on; `ray start --head`
does whenever the head has a token, as after any earlier local `ray.init()`. Each process here
gets its own HOME, so neither the cluster nor the driver ever sees the developer's ~/.ray token.
"""

import os

# Loopback only, as in test_ray.py: Ray otherwise swaps 127.0.0.1 for this machine's network
# address unless it runs in its single-machine mode. Set before Ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import contextlib
import json
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from dlscale.errors import UserError
from dlscale.launch import make_launcher
from dlscale.launch.base import Resources
from dlscale.launch.local import free_port

# Ray's token mode, end to end on a head of its own: opt-in (`make test-heavy`).
pytestmark = pytest.mark.heavy

BIN = Path(sys.executable).parent
SPEC = {
    "name": "ray-auth",
    "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
    "data": {"name": "digits"},
    "batch_size": 32,
    "steps": 4,
    "device": "cpu",
    "strategy": {"name": "ddp", "workers": 2},
}
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL: a teardown that always ends, soon


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with HOME replaced and no Ray token, mode or address of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_", "RAY_ADDRESS"))}
    return {**env, "HOME": str(home), **extra}


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (zombies wait for their reaper; they are stopped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def stop_process_group(pgid: int) -> None:
    """What `ray stop` does, for this cluster only: `ray stop` would also stop every other Ray
    on the machine (other tests' clusters included)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_members(pgid):
            return


@pytest.fixture(scope="module")
def head():
    """A one-node cluster started by `ray start --head` on 127.0.0.1, its token in its HOME."""
    root = Path(tempfile.mkdtemp(prefix="dlray-"))  # short: Ray's socket paths live under it
    home = root / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    port = free_port()
    command = [
        BIN / "ray",
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--object-store-memory",
        str(150 << 20),
        "--dashboard-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--temp-dir",
        str(root / "ray"),
        "--disable-usage-stats",
    ]
    # Its own process group: `ray start` returns, its daemons stay in the group, and the
    # teardown stops exactly them.
    started = subprocess.Popen(
        command,
        env=clean_env(home),
        start_new_session=True,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        said, _ = started.communicate(timeout=180)
        assert started.returncode == 0, said
        assert "Token authentication is enabled" in said, said
        yield {"address": f"127.0.0.1:{port}", "home": home, "root": root}
    finally:
        stop_process_group(started.pid)
        shutil.rmtree(root, ignore_errors=True)


def train(head: dict, out: Path, home: Path, **env: str) -> subprocess.CompletedProcess:
    spec = out.parent / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    command = [
        BIN / "dlscale",
        "train",
        spec,
        "--out",
        out,
        "--cluster",
        "ray",
        "--address",
        head["address"],
    ]
    return subprocess.run(
        command,
        env=clean_env(home, **env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_trains_on_a_token_authenticated_cluster_with_the_default_token_file(head, tmp_path):
    """Issue 17's case: the head's token in ~/.ray/auth_token turned authentication on, the
    driver has the same file and no RAY_AUTH_MODE. Ray's driver alone sends no token to an
    explicit address (20 s of InvalidAuthToken, then "cannot join"); dlscale's does."""
    done = train(head, tmp_path / "run", head["home"])
    assert done.returncode == 0, done.stderr
    assert "InvalidAuthToken" not in done.stdout + done.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "completed"
    assert [worker["steps"] for worker in record["workers"]] == [SPEC["steps"]] * 2
    # Placed by Ray (a node id), not by the local launcher (the host name).
    assert [len(worker["node"]) for worker in record["workers"]] == [56, 56]


@pytest.mark.slow
def test_a_wrong_token_is_one_line_at_once(head, tmp_path):
    """Refused at the head's first answer: one line naming where the token came from and where
    the right one is, exit 2; not Ray's 20 s of InvalidAuthToken retries and a vague error."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("not-the-head-token")
    done = train(head, tmp_path / "run", home)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "rejected the authentication token from ~/.ray/auth_token:" in lines[0]
    assert "`ray get-auth-token`" in lines[0] and "InvalidAuthToken" not in done.stdout
    assert not (tmp_path / "run" / "run.json").exists()


# ---------------------------------------------------------- the same, in this process (fast)


@pytest.fixture
def driver(head, tmp_path, monkeypatch) -> Path:
    """This process as the driver: its own HOME, no token settings of the caller's."""
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "token"])
def test_joining_turns_token_mode_on_only_while_connected(head, driver, monkeypatch, mode):
    """A later local Ray in the same process (a notebook, a test) must not inherit token mode
    that dlscale turned on; a mode the user set stays as it was."""
    import ray

    if mode:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    shutil.copytree(head["home"] / ".ray", driver / ".ray")
    assert make_launcher("ray", head["address"]).capacity(Resources()) == 2
    assert os.environ.get("RAY_AUTH_MODE") == mode and not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "requires an authentication token and none was found here: copy the head's"),
        ({"RAY_AUTH_TOKEN": "wrong"}, "rejected the authentication token from RAY_AUTH_TOKEN:"),
        (
            {"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"},
            "cannot read the Ray authentication token: RAY_AUTH_TOKEN_PATH is set but",
        ),
        ({"RAY_AUTH_MODE": "disabled"}, "RAY_AUTH_MODE=disabled here turns tokens off"),
    ],
    ids=["missing", "wrong-env", "unreadable-path", "mode-disabled"],
)
def test_each_token_problem_is_named(head, driver, monkeypatch, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=re.escape(says)):
        make_launcher("ray", head["address"]).capacity(Resources())
    assert "RAY_AUTH_MODE" not in os.environ or env.get("RAY_AUTH_MODE") == "disabled"
