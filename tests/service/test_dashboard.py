"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright) against a
real server: log in, see an invalid spec's one-line message, submit jobs through the form, watch
one finish (log, chart, time split, reproduction record, artifacts) and cancel one while it runs;
every request stays on 127.0.0.1 and the page logs no errors. Screenshots go to the test's
folder and, with DLSCALE_SCREENSHOTS=DIR, to DIR as well (the pictures in docs/service.md)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from fastapi.testclient import TestClient

from dlscale.errors import UserError
from dlscale.service import admin
from dlscale.service.app import create_app
from dlscale.service.config import ServiceConfig
from dlscale.service.headers import CONTENT_SECURITY_POLICY
from dlscale.service.timesplit import time_split
from tests.service.fakes import FakeExecutor
from tests.service.live import LiveServer

CHROMIUM = Path(os.environ.get("DLSCALE_CHROMIUM", "/usr/bin/chromium"))
SPEC = """\
name: digits-mlp
model: {name: mlp, kwargs: {hidden: [32]}}
data: {name: digits}
batch_size: 64
epochs: EPOCHS
optimizer: {name: sgd, lr: 0.1}
device: cpu
seed: 7
"""
NOTES = [{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"uploaded with the job\n"}]
INVALID = "name: broken\nmodel: {name: mlp}\n"
JOB_PAGE = re.compile(r"/jobs/[0-9a-f]{16}$")
# Playwright waits at most this long for what a job does (imports and training on a loaded
# machine); a passing run waits only as long as the job takes.
JOB_WAIT_MS = 120_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("dash") / "data", cpu_slots=2).start()
    yield live
    live.stop()


@pytest.fixture
def web(tmp_path):
    """The app in process, jobs moved by a fake executor (no training): (client, data dir,
    the app's state)."""
    config = ServiceConfig(data_dir=tmp_path / "data", cpu_slots=2)
    app = create_app(config, run_scheduler=False, executor=FakeExecutor())
    state = app.state.service
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, config.data_dir, state


def _member(data_dir: Path, name: str, tenant: str, role: str, admin_user=False) -> dict:
    admin.create_user(data_dir, None, name, admin_user)
    with contextlib.suppress(UserError):  # made for an earlier member
        admin.create_tenant(data_dir, None, tenant)
    admin.add_member(data_dir, None, tenant, name, role)
    return {"Authorization": f"Bearer {admin.issue_token(data_dir, None, name, 'write', None)}"}


def test_pages_answer_as_the_api_does_and_show_what_users_wrote_as_text(web):
    client, data_dir, state = web
    alice = _member(data_dir, "alice", "lab", "editor")
    victor = _member(data_dir, "victor", "lab", "viewer")
    bob = _member(data_dir, "bob", "other", "owner", admin_user=True)
    hostile = SPEC.replace("EPOCHS", "1") + "# </pre><script>alert(1)</script>\n"
    answer = client.post(
        "/api/jobs", headers=alice, files=[("spec", ("spec.yaml", hostile.encode()))]
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    state.loop.tick()  # the fake job starts and ends at once
    state.loop.tick()

    page = client.get(f"/jobs/{job_id}", headers=alice)
    assert page.status_code == 200
    assert "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "<script>alert" not in page.text
    assert 'id="cancel-button"' in page.text and 'id="rerun-button"' in page.text
    for headers in (page.headers, client.get("/api/health").headers):
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    # Under that policy inline code would not run: every script is a file, no style inline.
    for path in ("/", "/queue", "/admin", f"/jobs/{job_id}", "/login"):
        text = client.get(path, headers=bob if path == "/admin" else alice).text
        assert re.findall(r"<script\b[^>]*>", text) == ['<script src="/static/app.js" defer>']
        assert " style=" not in text and "<style" not in text, path

    # The API's refusals, as pages with the same status.
    viewer = client.get(f"/jobs/{job_id}", headers=victor)
    assert viewer.status_code == 200 and "cancel-button" not in viewer.text
    theirs = client.get(f"/jobs/{job_id}", headers=bob)
    nobody = client.get(f"/jobs/{'f' * 16}", headers=bob)
    assert theirs.status_code == nobody.status_code == 404
    assert "job not found" in theirs.text and job_id not in theirs.text
    refused = client.get("/admin", headers=victor)
    assert refused.status_code == 403 and "admins only" in refused.text
    # A rerun's page says whether it reproduced the original's weights, with a link to it.
    headers = {**alice, "Content-Length": "0"}
    rerun_id = client.post(f"/api/jobs/{job_id}/rerun", headers=headers).json()["id"]
    state.loop.tick()
    state.loop.tick()
    rerun = client.get(f"/jobs/{rerun_id}", headers=alice).text
    assert "Weights bit-identical to job" in rerun and f'href="/jobs/{job_id}"' in rerun
    signed_out = client.get(f"/jobs/{job_id}")
    assert signed_out.status_code == 401 and 'id="login-form"' in signed_out.text
    assert client.get("/static/app.js").status_code == 200  # public: code, no data


def test_the_time_split_comes_from_the_run_record_and_never_through_a_link(tmp_path):
    folder = tmp_path / "job"
    (folder / "run").mkdir(parents=True)
    assert time_split(folder) is None  # no record yet
    timing = {"steps": 10, "data_wait_s": 1.0, "h2d_s": 0.0, "compute_s": 3.0, "comm_wait_s": 0.0}
    (folder / "run" / "run.json").write_text(json.dumps({"timing": timing}))
    split = time_split(folder)
    assert split["steps"] == 10 and split["step_s"] == 4.0
    shares = [(part["name"], part["share"]) for part in split["parts"]]
    assert shares == [
        ("data wait", 0.25),
        ("host to device", 0.0),
        ("compute", 0.75),
        ("communication", 0.0),
    ]
    elsewhere = tmp_path / "other-tenant.json"
    (folder / "run" / "run.json").rename(elsewhere)
    (folder / "run" / "run.json").symlink_to(elsewhere)
    assert time_split(folder) is None  # a job may plant a link; the server does not follow it


def _shoot(page, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    wanted = os.environ.get("DLSCALE_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(wanted) / path.name)


def _until(read, done, timeout_s: float = JOB_WAIT_MS / 1000):
    """`read()` again until `done` says yes of what it read (a deadline, so a hang fails)."""
    deadline = time.monotonic() + timeout_s
    while not done(value := read()):
        assert time.monotonic() < deadline, value
        time.sleep(0.2)
    return value


def _submit(page, spec: str, files: list[dict] | None = None) -> str:
    """Submit `spec` (and data `files`) through the jobs page's form; the id of the job whose
    page it lands on."""
    page.goto("/")
    page.fill("#submit-spec", spec)
    if files:
        page.set_input_files("#submit-files", files=files)
    page.click("#submit-button")
    page.wait_for_url(JOB_PAGE)
    return page.url.rsplit("/", 1)[1]


@pytest.mark.slow
@pytest.mark.heavy
def test_log_in_submit_watch_and_cancel_in_a_browser(server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.is_file():
        pytest.fail(f"no chromium at {CHROMIUM}: run `make system-deps`")
    expect = sync_api.expect
    quota = {"max_concurrent_jobs": 1, "cpu_slots": 2, "gpu_slots": 0, "storage_bytes": 50 << 20}
    password, token = server.user("alice", "lab", "editor", admin_user=True, **quota)
    _, viewer_token = server.user("victor", "lab", "viewer")
    api = server.client(token)
    expected_422 = api.post("/api/jobs", files=[("spec", ("spec.yaml", INVALID.encode()))])
    assert expected_422.status_code == 422

    hosts, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        page = browser.new_page(base_url=server.url, viewport={"width": 1280, "height": 900})
        page.on("request", lambda request: hosts.append(urlparse(request.url).hostname))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))

        # Signed out, a page answers 401 with the login form in place.
        assert page.goto("/queue").status == 401
        expect(page.locator("#login-form")).to_be_visible()
        page.goto("/login")
        _shoot(page, tmp_path, "login")
        page.fill("#login-name", "alice")
        page.fill("#login-password", "wrong")
        page.click("#login-form button[type=submit]")
        expect(page.locator("#login-error")).to_have_text("wrong name or password")
        page.fill("#login-password", password)
        page.click("#login-form button[type=submit]")
        page.wait_for_url(f"{server.url}/")

        # An invalid spec: the API's one-line message, inline, and no job made.
        page.fill("#submit-spec", INVALID)
        page.click("#submit-button")
        expect(page.locator("#submit-error")).to_have_text(expected_422.json()["detail"])
        assert api.get("/api/jobs").json() == []

        # A long job, followed live: log lines, chart points, its start and where its steps
        # spend their time arrive while it runs (the page was rendered before it started).
        long_id = _submit(page, SPEC.replace("EPOCHS", "3000"))
        expect(page.locator("#job-state")).to_have_text("running", timeout=JOB_WAIT_MS)
        expect(page.locator("#log")).to_contain_text("epoch 3 ", timeout=JOB_WAIT_MS)
        expect(page.locator("#chart")).to_have_attribute("data-points", re.compile(r"^[3-9]|\d\d"))
        expect(page.locator("#job-started time")).to_have_count(1)
        expect(page.locator("#time-split")).to_contain_text("compute")
        _shoot(page, tmp_path, "job-running")

        # A second job waits (the tenant runs one job at a time) and its page says why.
        short_id = _submit(page, SPEC.replace("EPOCHS", "2"), NOTES)
        # The scheduler's next tick gives the reason; the page's poll shows it.
        waiting = _until(lambda: api.get(f"/api/jobs/{short_id}").json(), lambda j: j["reason"])
        assert waiting["state"] == "queued", waiting
        expect(page.locator("#job-message")).to_have_text(waiting["reason"])
        page.goto("/queue")
        expect(page.locator("section.tenant h2")).to_have_text("lab")
        expect(page.locator("table.waiting tbody tr")).to_have_count(1)
        expect(page.locator("table.waiting")).to_contain_text(short_id)
        expect(page.locator("meter")).to_have_count(6)  # the machine's 2, the tenant's 4 quotas
        _shoot(page, tmp_path, "queue")
        page.goto("/")
        expect(page.locator("#jobs-table tbody tr")).to_have_count(2)
        _shoot(page, tmp_path, "jobs")
        # On a phone the page fits the screen: the list keeps id, state and reason.
        page.set_viewport_size({"width": 375, "height": 740})
        for path in ("/", f"/jobs/{short_id}", "/queue", "/admin"):
            page.goto(path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 375, (path, width)
        page.goto("/")
        expect(page.locator("#jobs-table th").nth(1)).to_be_visible()
        _shoot(page, tmp_path, "jobs-phone")
        page.set_viewport_size({"width": 1280, "height": 900})
        # The operator's page: a tenant's weight changed, an account turned off, a password.
        page.goto("/admin")
        expect(page.locator("#users")).to_contain_text("victor")
        expect(page.locator("#audit")).to_contain_text("denied")  # the wrong password
        page.fill("form[data-tenant=lab] input[name=weight]", "2.5")
        page.click("form[data-tenant=lab] button[type=submit]")
        expect(page.locator("form[data-tenant=lab] input[name=weight]")).to_have_value("2.5")
        page.click("tr[data-user=victor] [data-action=disable]")
        expect(page.locator("tr[data-user=victor] .user-state")).to_have_text("disabled")
        assert server.client(viewer_token).get("/api/me").status_code == 401
        page.click("tr[data-user=victor] [data-action=enable]")
        expect(page.locator("tr[data-user=victor] .user-state")).to_have_text("active")
        page.click("tr[data-user=victor] [data-action=password]")
        expect(page.locator("#admin-notice .password")).to_have_text(re.compile(r"^\S{12,}$"))
        audit = api.get("/api/admin/audit").json()
        actions = [entry["action"] for entry in audit if entry["actor"] == "alice"]
        assert actions[:4] == ["reset password", "enable user", "disable user", "set tenant"]
        _shoot(page, tmp_path, "admin")

        page.goto(f"/jobs/{long_id}")
        page.click("#cancel-button")
        expect(page.locator("#job-state")).to_have_text("cancelled", timeout=JOB_WAIT_MS)
        expect(page.locator("#cancel-button")).to_be_hidden()
        expect(page.locator("#job-message")).to_contain_text("cancelled")

        # Then the waiting job runs; its page follows it to the end and reloads with results.
        page.goto(f"/jobs/{short_id}")
        expect(page.locator("#job-state")).to_have_text("succeeded", timeout=JOB_WAIT_MS)
        expect(page.locator("#log")).to_contain_text("finished: val accuracy")
        expect(page.locator("#chart")).to_have_attribute("data-points", "2")
        expect(page.locator("#time-split")).to_contain_text("compute")
        expect(page.locator("#reproduction")).to_contain_text(
            api.get(f"/api/jobs/{short_id}").json()["reproduction"]["spec_sha256"]
        )
        uploaded = page.locator("#reproduction dt", has_text="inputs/notes.txt")
        expect(uploaded.locator("xpath=following-sibling::dd[1]")).to_have_text(
            hashlib.sha256(NOTES[0]["buffer"]).hexdigest()
        )
        artifacts = api.get(f"/api/jobs/{short_id}/artifacts").json()
        assert artifacts
        expect(page.locator("#artifacts a")).to_have_count(len(artifacts))
        _shoot(page, tmp_path, "job-finished")
        page.click("#rerun-button")  # lands on the new job's page
        page.wait_for_url(lambda url: JOB_PAGE.search(url) and not url.endswith(short_id))
        rerun = api.get(f"/api/jobs/{page.url.rsplit('/', 1)[1]}").json()
        assert rerun["rerun_of"] == short_id
        api.post(f"/api/jobs/{rerun['id']}/cancel")  # its training proves nothing more here
        # Deleting the finished job (after a confirmation) lands on the list, without it.
        page.goto(f"/jobs/{short_id}")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#delete-button")
        page.wait_for_url(f"{server.url}/")
        assert api.get(f"/api/jobs/{short_id}").status_code == 404
        expect(page.locator("#jobs-table")).not_to_contain_text(short_id)
        browser.close()

    assert set(hosts) == {"127.0.0.1"}, hosts
    # The browser's only errors are its notes of the refusals the test asked for: the signed-out
    # page, the wrong password, the invalid spec. No script error, no other failed request.
    note = "Failed to load resource: the server responded with a status of {}"
    expected = [note.format("401 (Unauthorized)")] * 2 + [note.format("422 (Unprocessable Entity)")]
    assert errors == expected
    # A viewer sees the job page without the Cancel and Rerun buttons.
    viewer_page = server.client(viewer_token).get(f"/jobs/{long_id}")
    assert viewer_page.status_code == 200
    assert "cancel-button" not in viewer_page.text
    assert "rerun-button" not in viewer_page.text and "delete-button" not in viewer_page.text
    assert 'id="rerun-button"' in api.get(f"/jobs/{long_id}").text
