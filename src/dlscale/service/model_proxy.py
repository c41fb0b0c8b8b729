"""A tenant's request to its deployed model, forwarded as raw bytes to the engine in the job's
sandbox over the Unix socket in the job's folder, and the engine's answer handed back.

The server reads only the body's size (up to the limit, never past it) and never parses it: the
engine in the sandbox checks it (serving/inputs.py). What comes back is the sandbox's too (the
engine may run the tenant's own model code): its status is passed on only when it is one the
engine answers with, its body only up to a bound, and with the server's own headers.

The socket is reached without following a link: the job could put a link in its place, pointing
at any socket the server can reach (the database's, another job's). The server opens the name
with O_PATH | O_NOFOLLOW, checks that the inode is a socket of the job's own uid, and connects
through /proc/self/fd/N, which names that inode and no other (and is short: a socket's path is
limited to 107 bytes, a job folder's is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import Request

from dlscale.service.layout import SOCKET

MAX_BODY_BYTES = 16 * 1024 * 1024  # the engine's own limit (serving/inputs.py), checked first
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # 256 predictions are a few KiB; metrics fewer
PASSED_STATUSES = (200, 400, 413, 422)  # what the engine's routes answer (serving/routes.py)
CONNECT_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 120.0  # one request, whole: one model call on at most 256 samples
MAX_IN_FLIGHT = 8  # requests a model holds in the server at once: its engine answers one by one


class NotServed(Exception):
    """Why a request did not reach the model or its answer did not come back, in one line,
    with the HTTP status it answers (and a Retry-After for a wait that ends)."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


class InFlight:
    """Requests under way to each deployed model, at most `limit` each (429 past it), taken
    before a body is read: each holds up to 16 MiB and three descriptors in the server, and the
    engine answers them one at a time anyway."""

    def __init__(self, limit: int = MAX_IN_FLIGHT):
        self.limit = limit
        self.counts: dict[str, int] = {}

    @contextlib.contextmanager
    def slot(self, job_id: str):
        # The routes run on the server's one event loop: nothing runs between the check and
        # the count, so no lock.
        if self.counts.get(job_id, 0) >= self.limit:
            raise NotServed(429, f"{self.limit} requests to this model are under way; try again", 1)
        self.counts[job_id] = self.counts.get(job_id, 0) + 1
        try:
            yield
        finally:
            self.counts[job_id] -= 1
            if not self.counts[job_id]:
                del self.counts[job_id]


async def read_body(request: Request) -> bytes:
    """The request's body, refused (413) past MAX_BODY_BYTES without reading further."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise NotServed(
            413, f"a body of {declared} bytes; the model takes at most {MAX_BODY_BYTES}"
        )
    too_big = NotServed(413, f"a body of over {MAX_BODY_BYTES} bytes; at most that is read")
    return await _at_most(request.stream(), MAX_BODY_BYTES, too_big)


def open_socket(folder: Path, uid: int | None) -> int:
    """An O_PATH descriptor of the engine's socket in `folder`: a socket itself (not a link
    to one), and the job's own when it runs as a uid of its own."""
    try:
        fd = os.open(Path(folder) / SOCKET, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotServed(503, "the model is not listening yet (loading); try again", 2) from None
    except OSError:
        raise NotServed(503, "the model's socket cannot be reached; try again", 2) from None
    info = os.fstat(fd)
    if not stat.S_ISSOCK(info.st_mode) or (uid is not None and info.st_uid != uid):
        os.close(fd)
        raise NotServed(502, f"the job's {SOCKET} is not a socket of its own; nothing was sent")
    return fd


async def forward(folder: Path, uid: int | None, method: str, path: str, body: bytes) -> Answer:
    """Send `body` to the engine at `path` and return its status and body (bounded)."""
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):  # the whole exchange, not each read
            return await _exchange(folder, uid, method, path, body)
    except TimeoutError:
        raise NotServed(504, f"the model did not answer within {ANSWER_TIMEOUT_S:g} s") from None


async def _exchange(folder: Path, uid: int | None, method: str, path: str, body: bytes) -> Answer:
    fd = open_socket(folder, uid)
    timeout = httpx.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    transport = httpx.AsyncHTTPTransport(uds=f"/proc/self/fd/{fd}")
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://engine", timeout=timeout
        ) as client:
            # Raw bytes back, never a compressed answer to inflate here.
            headers = {"accept-encoding": "identity"}
            if method == "POST":
                headers["content-type"] = "application/json"
            async with client.stream(method, path, content=body, headers=headers) as answer:
                too_big = NotServed(502, f"the model's answer is over {MAX_ANSWER_BYTES} bytes")
                data = await _at_most(answer.aiter_raw(), MAX_ANSWER_BYTES, too_big)
                status = answer.status_code
    except httpx.ConnectError:
        raise NotServed(503, "the model is not accepting requests (stopping?)", 2) from None
    except httpx.TimeoutException:
        raise NotServed(504, f"the model did not answer within {ANSWER_TIMEOUT_S:g} s") from None
    except httpx.HTTPError:
        raise NotServed(502, "the model's engine broke off its answer") from None
    finally:
        os.close(fd)
    if status not in PASSED_STATUSES:
        raise NotServed(502, f"the model's engine failed on this request ({status}); see its log")
    return Answer(status, data)


async def _at_most(stream: AsyncIterator[bytes], limit: int, too_big: NotServed) -> bytes:
    """The stream's bytes, `too_big` raised as soon as they pass `limit` (nothing more read)."""
    chunks, size = [], 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)
