"""The service's command-line doors against a real server: `dlscale serve admin` makes the
people and tokens, `dlscale remote` submits a job and follows it to its artifacts, and another
tenant's user, a read-only token and an invalid spec each get one line and a non-zero exit."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.cli.serve import machine_gpu_slots
from tests.conftest import default_sigint
from tests.service.live import LiveServer, free_port, wait_for_state

SPEC = """\
name: tiny
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: npz, path: inputs/d.npz}
batch_size: 32
epochs: 1
optimizer: {name: sgd, lr: 0.1}
device: cpu
"""
ENDED = ("succeeded", "failed", "cancelled")
runner = CliRunner()


def cli(*args: str, token: str | None = None, server: LiveServer | None = None):
    env = {"DLSCALE_TOKEN": token or ""}
    if server is not None:
        env["DLSCALE_SERVER"] = server.url
    return runner.invoke(app, [str(a) for a in args], env=env)


def last_line(result) -> str:
    return result.stdout.strip().splitlines()[-1]


def error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("svc") / "data", cpu_slots=2).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def alice(server) -> str:
    """alice, editor in tenant lab, made through `dlscale serve admin`; her printed token."""
    where = ("--data-dir", str(server.data_dir))
    made = cli("serve", "admin", "create-user", "alice", *where)
    assert made.exit_code == 0 and "shown once" in made.stdout
    password = last_line(made)
    tenant = cli("serve", "admin", "create-tenant", "lab", "--storage", "1GiB", *where)
    assert tenant.exit_code == 0 and "storage bytes 1073741824" in tenant.stdout
    member = cli("serve", "admin", "add-member", "lab", "alice", "--role", "editor", *where)
    assert member.exit_code == 0
    issued = cli("serve", "admin", "token", "alice", "--expires", "1d", *where)
    assert issued.exit_code == 0
    token = last_line(issued)
    me = server.client(token).get("/api/me").json()
    assert me["user"] == "alice" and me["tenants"] == {"lab": "editor"} and me["scope"] == "write"
    login = httpx.post(f"{server.url}/api/login", json={"name": "alice", "password": password})
    assert login.status_code == 200, "the printed password signs in"
    return token


@pytest.fixture(scope="module")
def finished(server, alice, tmp_path_factory) -> str:
    """A tiny job submitted with `remote submit --file`, run to its end."""
    folder = tmp_path_factory.mktemp("client")
    rng = np.random.default_rng(0)
    np.savez(folder / "d.npz", x=rng.normal(size=(96, 8)).astype(np.float32), y=np.arange(96) % 3)
    (folder / "spec.yaml").write_text(SPEC)
    submitted = cli(
        "remote",
        "submit",
        folder / "spec.yaml",
        "--file",
        folder / "d.npz",
        token=alice,
        server=server,
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = last_line(submitted)
    assert job_id.isalnum() and job_id in {
        j["id"] for j in server.client(alice).get("/api/jobs").json()
    }
    wait_for_state(server.client(alice), job_id, ENDED)
    return job_id


def test_a_submitted_job_reaches_succeeded_in_remote_status(server, alice, finished):
    shown = cli("remote", "status", finished, token=alice, server=server)
    assert shown.exit_code == 0
    assert f"job {finished} (train, tenant lab): succeeded" in shown.stdout
    assert "weights sha256:" in shown.stdout
    as_json = cli("remote", "status", finished, "--json", token=alice, server=server)
    assert '"state": "succeeded"' in as_json.stdout


def test_remote_logs_prints_each_line_once_followed_or_not(server, alice, finished):
    on_disk = (server.data_dir / "jobs" / finished / "log.txt").read_text().splitlines()
    assert on_disk, "the job wrote a log"
    plain = cli("remote", "logs", finished, token=alice, server=server)
    assert plain.exit_code == 0 and plain.stdout.splitlines() == on_disk
    followed = cli("remote", "logs", "-f", finished, token=alice, server=server)
    assert followed.exit_code == 0
    assert followed.stdout.splitlines() == [*on_disk, f"job {finished} succeeded"]


def test_remote_artifacts_lists_run_json_and_downloads_it_checked(
    server, alice, finished, tmp_path
):
    listed = cli("remote", "artifacts", finished, token=alice, server=server)
    assert listed.exit_code == 0
    row = next(line.split() for line in listed.stdout.splitlines() if line.endswith("run/run.json"))
    artifact_id, sha256 = row[0], row[3]
    reference = server.data_dir / "jobs" / finished / "run" / "run.json"
    assert sha256 == hashlib.sha256(reference.read_bytes()).hexdigest()
    out = tmp_path / "run.json"
    download = ("remote", "artifacts", finished, "--download", artifact_id, "--out", out)
    fetched = cli(*download, token=alice, server=server)
    assert fetched.exit_code == 0, fetched.output
    assert out.read_bytes() == reference.read_bytes()
    again = cli(*download, token=alice, server=server)
    assert again.exit_code == 2 and "--force" in error_line(again)


@pytest.mark.heavy
def test_rerun_prints_the_new_id_and_cancel_stops_it(server, alice, finished):
    rerun = cli("remote", "rerun", finished, token=alice, server=server)
    assert rerun.exit_code == 0, rerun.output
    new_id = last_line(rerun)
    assert new_id != finished and new_id.isalnum()
    cancelled = cli("remote", "cancel", new_id, token=alice, server=server)
    assert cancelled.exit_code == 0 and new_id in cancelled.stdout
    job = wait_for_state(server.client(alice), new_id, ENDED)
    assert job["state"] == "cancelled" and job["rerun_of"] == finished, job["message"]


def test_another_tenants_job_is_not_found_exactly_like_a_missing_one(server, alice, finished):
    _, bob = server.user("bob", "other")
    missing = "feedfacefeedface"
    for verb in ("status", "logs", "cancel", "rerun", "artifacts"):
        theirs = cli("remote", verb, finished, token=bob, server=server)
        none = cli("remote", verb, missing, token=alice, server=server)
        assert theirs.exit_code == none.exit_code == 1, (verb, theirs.output)
        assert error_line(theirs) == f"error: job {finished} not found"
        assert error_line(none) == f"error: job {missing} not found"
    assert wait_for_state(server.client(alice), finished, ENDED)["state"] == "succeeded"


def test_a_read_token_cannot_submit_and_a_bad_spec_or_token_gets_one_line(server, alice, tmp_path):
    _, reader = server.user("carol", "lab", role="editor", scope="read")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    refused = cli("remote", "submit", spec, token=reader, server=server)
    assert refused.exit_code == 1 and "read-only" in error_line(refused)
    digits = SPEC.replace("{name: npz, path: inputs/d.npz}", "{name: digits}")
    spec.write_text(digits.replace("name: mlp", "name: nosuchmodel"))
    invalid = cli("remote", "submit", spec, "--tenant", "lab", token=alice, server=server)
    assert invalid.exit_code == 2 and "nosuchmodel" in error_line(invalid)
    spec.write_text(SPEC)  # the data file it names was not sent
    unsent = cli("remote", "submit", spec, token=alice, server=server)
    assert unsent.exit_code == 2 and "d.npz" in error_line(unsent)
    forged = cli(
        "remote", "status", "feedfacefeedface", token="dls_00000000_" + "a" * 43, server=server
    )
    assert forged.exit_code == 1
    assert error_line(forged) == "error: not signed in: bad or expired DLSCALE_TOKEN"


def test_dlscale_serve_runs_the_service_and_refuses_a_public_address(tmp_path):
    refused = cli("serve", "--host", "0.0.0.0", "--data-dir", tmp_path / "d")
    assert refused.exit_code == 2 and "--allow-remote" in error_line(refused)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "dlscale.cli.main",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        "--cpu-slots",
        "1",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=default_sigint
    )
    try:
        for _ in range(300):
            assert process.poll() is None, process.stdout.read().decode()
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert answer.json() == {"status": "ok"}
        assert (tmp_path / "data" / "service.db").is_file()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_gpu_slots_default_to_the_gpus_nvidia_smi_lists_and_cuda_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine_gpu_slots() == 0  # no driver, no nvidia-smi
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: H100 (UUID: a)'\necho 'GPU 1: H100 (UUID: b)'\n")
    fake.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine_gpu_slots() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine_gpu_slots() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert machine_gpu_slots() == 0


def test_remote_status_shows_times_and_sizes_as_people_read_them(server, alice, finished):
    shown = cli("remote", "status", finished, token=alice, server=server).stdout
    assert "e+0" not in shown  # once: first_step_at_unix 1.796e+09, peak_memory_bytes 4.9e+08
    assert re.search(r"peak_memory_bytes \d+(\.\d+)? [KMG]iB", shown), shown
    assert re.search(r"first_step_at_unix \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown), shown
    assert re.search(r"submitted \d{4}-\d\d-\d\d .*; started .*; ended ", shown), shown


def test_remote_list_pages_through_every_job(server, alice, finished):
    listed = cli("remote", "list", token=alice, server=server)
    assert listed.exit_code == 0 and finished in listed.stdout
    one = cli("remote", "list", "--limit", "1", token=alice, server=server)
    rows = [line for line in one.stdout.splitlines() if re.match(r"^[0-9a-f]{16} ", line)]
    assert len(rows) == 1
    every = cli("remote", "list", "--all", "--limit", "1", "--json", token=alice, server=server)
    assert finished in {job["id"] for job in json.loads(every.stdout)}


def test_remote_artifacts_out_a_new_folder_writes_into_it(server, alice, finished, tmp_path):
    listed = cli("remote", "artifacts", finished, "--json", token=alice, server=server)
    row = next(a for a in json.loads(listed.stdout) if a["name"] == "run/run.json")
    folder = tmp_path / "fetched"
    fetched = cli(
        "remote",
        "artifacts",
        finished,
        "--download",
        row["id"],
        "--out",
        f"{folder}/",
        token=alice,
        server=server,
    )
    assert fetched.exit_code == 0, fetched.output
    assert (folder / "run.json").is_file() and not (tmp_path / "fetched.json").exists()


def test_remote_delete_removes_a_job_and_admin_verbs_change_people(server, alice, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("{name: npz, path: inputs/d.npz}", "{name: digits}"))
    job_id = last_line(cli("remote", "submit", spec, token=alice, server=server))
    deleted = cli("remote", "delete", job_id, token=alice, server=server)
    assert deleted.exit_code == 0, deleted.output
    assert "deleted" in deleted.stdout  # at once, or (running) once it has stopped
    deadline = time.monotonic() + 120
    while server.client(alice).get(f"/api/jobs/{job_id}").status_code != 404:
        assert time.monotonic() < deadline, "the job was not deleted"
        time.sleep(0.3)
    assert not (server.data_dir / "jobs" / job_id).exists()
    where = ("--data-dir", str(server.data_dir))
    assert cli("serve", "admin", "create-user", "carl", *where).exit_code == 0
    cli("serve", "admin", "add-member", "lab", "carl", "--role", "viewer", *where)
    users = cli("serve", "admin", "users", *where)
    assert "carl: lab (viewer)" in users.stdout, users.stdout
    off = cli("serve", "admin", "disable-user", "carl", *where)
    assert off.exit_code == 0 and "disabled" in off.stdout
    listed = json.loads(cli("serve", "admin", "users", "--json", *where).stdout)
    assert next(u for u in listed if u["name"] == "carl")["disabled"]
    new = cli("serve", "admin", "reset-password", "carl", *where)
    assert new.exit_code == 0 and len(last_line(new)) >= 12
    gone = cli("serve", "admin", "remove-member", "lab", "carl", *where)
    assert gone.exit_code == 0 and "no longer a member" in gone.stdout
    again = cli("serve", "admin", "remove-member", "lab", "carl", *where)
    assert again.exit_code == 2 and "not a member" in error_line(again)
    changed = cli(
        "serve",
        "admin",
        "set-tenant",
        "lab",
        "--weight",
        "2",
        "--cpu-slots",
        "none",
        "--max-queued-jobs",
        "50",
        *where,
    )
    assert changed.exit_code == 0 and "weight 2" in changed.stdout, changed.output
    tenants = cli("serve", "admin", "tenants", *where).stdout
    assert "lab: weight 2; max queued jobs 50; storage" in tenants, tenants
    bad = cli("serve", "admin", "set-tenant", "lab", "--cpu-slots", "-1", *where)
    assert bad.exit_code == 2 and "none for no limit" in error_line(bad)
