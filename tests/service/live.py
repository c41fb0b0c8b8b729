"""A real `dlscale serve` on 127.0.0.1 and a free port, for tests that need one: started as its
own process (so it can be killed with -9 and restarted on the same data dir), with users,
tenants and tokens made through the admin verbs (no defaults exist)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dlscale.service import admin
from dlscale.service.executor import end_sandboxes
from tests.conftest import default_sigint


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    def __init__(
        self, data_dir: Path, cpu_slots: int = 1, db_url: str | None = None, *options: str
    ):
        self.data_dir = Path(data_dir)
        self.cpu_slots = cpu_slots
        self.db_url = db_url
        self.options = list(options)  # more of `python -m dlscale.service`'s flags
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log = self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> LiveServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "dlscale.service",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--cpu-slots",
            str(self.cpu_slots),
        ]
        if self.db_url:
            command += ["--db", self.db_url]
        command += self.options
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=default_sigint
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(
            f"server did not answer in {timeout_s} s: {self.log.read_text()[-2000:]}"
        )

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server, then the jobs it left running (a real server leaves them running
        on purpose: they outlive it; a test's must not outlive the test)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        end_sandboxes(self.data_dir / "sandboxes")

    # ------------------------------------------------------------ people and tokens

    def user(
        self,
        name: str,
        tenant: str,
        role: str = "editor",
        admin_user: bool = False,
        scope: str = "write",
        **tenant_quota,
    ) -> tuple[str, str]:
        """(password, token) of a new user who is `role` in `tenant` (made if missing)."""
        password = admin.create_user(self.data_dir, self.db_url, name, admin_user)
        try:
            admin.create_tenant(self.data_dir, self.db_url, tenant, **tenant_quota)
        except Exception as exc:  # the tenant exists already
            if "exists" not in str(exc):
                raise
        admin.add_member(self.data_dir, self.db_url, tenant, name, role)
        token = admin.issue_token(self.data_dir, self.db_url, name, scope, None)
        return password, token

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def wait_for_state(
    client: httpx.Client, job_id: str, states: tuple[str, ...], timeout_s: float = 180.0
) -> dict:
    deadline = time.monotonic() + timeout_s
    job = {}
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job.get("state") in states:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach {states}: {job}")
