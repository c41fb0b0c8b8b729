"""Attacks on a deployment that need no server: the copy of the source job's model (a job
controls what its folder holds once it has ended: links, hard links) and the proxy's bounds on
the answers of a sandbox that may run the tenant's own code."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from dlscale.errors import UserError
from dlscale.service import model_proxy
from dlscale.service.deploy import Claims, copy_model
from dlscale.service.layout import MODEL, SOCKET, folder_bytes
from dlscale.service.model_proxy import InFlight, NotServed, forward


def _job(root: Path, checkpoint: bytes = b"weights") -> Path:
    """A finished train job's folder as the server finds it: run/run.json, a checkpoint, inputs/."""
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    (root / "inputs").mkdir()
    (run / "run.json").write_text("{}")
    (run / "checkpoints" / "last.pt").write_bytes(checkpoint)
    return root


def test_the_copy_of_a_plain_run_holds_its_record_and_checkpoints(tmp_path):
    copy_model(_job(tmp_path / "job"), tmp_path / "deployment")
    model = tmp_path / "deployment" / MODEL
    assert (model / "run.json").read_text() == "{}"
    assert (model / "checkpoints" / "last.pt").read_bytes() == b"weights"


def test_a_run_folder_replaced_by_a_link_is_not_followed(tmp_path):
    """The job's code can swap its own run/ for a link to another tenant's run once it has
    written its result: the server, reading as itself, must not copy what the link names."""
    victim = _job(tmp_path / "victim", b"someone else's weights")
    job = tmp_path / "job"
    (job / "inputs").mkdir(parents=True)
    (job / "run").symlink_to(victim / "run")
    with pytest.raises(UserError, match="run"):
        copy_model(job, tmp_path / "deployment")
    assert not (tmp_path / "deployment" / MODEL / "checkpoints").exists()


def test_a_checkpoints_folder_replaced_by_a_link_is_not_followed(tmp_path):
    victim = _job(tmp_path / "victim", b"someone else's weights")
    job = tmp_path / "job"
    (job / "run").mkdir(parents=True)
    (job / "inputs").mkdir()
    (job / "run" / "run.json").write_text("{}")
    (job / "run" / "checkpoints").symlink_to(victim / "run" / "checkpoints")
    with pytest.raises(UserError, match="no checkpoint"):
        copy_model(job, tmp_path / "deployment")
    assert not list((tmp_path / "deployment").rglob("*.pt"))


def test_hard_links_the_quota_never_counted_are_not_copied(tmp_path):
    """The storage quota counts a file with several links as nothing (layout.folder_bytes), so
    copying each link name in full would let one job's deploys write N × its quota."""
    job = _job(tmp_path / "job", bytes(1 << 20))
    for i in range(5):
        os.link(job / "run" / "checkpoints" / "last.pt", job / "run" / "checkpoints" / f"l{i}.pt")
    with pytest.raises(UserError, match="links"):
        copy_model(job, tmp_path / "deployment")
    assert folder_bytes(tmp_path / "deployment") < 1 << 20


def test_the_copy_stops_once_it_passes_the_tenants_storage_left(tmp_path):
    """Checked while copying, not after: 3 MiB of checkpoints against 1 MiB left stops at the
    second file, never writing the third."""
    job = _job(tmp_path / "job", bytes(1 << 20))
    for name in ("b.pt", "c.pt"):
        (job / "run" / "checkpoints" / name).write_bytes(bytes(1 << 20))
    with pytest.raises(UserError, match="storage quota"):
        copy_model(job, tmp_path / "deployment", budget_bytes=(1 << 20) + 100)
    assert len(list((tmp_path / "deployment").rglob("*.pt"))) <= 2


def test_requests_in_flight_to_one_model_are_capped_and_released():
    limit = InFlight(2)
    with limit.slot("a"), limit.slot("a"):
        with pytest.raises(NotServed) as refused, limit.slot("a"):
            pass
        assert refused.value.status == 429 and refused.value.retry_after_s
        with limit.slot("b"):  # another model is not held up
            assert limit.counts == {"a": 2, "b": 1}
    assert limit.counts == {}


def test_an_answer_that_trickles_is_cut_at_the_deadline(tmp_path, monkeypatch):
    """A sandbox (the tenant's code can bind its own server on the socket) that sends its
    headers and then a byte every 0.2 s: each read is quick, so only a deadline on the whole
    exchange ends it, with 504."""
    monkeypatch.setattr(model_proxy, "ANSWER_TIMEOUT_S", 0.5)
    sent = []

    async def trickle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        for _ in range(100):
            writer.write(b"x")
            sent.append(time.monotonic())
            await writer.drain()
            await asyncio.sleep(0.2)

    async def main():
        server = await asyncio.start_unix_server(trickle, path=str(tmp_path / SOCKET))
        async with server:
            with pytest.raises(NotServed) as stopped:
                await forward(tmp_path, os.getuid(), "GET", "/health", b"")
        return stopped.value

    stopped = asyncio.run(main())
    assert stopped.status == 504
    assert len(sent) < 100  # ended before the engine finished its answer


def test_one_deployment_at_a_time_is_made_for_a_tenant():
    """Each deploy reads the storage left before it copies; two at once could each copy that."""
    claims = Claims()
    assert claims.claim("lab") and not claims.claim("lab") and claims.claim("other")
    claims.release("lab")
    assert claims.claim("lab") and claims.held == {"lab", "other"}


def test_a_source_job_folder_gone_copies_nothing_from_the_servers_own_folder(tmp_path, monkeypatch):
    """The job deleted while it is deployed: its folder cannot be opened, and nothing may then
    be read relative to the server's working folder (which may hold a run/ of its own)."""
    _job(tmp_path / "cwd")
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(UserError, match="folder is gone"):
        copy_model(tmp_path / "deleted", tmp_path / "deployment")
    assert not (tmp_path / "deployment").exists()
