"""The service's heartbeat: every tick, see how each started job is doing, charge usage, and
start the queued jobs the scheduler picks, writing why each other one waits.

The database is the truth and only this server writes it; a job's process writes files in its
folder. A tick that finds a job's process gone reads its result; a restarted server does the
same for jobs started before the crash (the jobs run in sessions of their own and survive it).
A job is marked `starting` and committed BEFORE its process is spawned: a crash in between
leaves a `starting` job with no process, which is started again after a grace period; the job
process refuses to run a job that was already claimed, so no job ever runs twice.

While a job runs its folder is measured at every tick: at its tenant's storage quota it is
stopped, with the reason in its state and log, what it saved kept. A job that does not stop
within `cancel_kill_s` of being asked is killed. A job whose deletion was asked for is deleted
once it has ended.
"""

from __future__ import annotations

import json
import os
import threading
import time

from dlscale.atomic import WriteFailed
from dlscale.service import jobstore, store
from dlscale.service.config import ServiceConfig
from dlscale.service.db import serialize
from dlscale.service.db.models import Job, Tenant
from dlscale.service.executor import Executor
from dlscale.service.fairshare import charge
from dlscale.service.layout import (
    CLAIMED,
    LOG,
    append_line,
    folder_bytes,
    job_dir,
    list_artifacts,
    remove_job_dir,
)
from dlscale.service.scheduler import plan
from dlscale.service.scheduler_types import Machine, Request, Running
from dlscale.service.scheduler_types import Tenant as TenantQuota

CANCEL_RESEND_S = 5.0
START_TRIES = 3  # processes spawned for a job that never claims it before it is failed


def quota_of(tenant: Tenant) -> TenantQuota:
    return TenantQuota(
        tenant.name,
        tenant.weight,
        tenant.max_concurrent_jobs,
        tenant.cpu_slots,
        tenant.gpu_slots,
    )


class JobLoop:
    def __init__(self, config: ServiceConfig, maker, executor: Executor):
        self.config = config
        self.maker = maker
        self.executor = executor
        self.machine = Machine(config.cpu_slots, config.gpu_slots)
        self._signalled: dict[str, float] = {}  # job id -> when a cancel signal was last sent
        self._first_signal: dict[str, float] = {}  # job id -> when it was first asked to stop
        self._measured: dict[str, float] = {}  # job id -> when its folder was last measured
        # Deletions asked for while jobs ran: looked for once at start (a crash may have left
        # some), then only when a job that had one ends.
        self._deletions_due = True
        self._spawned: dict[str, float] = {}  # job id -> when this server last spawned it
        self._tries: dict[str, int] = {}  # job id -> processes this server spawned for it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one tick at a time (the thread, or a test calling tick)
        self.errors = 0

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dlscale-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # a bad tick must not stop the scheduler; say why, go on
                self.errors += 1
                print(f"dlscale serve: scheduler tick failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.config.tick_s)

    # ------------------------------------------------------------------ one tick

    def tick(self, now: float | None = None) -> list[str]:
        """Reconcile, charge, plan; returns the ids of the jobs started in this tick."""
        with self._lock:
            now = time.time() if now is None else now
            respawn = self._reconcile(now)
            with self.maker.begin() as db:
                serialize(db.connection())
                self._charge(db, now)
                started = self._plan(db, now)
            # Committed as 'starting' first: a crash from here on leaves a job to respawn.
            for job_id in respawn + started:
                self._spawn(job_id, now)
            self.executor.reap()
            return started

    def _spawn(self, job_id: str, now: float) -> None:
        self._spawned[job_id] = now
        self._tries[job_id] = self._tries.get(job_id, 0) + 1
        with self.maker.begin() as db:
            job = db.get(Job, job_id)
            if job is None:
                return
            tenant = db.get(Tenant, job.tenant_id)
            left = None
            if tenant.storage_bytes is not None:
                left = tenant.storage_bytes - jobstore.storage_used(db, tenant)
            limits = self.config.limits(job.cpu_slots, job.gpu_slots, job.id, left)
        try:
            self.executor.start(job_dir(self.config.data_dir, job_id), limits)
        except (OSError, WriteFailed) as exc:  # no process, or no record of the one it started
            self.executor.release(job_dir(self.config.data_dir, job_id))
            with self.maker.begin() as db:
                job = db.get(Job, job_id)
                if job is not None and job.state == "starting":
                    jobstore.transition(db, job, "failed", f"could not start its process: {exc}")

    def _reconcile(self, now: float) -> list[str]:
        """Look at each started job's process (outside any transaction: probing, hashing the
        artifacts and sizing the folder take time, and SQLite has one write lock), then record
        what changed in one short transaction."""
        with self.maker.begin() as db:
            active = [
                (job.id, job.state, bool(job.cancel_requested)) for job in jobstore.active_jobs(db)
            ]
        seen = {}
        for job_id, _state, cancel_requested in active:
            folder = job_dir(self.config.data_dir, job_id)
            probe = self.executor.probe(folder)
            if probe.claimed and not probe.alive and probe.result is None:
                probe = self.executor.probe(folder)  # it may have written its result just now
            if probe.alive and cancel_requested:
                self._ask_to_stop(job_id, folder, now)
            size = None
            if probe.alive and now - self._measured.get(job_id, 0.0) >= self.config.storage_check_s:
                self._measured[job_id] = now
                size = folder_bytes(folder)
            ended = None
            if not probe.alive and probe.result is not None:
                ended = (probe.result, folder_bytes(folder), list_artifacts(folder))
            elif not probe.alive and probe.claimed:
                lost = {"state": "failed", "message": self.executor.lost_message(folder)}
                ended = (lost, folder_bytes(folder), list_artifacts(folder))
            seen[job_id] = (probe, ended, size)
        respawn, over_quota = [], []
        with self.maker.begin() as db:
            serialize(db.connection())  # PostgreSQL: a cancel cannot interleave (SQLite: IMMEDIATE)
            for job in jobstore.active_jobs(db):
                if job.id not in seen:
                    continue  # started after the snapshot: the next tick looks at it
                probe, ended, size = seen[job.id]
                if ended is not None:
                    self._finish(db, job, *ended)
                    continue
                if size is not None and self._over_quota(db, job, size):
                    over_quota.append(job.id)
                if probe.alive or probe.claimed:
                    if job.state == "starting":
                        jobstore.transition(db, job, "running", "its process is running")
                elif job.cancel_requested:
                    if self._claim_unstarted(job.id):  # else its process claimed it just now
                        jobstore.transition(db, job, "cancelled", "cancelled before it started")
                else:  # 'starting', and no process has claimed it (yet)
                    since = self._spawned.get(job.id)
                    if since is not None and now - since < self.config.start_grace_s:
                        continue  # give the process time to start
                    if self._tries.get(job.id, 0) < START_TRIES:
                        respawn.append(job.id)
                    elif self._claim_unstarted(job.id):  # e.g. a broken environment
                        folder = job_dir(self.config.data_dir, job.id)
                        message = self.executor.lost_message(folder)
                        jobstore.transition(
                            db, job, "failed", f"its process never started: {message}"
                        )
        for job_id in over_quota:
            self._ask_to_stop(job_id, job_dir(self.config.data_dir, job_id), now)
        if self._deletions_due:
            self._delete_ended()
        return respawn

    def _ask_to_stop(self, job_id: str, folder, now: float) -> None:
        """Ask a running job to stop (SIGINT, resent every few seconds), and kill it once it has
        had `cancel_kill_s` to do so (a job may ignore the signal)."""
        first = self._first_signal.setdefault(job_id, now)
        if now - first >= self.config.cancel_kill_s:
            self.executor.cancel(folder, force=True)
        elif now - self._signalled.get(job_id, 0.0) >= CANCEL_RESEND_S:
            self.executor.cancel(folder)
            self._signalled[job_id] = now

    def _over_quota(self, db, job: Job, size: int) -> bool:
        """Record a running job's folder size; at its tenant's storage quota, mark it to be
        stopped (True the first time)."""
        job.bytes = size
        tenant = db.get(Tenant, job.tenant_id)
        if tenant.storage_bytes is None or job.stop_reason:
            return False
        db.flush()
        used = jobstore.storage_used(db, tenant)
        if used < tenant.storage_bytes:
            return False
        job.stop_reason = (
            f"stopped: tenant {tenant.name} reached its storage quota ({used:,} of "
            f"{tenant.storage_bytes:,} bytes); what the job saved is kept"
        )
        job.cancel_requested = True
        jobstore.note(db, job, job.stop_reason)
        append_line(job_dir(self.config.data_dir, job.id) / LOG, f"server: {job.stop_reason}")
        return True

    def _delete_ended(self) -> None:
        """Delete the jobs whose deletion was asked for while they ran, now that they ended."""
        self._deletions_due = False
        with self.maker.begin() as db:
            doomed = jobstore.deletable_jobs(db)
        for job_id in doomed:
            remove_job_dir(job_dir(self.config.data_dir, job_id))
            with self.maker.begin() as db:
                serialize(db.connection())
                job = db.get(Job, job_id)
                if job is not None:
                    jobstore.delete_job(db, job)

    def _claim_unstarted(self, job_id: str) -> bool:
        """Take the job's `claimed` marker for the server (O_EXCL, as the job process takes it):
        True when no process had claimed the job, which now none ever will, so it can be
        cancelled or failed without a late process training it unseen."""
        try:
            claim = job_dir(self.config.data_dir, job_id) / CLAIMED
            os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            return False
        except OSError:
            return True  # the folder is gone: nothing can run it
        return True

    def _finish(self, db, job: Job, result: dict, size: int, artifacts: list) -> None:
        state = result.get("state")
        if state not in jobstore.ENDED:
            state, result = "failed", {**result, "message": f"unknown result state {state!r}"}
        usage = self.executor.release(job_dir(self.config.data_dir, job.id))
        if usage is not None:
            result = {**result, "sandbox": usage}
            if usage.get("oom_kills") and state == "failed":
                result["message"] = (
                    f"{result.get('message') or 'failed'} (the kernel killed "
                    f"{usage['oom_kills']} of its processes at its memory limit)"
                )
        if job.stop_reason:
            state, result = "failed", {**result, "message": job.stop_reason}
        repro = json.loads(job.repro_json or "{}")
        repro.update(
            data_sha256=result.get("data_sha256"),
            weights_sha256=result.get("weights_sha256"),
            environment=result.get("environment"),
        )
        message = result.get("message") or state
        if job.rerun_of and state == "succeeded":
            original = db.get(Job, job.rerun_of)
            theirs = json.loads(original.repro_json or "{}") if original else {}
            mine = result.get("weights_sha256")
            if theirs.get("weights_sha256") and mine:
                same = theirs["weights_sha256"] == mine
                repro["reproduces"] = {"job": job.rerun_of, "identical": same}
                message = (
                    f"weights bit-identical to job {job.rerun_of}"
                    if same
                    else f"weights differ from job {job.rerun_of}"
                )
        job.result_json = json.dumps(result)
        job.repro_json = json.dumps(repro)
        job.bytes = size
        jobstore.set_artifacts(db, job, artifacts)
        jobstore.transition(db, job, state, message)
        self._deletions_due |= bool(job.delete_requested)
        for seen in (self._signalled, self._first_signal, self._measured, self._spawned):
            seen.pop(job.id, None)
        self._tries.pop(job.id, None)

    def _charge(self, db, now: float) -> None:
        active = jobstore.active_jobs(db)
        for tenant in store.tenants(db):
            elapsed = max(0.0, now - (tenant.usage_at or now))
            running = [
                Running(job.id, tenant.name, job.cpu_slots, job.gpu_slots, job.started_at or now)
                for job in active
                if job.tenant_id == tenant.id
            ]
            usage = charge(
                {tenant.name: tenant.usage or 0.0}, running, elapsed, self.config.half_life_s
            )
            tenant.usage = usage.get(tenant.name, 0.0)
            tenant.usage_at = now

    def _plan(self, db, now: float) -> list[str]:
        tenants = {t.id: t for t in store.tenants(db)}
        queued = jobstore.queued_jobs(db)
        if not queued:
            return []
        requests = [
            Request(
                job.id, tenants[job.tenant_id].name, job.cpu_slots, job.gpu_slots, float(job.seq)
            )
            for job in queued
        ]
        running = [
            Running(job.id, tenants[job.tenant_id].name, job.cpu_slots, job.gpu_slots)
            for job in jobstore.active_jobs(db)
        ]
        quotas = {t.name: quota_of(t) for t in tenants.values()}
        usage = {t.name: t.usage or 0.0 for t in tenants.values()}
        decision = plan(requests, running, quotas, self.machine, usage)
        by_id = {job.id: job for job in queued}
        for job_id in decision.start:
            jobstore.transition(
                db, by_id[job_id], "starting", "slots granted; starting its process"
            )
        for job_id, reason in decision.waiting.items():
            by_id[job_id].reason = reason
        return list(decision.start)
