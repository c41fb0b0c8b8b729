"""A served model's bearer token, through the real routes of the one-process engine: required
for /predict and /metrics where the server has one (missing, wrong or another scheme: 401 and
one line), never asked on loopback without one; and where the token comes from."""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from dlscale.errors import UserError
from dlscale.serving.auth import (
    BearerToken,
    is_loopback,
    read_token_file,
    required_token,
)
from dlscale.serving.plain import build_plain_app

TOKEN = "correct-horse-battery-staple-42"
SAMPLE = {"inputs": [[1.0, 2.0]]}


@dataclass
class Answer:
    classes: list[int]
    confidence: list[float]


class Model:
    """A stand-in Predictor over 2 features: class 1, confidence 0.75, for every sample."""

    input_shape = (2,)
    input_kind = "features"
    num_classes = vocab_size = 2

    def predict(self, tensor: torch.Tensor) -> Answer:
        return Answer([1] * len(tensor), [0.75] * len(tensor))


def client(token: str | None) -> TestClient:
    app = build_plain_app(Model(), {"run": "/runs/x"}, BearerToken.of(token) if token else None)
    return TestClient(app, raise_server_exceptions=False)


def test_a_token_is_required_for_predict_and_metrics_and_accepted():
    served = client(TOKEN)
    refusals = [
        served.post("/predict", json=SAMPLE),  # no header
        served.post("/predict", json=SAMPLE, headers={"Authorization": "Bearer wrong"}),
        served.post("/predict", json=SAMPLE, headers={"Authorization": f"Bearer {TOKEN}x"}),
        served.post("/predict", json=SAMPLE, headers={"Authorization": f"Basic {TOKEN}"}),
        served.post("/predict", json=SAMPLE, headers={"Authorization": "Bearer"}),
        served.get("/metrics"),
    ]
    for answer in refusals:
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == "Bearer"
        assert list(answer.json()) == ["error"] and "\n" not in answer.json()["error"]
        assert "Authorization: Bearer" in answer.json()["error"]
    good = {"Authorization": f"Bearer {TOKEN}"}
    answer = served.post("/predict", json=SAMPLE, headers=good)
    assert answer.status_code == 200
    assert answer.json() == {"predictions": [{"class": 1, "confidence": 0.75}]}
    # The scheme is case-insensitive (RFC 6750 §2.1, RFC 9110 §11.1).
    lower = {"Authorization": f"bearer {TOKEN}"}
    assert served.post("/predict", json=SAMPLE, headers=lower).status_code == 200
    metrics = served.get("/metrics", params={"format": "json"}, headers=good)
    assert metrics.status_code == 200
    # 5 refused /predict calls + 1 refused /metrics, and the 2 answered.
    assert metrics.json()["requests_by_status"] == {"200": 2, "401": 6}
    assert "dlscale_serve_requests_total" in served.get("/metrics", headers=good).text


def test_health_is_open_but_says_only_ok_without_the_token():
    served = client(TOKEN)
    assert served.get("/health").json() == {"status": "ok"}
    full = served.get("/health", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert full == {"status": "ok", "engine": "plain", "run": "/runs/x"}


def test_without_a_token_every_route_answers_anyone():
    served = client(None)
    assert served.post("/predict", json=SAMPLE).status_code == 200
    assert served.get("/metrics").status_code == 200
    assert served.get("/health").json()["engine"] == "plain"
    # An Authorization header is not asked for, so it is not checked either.
    headers = {"Authorization": "Bearer anything"}
    assert served.post("/predict", json=SAMPLE, headers=headers).status_code == 200


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("fd00::2", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool):
    assert is_loopback(host) is loopback


def test_off_loopback_a_new_token_is_written_0600_under_dlscale_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path))
    assert required_token("127.0.0.1", 8123, None) == (None, None)
    token, path = required_token("0.0.0.0", 8123, None)
    assert path == tmp_path / "serve-model" / "token-8123"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    written = path.read_text().strip()
    assert len(written) >= 43 and token == BearerToken.of(written)  # 32 bytes, base64
    # A second start on the port replaces the token; the old one no longer opens the door.
    token_again, _ = required_token("::", 8123, None)
    assert token_again != token and token_again == BearerToken.of(path.read_text().strip())


def test_a_token_file_is_used_even_on_loopback(tmp_path: Path):
    given = tmp_path / "token"
    given.write_text(f"  {TOKEN}\n")
    assert required_token("127.0.0.1", 8123, given) == (BearerToken.of(TOKEN), given)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it"),
        ("", "a token of 0 characters"),
        ("short", "a token of 5 characters"),
        ("two words of a token here", "spaces or control characters"),
        ("é" * 20, "must be ASCII"),
    ],
)
def test_a_bad_token_file_is_one_line(tmp_path: Path, content: str | None, says: str):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as caught:
        read_token_file(path)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_token_file_that_never_ends_is_read_only_as_far_as_a_token_goes():
    """/dev/zero as --token-file: a bounded read, then one line (it read forever before)."""
    with pytest.raises(UserError, match="characters"):
        read_token_file(Path("/dev/zero"))
