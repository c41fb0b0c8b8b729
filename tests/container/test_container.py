"""The container image, opt-in: `DLSCALE_CONTAINER_TESTS=1` (or `make container-test`, which
builds the image first). The image builds; `dlscale --version` and a 2-epoch LeNet run inside it;
the same spec gives the same final weights in the container and on the host; the service in the
image refuses to start where it cannot sandbox its jobs and answers its health check where it
can; through the container executor a spec is checked and a job succeeds, and a tenant's own
code trying every escape from its container fails at each, as in the process sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dlscale import __version__, api
from dlscale.service.config import ServiceConfig
from dlscale.service.container import IMAGE, ContainerExecutor, engine, flags
from tests.service.test_executor import new_job, wait_ended
from tests.service.test_hostile import ATTACK
from tests.small_runs import final_weights

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    os.environ.get("DLSCALE_CONTAINER_TESTS") != "1",
    reason="container tests are opt-in: DLSCALE_CONTAINER_TESTS=1, or `make container-test`",
)

LENET = """name: lenet-in-a-container
model: {name: lenet}
data: {name: digits, image_size: 28}
batch_size: 32
epochs: 2
threads: 1
optimizer: {name: adam, lr: 0.001}
device: cpu
seed: 0
"""


@pytest.fixture(scope="module")
def image() -> str:
    """The image `make image` builds (built here when missing: minutes, the first time)."""
    found = subprocess.run([engine(), "image", "inspect", IMAGE], capture_output=True, check=False)
    if found.returncode != 0:
        subprocess.run(["bash", str(ROOT / "docker" / "build.sh")], check=True, cwd=ROOT)
    return IMAGE


def run(image: str, *args: str, volume: Path | None = None) -> subprocess.CompletedProcess:
    mount = ["--volume", f"{volume}:{volume}:rw", "--user", f"{os.getuid()}:{os.getgid()}"]
    command = [
        engine(),
        "run",
        "--rm",
        "--network",
        "none",
        *flags(),
        *(mount if volume else []),
        image,
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def test_the_image_builds_and_runs_as_a_non_root_user(image):
    inspected = subprocess.run(
        [engine(), "image", "inspect", image, "--format", "{{.Config.User}} {{.Config.Cmd}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert inspected.startswith("dlscale ")
    assert "serve" in inspected and "0.0.0.0" in inspected and "--allow-remote" in inspected
    assert run(image, "id", "-u").stdout.strip() == "10001"


def test_dlscale_version_inside(image):
    done = run(image, "dlscale", "--version")
    assert done.returncode == 0 and __version__ in done.stdout


def test_lenet_trains_in_the_container_to_the_hosts_weights(image, tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(LENET)
    inside = tmp_path / "inside"
    done = run(image, "dlscale", "train", str(spec), "--out", str(inside), volume=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    api.train(spec, out_dir=tmp_path / "host")
    weights = [final_weights(folder) for folder in (inside, tmp_path / "host")]
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[1].items():
        assert torch.equal(weights[0][name], value), name  # the same pinned torch, bit for bit


def test_the_service_in_the_image_refuses_to_start_where_it_cannot_sandbox(image):
    """As the image's own unprivileged user the service can give its jobs no cgroups: it says
    so and stops, rather than run tenants' jobs unconfined."""
    command = [engine(), "run", "--rm", "--network", "none", *flags(), image]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "jobs cannot be sandboxed" in done.stderr + done.stdout


def test_the_service_in_the_image_answers_its_health_check(image):
    """Run as the container's root with the privileges to make namespaces and cgroups (what the
    Kubernetes manifest asks for), it sandboxes each job as an unprivileged uid of its own."""
    name = f"dlscale-health-{os.getpid()}"
    command = [engine(), "run", "-d", "--rm", "--name", name, "--network", "none", *flags()]
    command += ["--user", "0", "--privileged", image]
    started = subprocess.run(command, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        probe = [
            engine(),
            "exec",
            name,
            "python3",
            "-c",
            "import urllib.request, json; print(json.load(urllib.request.urlopen("
            "'http://127.0.0.1:8080/api/health', timeout=4)))",
        ]
        while True:
            answer = subprocess.run(probe, capture_output=True, text=True, check=False)
            if answer.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert answer.returncode == 0, answer.stderr
        assert "'ok'" in answer.stdout or "ok" in answer.stdout
    finally:
        subprocess.run([engine(), "rm", "-f", name], capture_output=True, check=False)


def _run_job(image: str, tmp_path: Path, spec: str, inputs=None):
    """A job checked and run through the container executor as the server does; its result."""
    config = ServiceConfig(data_dir=tmp_path / "data", cpu_slots=1, image=image)
    config.memory_per_slot_bytes = 1 << 30
    folder = new_job(tmp_path, spec, inputs=inputs)
    executor = ContainerExecutor(config, image)
    limits = config.limits(1, 0, folder.name, None)
    executor.prepare(folder, limits.uid)
    verdict = executor.validate(folder, limits, 300)
    assert verdict.ok, verdict
    executor.start(folder, limits)
    return wait_ended(executor, folder), folder


def test_a_job_through_the_container_executor_succeeds(image, tmp_path: Path):
    result, folder = _run_job(image, tmp_path, LENET.replace("epochs: 2", "epochs: 1"))
    log = (folder / "log.txt").read_text()
    assert result["state"] == "succeeded", log
    assert (folder / "run" / "run.json").is_file() and "epoch 1" in log
    assert result["environment"]["torch"] == torch.__version__


def test_a_tenants_own_code_finds_every_escape_closed_in_its_container(image, tmp_path: Path):
    other = tmp_path / "other-tenant.npz"
    other.write_bytes(b"private")
    facts = {"data_dir": str(tmp_path / "data"), "port": 8080, "server_pid": os.getpid()}
    facts["victim"] = str(other)
    spec = LENET.replace("{name: lenet}", "{name: 'inputs.attack:build'}").replace(
        "{name: digits, image_size: 28}", "{name: digits}"
    )
    inputs = {"attack.py": ATTACK.encode(), "facts.json": json.dumps(facts).encode()}
    result, folder = _run_job(image, tmp_path, spec.replace("epochs: 2", "epochs: 1"), inputs)
    assert result["state"] == "succeeded", (folder / "log.txt").read_text()[-2000:]
    report = json.loads((folder / "run" / "attacks.json").read_text())
    for attempt in report["attempts"]:
        assert attempt["refused"], attempt
    assert report["facts"]["uid"] >= 1_000_000 and report["facts"]["hostname"] == "dlscale-job"
