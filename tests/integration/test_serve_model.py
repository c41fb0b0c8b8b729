"""`dlscale serve-model` end to end: the command started on a small trained run answers
/predict as Predictor.predict answers directly (arrays and base64 PNGs), counts every request
in /metrics, refuses bad bodies with one 4xx line, and SIGTERM stops it and its Ray cleanly.
One module-scoped server: Ray and Serve take seconds to start."""

import asyncio
import base64
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image

from dlscale import api
from dlscale.api.inference import load_predictor
from dlscale.jobspec import parse_spec
from tests.small_runs import SGD, base_spec, synthetic_images

START_TIMEOUT_S = 240  # Ray, Serve's controller and proxy, and one replica on two busy cores
CONCURRENT = 8


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def default_signals() -> None:
    # The child's SIGTERM and SIGINT as a terminal gives them, whatever this test process was
    # started with (a background job ignores SIGINT): the test never depends on inheriting them.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    spec = base_spec(
        "serve", synthetic_images(128), batch_size=32, steps=2, optimizer=SGD, device="cpu"
    )
    record = api.train(parse_spec(spec), out_dir=tmp_path_factory.mktemp("runs") / "serve")
    return Path(record.run_dir)


@pytest.fixture(scope="module")
def server(run_dir: Path):
    port = free_port()
    command = [sys.executable, "-m", "dlscale.cli.main", "serve-model", str(run_dir)]
    command += ["--port", str(port), "--replicas", "1", "--batch-wait-ms", "20"]
    command += ["--device", "cpu"]
    process = subprocess.Popen(
        command,
        preexec_fn=default_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(api.__file__).parents[2])},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    else:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"serve-model did not come up (exit {process.returncode}): {err[-2000:]}")
    yield url, process
    if process.poll() is None:
        process.kill()
        process.communicate()


def png_base64(pixels: torch.Tensor) -> str:
    """A 28×28 grey PNG of `pixels` (values 0..255), base64 as a client sends it."""
    buffer = io.BytesIO()
    Image.fromarray(pixels.to(torch.uint8).numpy(), mode="L").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(f"{url}/predict", json=b) for b in bodies))


@pytest.mark.slow
@pytest.mark.heavy
def test_served_predictions_equal_the_predictor_s_and_metrics_count_them(server, run_dir):
    url, process = server
    predictor = load_predictor(run_dir, device="cpu")
    generator = torch.Generator().manual_seed(0)
    arrays = torch.rand(CONCURRENT, 1, 28, 28, generator=generator)
    pixels = torch.randint(0, 256, (3, 28, 28), generator=generator)

    # Eight concurrent one-sample requests (batched by Serve as they arrive), then one request
    # of three PNGs: eleven samples in nine requests.
    replies = asyncio.run(post_all(url, [{"inputs": [sample.tolist()]} for sample in arrays]))
    images = httpx.post(f"{url}/predict", json={"inputs": [png_base64(p) for p in pixels]})
    assert [r.status_code for r in replies] == [200] * CONCURRENT and images.status_code == 200

    direct = predictor.predict(arrays)
    served = [r.json()["predictions"][0] for r in replies]
    assert [p["class"] for p in served] == direct.classes
    assert [p["confidence"] for p in served] == pytest.approx(direct.confidence, rel=1e-5)
    direct_images = predictor.predict(
        predictor.images([base64.b64decode(png_base64(p)) for p in pixels])
    )
    assert [p["class"] for p in images.json()["predictions"]] == direct_images.classes

    bad = [
        httpx.post(f"{url}/predict", content=b"not json"),
        httpx.post(f"{url}/predict", json={"inputs": [[1, 2, 3]]}),
        httpx.post(f"{url}/predict", json={"inputs": ["@@"]}),
    ]
    assert [r.status_code for r in bad] == [400, 422, 422]
    assert all(set(r.json()) == {"error"} and "\n" not in r.json()["error"] for r in bad)
    assert "shape (3,)" in bad[1].json()["error"]

    health = httpx.get(f"{url}/health").json()
    assert health["input_shape"] == [1, 28, 28] and health["engine"] == "ray-serve"

    metrics = httpx.get(f"{url}/metrics", params={"format": "json"}).json()
    assert metrics["requests_by_status"] == {"200": CONCURRENT + 1, "400": 1, "422": 2}
    assert metrics["samples"] == CONCURRENT + 3
    # Every answered request was in exactly one model call, however Serve grouped them.
    sizes = {int(size): calls for size, calls in metrics["batch_sizes"].items()}
    assert sum(size * calls for size, calls in sizes.items()) == CONCURRENT + 1
    assert metrics["batches"] == sum(sizes.values()) and metrics["latency_window"] == CONCURRENT + 1
    text = httpx.get(f"{url}/metrics").text
    assert f'dlscale_serve_requests_total{{status="200"}} {CONCURRENT + 1}' in text

    # The stop this checks is the one after the command says it serves: its /health can answer
    # a moment before (a stop while it deploys: tests/cli/test_serve_model_cli.py).
    serving = process.stdout.readline()
    assert f"at {url}" in serving, serving
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "stopping: Ray Serve shuts down" in err
