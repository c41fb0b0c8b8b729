"""Limits the service enforces before any route runs: request body size, failed-auth rate."""

from __future__ import annotations

import json
import threading
import time
from collections import deque

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` answers 413 without being read into memory.

    A declared Content-Length over the limit is refused before one byte is read; a body sent in
    chunks (no length) is counted as it streams and cut off at the limit."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is None and b"transfer-encoding" in headers:
            # A chunked upload's size is known only once read; ask for the length up front.
            return await _answer(send, 411, "send uploads with a Content-Length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await _answer(send, 400, "Content-Length is not a number")
            if declared > self.max_bytes:
                return await _answer(send, 413, self._message())
        received = 0
        started = False

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _answer(send, 413, self._message())

    def _message(self) -> str:
        return f"request body over {self.max_bytes // (1024 * 1024)} MiB (the upload limit)"


async def _answer(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class FailureLimiter:
    """Failed logins and bad tokens per client address in a sliding window: past `limit`
    failures within `window_s`, that address is answered 429 until the oldest one ages out."""

    def __init__(self, limit: int = 10, window_s: float = 60.0, clock=time.monotonic):
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str) -> deque[float]:
        now = self.clock()
        failures = self._failures.setdefault(key, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def retry_after_s(self, key: str) -> int | None:
        """Seconds until `key` may try again, or None when it is not limited."""
        with self._lock:
            failures = self._recent(key)
            if len(failures) < self.limit:
                return None
            return max(1, int(failures[0] + self.window_s - self.clock()) + 1)

    def fail(self, key: str) -> None:
        with self._lock:
            self._recent(key).append(self.clock())
            if len(self._failures) > 10_000:  # bounded memory under a spray of addresses
                for stale in [k for k, v in self._failures.items() if not v][:5_000]:
                    del self._failures[stale]
