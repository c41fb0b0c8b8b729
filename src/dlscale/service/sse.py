"""Server-sent events from an append-only file: each complete line one event, its id the byte
offset after it, so a client reconnecting with Last-Event-ID resumes with no gap or repeat."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from dlscale.service.layout import tail

POLL_S = 0.25
HEARTBEAT_S = 15.0


def start_offset(last_event_id: str | None, after: int | None) -> int:
    """Where a stream starts: the Last-Event-ID header (a reconnect), else `?after=`, else 0."""
    for value in (last_event_id, after):
        if value is None:
            continue
        try:
            offset = int(value)
        except (TypeError, ValueError):
            continue
        if 0 <= offset < 2**53:  # a file offset; anything larger cannot be one (seek would fail)
            return offset
    return 0


def _event(kind: str, data: str, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = "".join(f"data: {part}\n" for part in data.split("\n"))
    return f"{head}event: {kind}\n{body}\n"


async def follow(
    path: Path,
    offset: int,
    kind: str,
    ended: Callable[[], str | None],
    follow: bool = True,
) -> AsyncIterator[str]:
    """Events for the lines of `path` from `offset`; while `follow`, waits for more until
    `ended()` names the job's final state, then sends what is left and an `end` event."""
    idle_s = 0.0
    while True:
        lines, offset = await run_in_threadpool(tail, path, offset)
        for end, line in lines:
            yield _event(kind, line, end)
        if lines:
            idle_s = 0.0
            continue
        state = await run_in_threadpool(ended)
        if state is not None or not follow:
            lines, offset = await run_in_threadpool(tail, path, offset)  # written just before
            for end, line in lines:
                yield _event(kind, line, end)
            yield _event("end", state or "streaming")
            return
        await asyncio.sleep(POLL_S)
        idle_s += POLL_S
        if idle_s >= HEARTBEAT_S:  # a comment keeps proxies from closing a quiet stream
            idle_s = 0.0
            yield ": still running\n\n"
