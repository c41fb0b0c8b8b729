"""HTTP to a dlscale server for `dlscale remote`: the token, answers turned into one-line
errors, server-sent events resumed by Last-Event-ID, and verified, no-clobber downloads."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from dlscale.atomic import temp_beside
from dlscale.errors import UserError, one_line

DEFAULT_SERVER = "http://127.0.0.1:8080"
TOKEN_VARIABLE = "DLSCALE_TOKEN"
TIMEOUT_S = 30.0
MODEL_TIMEOUT_S = 150.0  # the server waits up to 120 s for one model call
# A followed log is quiet while a job trains; the server sends a comment every 15 s, so a read
# that waits this long means the connection is gone, and the stream is resumed.
STREAM_READ_TIMEOUT_S = 60.0
MAX_RECONNECTS = 8  # consecutive tries without a new event (a server restart takes seconds)
RETRY_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0)


@dataclass
class Event:
    id: int | None
    kind: str
    data: str


def token_from_environment() -> str:
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise UserError(
            f"set {TOKEN_VARIABLE} to an API token (an admin makes one: dlscale serve admin token "
            "USER)"
        )
    if not token.isascii() or any(char.isspace() for char in token):
        raise UserError(f"{TOKEN_VARIABLE} is not a token (it has spaces or non-ASCII characters)")
    return token


def check_server(server: str) -> str:
    """The server URL without a trailing slash; a token to a remote host over plain http is
    readable by anyone on the path, so that is refused."""
    parts = urlsplit(server.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--server {server}: use http://HOST:PORT or https://HOST")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise UserError(
            f"--server {server}: the token would travel unencrypted; use https:// (TLS in front "
            "of dlscale serve)"
        )
    return server.strip().rstrip("/")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def detail_of(response: httpx.Response) -> str:
    """The server's one-line reason ({"detail": ...}), else the status line."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list) and detail:  # FastAPI's own validation shape
        detail = detail[0].get("msg") if isinstance(detail[0], dict) else detail[0]
    if not detail:
        detail = f"{response.status_code} {response.reason_phrase}".strip()
    return one_line(str(detail))


class Remote:
    """One server and one token; every failure becomes a UserError with the exit code the CLI
    documents (1: the server said no or cannot be reached; 2: what was sent is invalid)."""

    def __init__(self, server: str, token: str, transport: httpx.BaseTransport | None = None):
        self.server = check_server(server)
        self.http = httpx.Client(
            base_url=self.server,
            headers={"Authorization": f"Bearer {token}"},
            timeout=TIMEOUT_S,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def check(self, response: httpx.Response, job: str | None = None) -> httpx.Response:
        if response.is_success:
            return response
        response.read()
        status, detail = response.status_code, detail_of(response)
        if status == 401:
            raise UserError(f"not signed in: bad or expired {TOKEN_VARIABLE}", 1)
        if status == 404 and job is not None and detail != "artifact not found":
            # The server answers alike for a job of another tenant and one that does not exist.
            raise UserError(f"job {job} not found", 1)
        if status == 422:
            raise UserError(detail, 2)
        if status == 503:  # busy: the server says when to try again
            raise UserError(detail, 1)
        if status >= 500:
            raise UserError(f"the server failed ({status}): {detail}", 1)
        raise UserError(detail, 1)

    def _unreachable(self, exc: httpx.TransportError) -> UserError:
        if isinstance(exc, httpx.ConnectError):
            return UserError(f"cannot reach the dlscale server at {self.server}", 1)
        if isinstance(exc, httpx.TimeoutException):
            return UserError(f"the dlscale server at {self.server} did not answer in time", 1)
        return UserError(f"lost the connection to the dlscale server at {self.server}", 1)

    def call(self, method: str, path: str, job: str | None = None, **kwargs) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return self.check(response, job)

    def json(self, method: str, path: str, job: str | None = None, **kwargs):
        return self.call(method, path, job, **kwargs).json()

    def model(self, path: str, job: str, body: bytes) -> dict:
        """A deployed model's answer to `body`; its refusal of the body ({"error": ...}: 400,
        413, 422) is a UserError with exit 2, as for any invalid input."""
        headers = {"content-type": "application/json"}
        try:
            response = self.http.post(path, content=body, headers=headers, timeout=MODEL_TIMEOUT_S)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if response.status_code in (400, 413, 422):
            try:
                said = response.json().get("error")
            except (ValueError, AttributeError):
                said = None
            if isinstance(said, str):
                raise UserError(f"the model refused the inputs: {one_line(said)}", 2)
        return self.check(response, job).json()

    def events(self, path: str, job: str, follow: bool) -> Iterator[Event]:
        """The stream's events up to and including `end`; a dropped connection is resumed
        from the last event's id, so no event is lost or repeated."""
        last_id: int | None = None
        failures = 0
        answered = False
        timeout = httpx.Timeout(TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        while True:
            headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
            params = {"follow": "true" if follow else "false"}
            try:
                with self.http.stream(
                    "GET", path, params=params, headers=headers, timeout=timeout
                ) as response:
                    answered = True
                    self.check(response, job)
                    for event in parse_events(response.iter_text()):
                        failures = 0
                        last_id = event.id if event.id is not None else last_id
                        yield event
                        if event.kind == "end":
                            return
            except httpx.TransportError as exc:
                # A server that was never reached is named at once; a drop is resumed.
                if failures >= MAX_RECONNECTS or (last_id is None and not answered):
                    raise self._unreachable(exc) from None
            failures += 1  # a drop, or a stream closed before its `end` event
            if failures > MAX_RECONNECTS:
                raise UserError(f"the stream of job {job} kept closing before its end", 1)
            time.sleep(RETRY_BACKOFF_S[min(failures - 1, len(RETRY_BACKOFF_S) - 1)])

    def download(self, path: str, job: str, out: Path, sha256: str, force: bool) -> None:
        """Stream to a temporary file beside `out`, check its sha256, then move it into place
        at once: `out` is never half-written, and an existing one is kept unless `force`."""
        if out.exists() and not force:
            raise UserError(f"{out} exists; add --force to replace it")
        if not out.parent.is_dir():
            raise UserError(f"{out.parent}: folder not found")
        with temp_beside(out) as (handle, name):  # removed if anything below raises
            part = Path(name)
            digest = self._fetch(path, job, handle)
            handle.flush()
            os.fsync(handle.fileno())
            if digest != sha256:
                raise UserError(
                    f"download corrupt: sha256 {digest} but the server lists {sha256}; "
                    f"{out} not written",
                    1,
                )
            _place(part, out, force)
            part.unlink(missing_ok=True)  # linked into place: `out` is the file now

    def _fetch(self, path: str, job: str, handle) -> str:
        """Write the answer's bytes to `handle`; their sha256 (hex)."""
        digest = hashlib.sha256()
        try:
            with self.http.stream("GET", path) as response:
                self.check(response, job)
                for chunk in response.iter_bytes():
                    digest.update(chunk)
                    handle.write(chunk)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        return digest.hexdigest()


def _place(part: Path, out: Path, force: bool) -> None:
    if force:
        os.replace(part, out)
        return
    try:
        os.link(part, out)  # fails if `out` appeared meanwhile: never clobbered
    except FileExistsError:
        raise UserError(f"{out} exists; add --force to replace it") from None


def parse_events(chunks: Iterator[str]) -> Iterator[Event]:
    """Server-sent events from a text stream (the WHATWG format: `field: value` lines, a blank
    line ends an event, `:` lines are comments). Lines split on \\n only, so a log line with a
    carriage return inside stays one line; an event cut off by a drop is never yielded."""
    buffer = ""
    fields: dict[str, list[str]] = {}
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split("\n")
        for line in lines:
            line = line.removesuffix("\r")
            if not line:
                if fields:
                    yield _event(fields)
                fields = {}
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))


def _event(fields: dict[str, list[str]]) -> Event:
    raw_id = (fields.get("id") or [""])[-1]
    return Event(
        id=int(raw_id) if raw_id.isdigit() else None,
        kind=(fields.get("event") or ["message"])[-1],
        data="\n".join(fields.get("data", [])),
    )
