"""`dlscale remote` against scripted HTTP answers (httpx.MockTransport): a log stream cut off
mid-event resumes by Last-Event-ID with no line lost or repeated, every error answer becomes
one line and its exit code, and a download is checked by sha256 and never clobbers a file."""

from __future__ import annotations

import functools
import hashlib
import json
import socket

import httpx
import pytest
from typer.testing import CliRunner

from dlscale.cli import remote as remote_cli
from dlscale.cli.main import app
from dlscale.cli.remote_client import Remote, parse_events
from tests.conftest import interrupt_next_create

JOB = "0123456789abcdef"
runner = CliRunner()


class Dropping(httpx.SyncByteStream):
    """Sends `chunks`, then fails like a connection reset by the peer."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    def __iter__(self):
        yield from self.chunks
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def invoke(monkeypatch, handler, *args: str):
    monkeypatch.setenv("DLSCALE_TOKEN", "dls_test")
    monkeypatch.setattr(
        remote_cli, "Remote", functools.partial(Remote, transport=httpx.MockTransport(handler))
    )
    return runner.invoke(app, ["remote", *args])


def test_events_are_parsed_by_the_sse_rules_and_a_cut_event_is_never_yielded():
    chunks = [
        ": still running\n\n",
        "id: 4\nevent: log\ndata: a\rb\n\n",  # a carriage return inside a log line stays in it
        'id: 9\nevent: metrics\ndata: {"epoch": 1}\ndata: x\n\nid: 12\nev',
        "ent: log\ndata: cut",  # the connection drops here
    ]
    events = list(parse_events(iter(chunks)))
    assert [(e.id, e.kind, e.data) for e in events] == [
        (4, "log", "a\rb"),
        (9, "metrics", '{"epoch": 1}\nx'),
    ]


def test_a_followed_log_cut_mid_event_resumes_by_last_event_id_without_repeats(monkeypatch):
    seen_ids = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_ids.append(request.headers.get("last-event-id"))
        assert request.headers["authorization"] == "Bearer dls_test"
        assert request.url.path == f"/api/jobs/{JOB}/logs"
        assert request.url.params["follow"] == "true"
        if len(seen_ids) == 1:
            body = [b"id: 6\nevent: log\ndata: one\n\n", b"id: 10\nevent: log\ndata: two\n\nid: 1"]
            return httpx.Response(200, stream=Dropping(body))
        return httpx.Response(
            200,
            content=b"id: 16\nevent: log\ndata: three\n\nevent: end\ndata: succeeded\n\n",
            headers={"content-type": "text/event-stream"},
        )

    result = invoke(monkeypatch, handler, "logs", "-f", JOB)
    assert result.exit_code == 0, result.output
    assert seen_ids == [None, "10"]
    assert result.stdout.splitlines()[:3] == ["one", "two", "three"]
    assert f"job {JOB} succeeded" in result.stdout


def test_a_stream_that_keeps_dropping_ends_with_one_line_and_exit_1(monkeypatch):
    monkeypatch.setattr("dlscale.cli.remote_client.RETRY_BACKOFF_S", (0.0,))
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        first = len(calls) == 1
        return httpx.Response(200, stream=Dropping([b"id: 3\nevent: log\ndata: x\n\n"] * first))

    result = invoke(monkeypatch, handler, "logs", "-f", JOB)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == ["x"]
    assert "lost the connection" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert len(calls) == 1 + 8  # the first stream and MAX_RECONNECTS tries, all after id 3
    assert {r.headers.get("last-event-id") for r in calls[1:]} == {"3"}


@pytest.mark.parametrize(
    ("status", "detail", "message", "exit_code"),
    [
        (401, "invalid token", "not signed in: bad or expired DLSCALE_TOKEN", 1),
        (404, "job not found", f"job {JOB} not found", 1),
        (422, "data.path: file not found: inputs/x.npz", "data.path: file not found", 2),
        (403, "this token is read-only (scope read)", "read-only", 1),
        (500, "Internal Server Error", "the server failed (500)", 1),
    ],
)
def test_error_answers_become_one_line_and_the_documented_exit_code(
    monkeypatch, status, detail, message, exit_code
):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"detail": detail})

    for args in (("status", JOB), ("cancel", JOB), ("logs", JOB), ("artifacts", JOB)):
        result = invoke(monkeypatch, handler, *args)
        assert result.exit_code == exit_code, (args, result.output)
        assert message in result.stderr and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_token_or_server_the_cli_says_what_is_missing(monkeypatch):
    monkeypatch.delenv("DLSCALE_TOKEN", raising=False)
    result = runner.invoke(app, ["remote", "status", JOB])
    assert result.exit_code == 2 and "DLSCALE_TOKEN" in result.stderr
    monkeypatch.setenv("DLSCALE_TOKEN", "dls_x")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for args in (("status", JOB), ("logs", "-f", JOB)):
        result = runner.invoke(app, ["remote", *args, "--server", url])
        assert result.exit_code == 1, result.output
        assert result.stderr.strip() == f"error: cannot reach the dlscale server at {url}"
    result = runner.invoke(
        app, ["remote", "status", JOB], env={"DLSCALE_SERVER": "http://10.1.2.3"}
    )
    assert result.exit_code == 2 and "unencrypted" in result.stderr


def _artifact_server(payload: bytes, listed_sha256: str):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/api/jobs/{JOB}/artifacts":
            row = {"id": "aB_1", "name": "run.json", "size": len(payload), "sha256": listed_sha256}
            return httpx.Response(200, json=[row])
        assert request.url.path == f"/api/jobs/{JOB}/artifacts/aB_1"
        return httpx.Response(200, content=payload)

    return handler


def test_a_download_is_checked_by_sha256_and_never_clobbers_without_force(monkeypatch, tmp_path):
    payload = json.dumps({"final": {"val_accuracy": 0.9}}).encode()
    good = _artifact_server(payload, hashlib.sha256(payload).hexdigest())
    out = tmp_path / "run.json"
    listing = invoke(monkeypatch, good, "artifacts", JOB)
    assert listing.exit_code == 0
    assert hashlib.sha256(payload).hexdigest() in listing.stdout and "run.json" in listing.stdout

    bad = _artifact_server(payload, "0" * 64)
    result = invoke(monkeypatch, bad, "artifacts", JOB, "--download", "aB_1", "--out", str(out))
    assert result.exit_code == 1 and "download corrupt" in result.stderr
    assert list(tmp_path.iterdir()) == []  # neither the file nor a leftover part

    out.write_bytes(b"mine")
    result = invoke(monkeypatch, good, "artifacts", JOB, "--download", "aB_1", "--out", str(out))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert out.read_bytes() == b"mine"
    forced = ("artifacts", JOB, "--download", "aB_1", "--out", str(out), "--force")
    assert invoke(monkeypatch, good, *forced).exit_code == 0
    assert out.read_bytes() == payload and sorted(tmp_path.iterdir()) == [out]
    missing = invoke(monkeypatch, good, "artifacts", JOB, "--download", "nope", "--out", str(out))
    assert missing.exit_code == 1 and "has no artifact nope" in missing.stderr


def test_a_file_that_appears_during_the_download_is_kept(monkeypatch, tmp_path):
    payload = b"weights"
    out = tmp_path / "model.pt"
    listed = _artifact_server(payload, hashlib.sha256(payload).hexdigest())

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/aB_1"):
            out.write_bytes(b"written meanwhile")  # by another program, mid-download
        return listed(request)

    result = invoke(monkeypatch, handler, "artifacts", JOB, "--download", "aB_1", "--out", str(out))
    assert result.exit_code == 2 and "exists" in result.stderr
    assert out.read_bytes() == b"written meanwhile" and sorted(tmp_path.iterdir()) == [out]


def test_ctrl_c_as_the_download_file_is_created_leaves_nothing(monkeypatch, tmp_path):
    payload = b"weights"
    served = _artifact_server(payload, hashlib.sha256(payload).hexdigest())
    interrupt_next_create(monkeypatch, within=tmp_path)
    out = tmp_path / "model.pt"
    result = invoke(monkeypatch, served, "artifacts", JOB, "--download", "aB_1", "--out", str(out))
    assert isinstance(result.exception, KeyboardInterrupt) or result.exit_code == 130
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_following_stops_the_watching_not_the_job(monkeypatch):
    class Interrupted(httpx.SyncByteStream):
        def __iter__(self):
            yield b"id: 4\nevent: log\ndata: epoch 1\n\n"
            raise KeyboardInterrupt

    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request.method)
        return httpx.Response(200, stream=Interrupted())

    result = invoke(monkeypatch, handler, "logs", "-f", JOB)
    assert result.exit_code == 130 and result.stdout.splitlines() == ["epoch 1"]
    assert f"job {JOB} goes on" in result.stderr and "--resume" not in result.stderr
    assert requests == ["GET"]  # nothing was cancelled
