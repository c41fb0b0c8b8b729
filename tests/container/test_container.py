"""The container image, opt-in: `DLSCALE_CONTAINER_TESTS=1` (or `make container-test`, which
builds the image first). The image builds; `dlscale --version` and a 2-epoch LeNet run inside it;
the same spec gives the same final weights in the container and on the host; the service in the
image answers its health check; a job through the container executor succeeds."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dlscale import __version__, api
from dlscale.service.container import IMAGE, ContainerExecutor, engine, flags
from tests.service.test_executor import new_job, wait_ended

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
    command = [engine(), "run", "--rm", "--network", "none", *flags(),
               *(mount if volume else []), image, *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def test_the_image_builds_and_runs_as_a_non_root_user(image):
    inspected = subprocess.run([engine(), "image", "inspect", image, "--format",
                                "{{.Config.User}} {{.Config.Cmd}}"], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
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
    weights = []
    for folder in (inside, tmp_path / "host"):
        latest = sorted((folder / "checkpoints").glob("step-*.pt"))[-1]
        weights.append(torch.load(latest, weights_only=True)["model"])
    assert weights[0].keys() == weights[1].keys()
    for name, value in weights[1].items():
        assert torch.equal(weights[0][name], value), name  # the same pinned torch, bit for bit


def test_the_service_in_the_image_answers_its_health_check(image):
    name = f"dlscale-health-{os.getpid()}"
    command = [engine(), "run", "-d", "--rm", "--name", name, "--network", "none", *flags(), image]
    started = subprocess.run(command, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        probe = [engine(), "exec", name, "python3", "-c",
                 "import urllib.request, json; print(json.load(urllib.request.urlopen("
                 "'http://127.0.0.1:8080/api/health', timeout=4)))"]  # fmt: skip
        while True:
            answer = subprocess.run(probe, capture_output=True, text=True, check=False)
            if answer.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert answer.returncode == 0, answer.stderr
        assert "'ok'" in answer.stdout or "ok" in answer.stdout
    finally:
        subprocess.run([engine(), "rm", "-f", name], capture_output=True, check=False)


def test_a_job_through_the_container_executor_succeeds(image, tmp_path: Path):
    folder = new_job(tmp_path, LENET.replace("epochs: 2", "epochs: 1"))
    executor = ContainerExecutor(image)
    executor.start(folder, cpus=1)
    result = wait_ended(executor, folder)
    log = (folder / "log.txt").read_text()
    assert result["state"] == "succeeded", log
    assert (folder / "run" / "run.json").is_file() and "epoch 1" in log
    assert result["environment"]["torch"] == torch.__version__
