"""A deployment under the container executor, opt-in as the rest of tests/container
(`DLSCALE_CONTAINER_TESTS=1`): a server started with `--executor container` trains the TINY
spec, deploys it, and the engine serves from a container of its own, as the job's own uid when
the server is root (the uid the server's socket check expects), its predictions those of
`load_predictor` on the same inputs; another tenant reaches nothing, and cancel ends the
engine and its container.

The server, its trained job and its deployment are shared by the tests of this module; they
run in the order written, the cancel last."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from dlscale.service.config import ServiceConfig
from dlscale.service.container import ContainerExecutor, engine
from dlscale.service.layout import SOCKET
from tests.container import test_container as container_tests
from tests.service.live import LiveServer, wait_for_state
from tests.service.specs import TINY
from tests.service.test_deploy import (
    ENDED,
    answers_are_predicts_and_only_the_tenants,
    cancel_and_see_the_engine_end,
    cli,
    last_line,
    route_says_the_model_is_no_longer_served,
    submit,
    wait_until_serving,
)

pytestmark = container_tests.pytestmark
image = container_tests.image  # the fixture: the image `make image` builds


def container_of(folder) -> dict | None:
    """What the engine says of the job's container (None: there is none)."""
    name = ContainerExecutor.name(folder)
    command = [engine(), "container", "inspect", name]
    found = subprocess.run(command, capture_output=True, text=True, check=False)
    return json.loads(found.stdout)[0] if found.returncode == 0 else None


@pytest.fixture(scope="module")
def deployed(image, tmp_path_factory):
    # As in tests/service/test_deploy.py: jobs/<16 hex>/serve.sock under this is past the 107
    # bytes a socket address holds (the engine binds it by its name in its working folder).
    deep = tmp_path_factory.mktemp("deploy") / ("d" * 80) / "data"
    assert len(str(deep / "jobs" / ("0" * 16) / SOCKET)) > 107
    live = LiveServer(deep, 2, None, "--executor", "container", "--image", image)
    live.start(timeout_s=180)  # the container executor tries the image's limits as it starts
    try:
        _, alice_token = live.user("alice", "lab-a")
        _, bob_token = live.user("bob", "lab-b")
        alice = live.client(alice_token)
        trained = submit(alice, TINY)
        job = wait_for_state(alice, trained, ENDED, timeout_s=600)
        assert job["state"] == "succeeded", job
        said = cli("remote", "deploy", trained, "--precision", "fp32", token=alice_token, live=live)
        assert said.exit_code == 0, said.output
        served = last_line(said)
        info = wait_until_serving(alice, served, timeout_s=600)
        yield {
            "live": live,
            "image": image,
            "alice": alice,
            "bob": live.client(bob_token),
            "trained": trained,
            "served": served,
            "info": info,
        }
    finally:
        live.stop()
        for folder in (deep / "jobs").glob("*"):  # a container outlives its `podman run`
            name = ContainerExecutor.name(folder)
            subprocess.run([engine(), "rm", "-f", name], capture_output=True, check=False)


def test_the_engine_serves_from_a_container_as_the_jobs_own_uid(deployed):
    live, served = deployed["live"], deployed["served"]
    folder = live.data_dir / "jobs" / served
    job = deployed["alice"].get(f"/api/jobs/{served}").json()
    assert job["kind"] == "serve-model" and job["state"] == "running", job
    inside = container_of(folder)
    assert inside is not None and inside["State"]["Running"], inside
    assert inside["ImageName"].endswith(deployed["image"])  # localhost/dlscale:<version>
    assert inside["HostConfig"]["NetworkMode"] == "none"
    uid = ServiceConfig(data_dir=live.data_dir).job_uid(served)  # None: the server is not root
    if uid is not None:
        assert inside["Config"]["User"] == f"{uid}:{uid}"
        assert os.stat(folder / SOCKET).st_uid == uid  # what the server's socket check expects


def test_the_tenant_gets_the_predictions_predict_gives_and_no_one_else_reaches_it(deployed):
    alice, served, info = deployed["alice"], deployed["served"], deployed["info"]
    assert info["input_shape"] and info["num_classes"] == 10 and info["engine"] == "plain"
    answers_are_predicts_and_only_the_tenants(deployed)
    # A body the engine refuses: one line, and the server stays up.
    answer = alice.post(f"/api/jobs/{served}/predict", content=b'{"inputs": [[1, 2, 3]]}')
    assert answer.status_code == 422 and "\n" not in answer.json()["error"], answer.text


def test_cancel_ends_the_engine_and_its_container(deployed):
    folder = cancel_and_see_the_engine_end(deployed)
    deadline = time.monotonic() + 60  # --rm: the engine removes the container once it ended
    while container_of(folder) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert container_of(folder) is None
    route_says_the_model_is_no_longer_served(deployed)
