"""A hostile tenant against a real `dlscale serve`: every reproduction of the attack that once
owned the server is a test, and a job running the tenant's own code tries every escape from its
sandbox while it trains. Each attempt fails and is recorded (by the job, and by the server from
its cgroup), the job itself succeeds, and the server, its files and the other tenant are
untouched. Upload bombs leave the server's peak memory flat.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import children
from tests.service.live import LiveServer, wait_for_state
from tests.service.specs import TINY

ENDED = ("succeeded", "failed", "cancelled")
MEMORY_PER_SLOT = 1 << 30  # small, so that allocating past it is quick

# The tenant's own module: a real model whose factory first tries every way out of the
# sandbox, writing what happened to run/attacks.json (the validation job runs it too, read-only:
# there it records nothing). Every attempt must fail for the test to pass.
ATTACK = r"""
import json, os, signal, socket, subprocess, sys, time
from torch import nn


def attempt(report, name, action):
    try:
        detail = action()
    except BaseException as exc:  # refused: what refused it
        report.append({"attempt": name, "refused": True, "detail": f"{type(exc).__name__}: {exc}"})
    else:
        report.append({"attempt": name, "refused": False, "detail": str(detail)[:200]})


def read(path):
    with open(path, "rb") as handle:
        return handle.read(100)


def write(path):
    with open(path, "a") as handle:
        handle.write("mallory was here\n")
    return "written"


def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"


def fork_without_limit():
    children = []
    try:
        while len(children) < 5000:
            children.append(subprocess.Popen(["sleep", "60"]))
        return f"{len(children)} processes started"
    finally:
        for child in children:
            child.kill()
            child.wait()


def allocate_past_memory():
    eat = subprocess.run([sys.executable, "-c", "x = 'x' * (3 << 30)"], capture_output=True)
    if eat.returncode == -signal.SIGKILL:
        raise MemoryError("the kernel killed the process at the job's memory limit")
    return f"exit {eat.returncode}"


def children_cpu_s():
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def more_cores_than_its_slot():
    before = children_cpu_s()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    started = time.monotonic()
    time.sleep(2.0)
    for child in busy:
        child.kill()
        child.wait()
    wall = time.monotonic() - started
    used = children_cpu_s() - before
    if used > 1.3 * wall:
        return f"{used:.1f} s of CPU in {wall:.1f} s"
    raise PermissionError(f"held to one core: {used:.1f} s of CPU in {wall:.1f} s")


def found(items):  # what looking around saw: an escape if anything, refused if nothing
    if not items:
        raise PermissionError("nothing in sight")
    return items


def build(num_classes=10):
    # What it aims at, uploaded beside it: a spec naming a server path is refused at submit.
    with open("inputs/facts.json") as handle:
        facts = json.load(handle)
    data_dir, port, server_pid, victim = (
        facts[k] for k in ("data_dir", "port", "server_pid", "victim"))
    if not os.access(".", os.W_OK) or os.path.exists("run/attacks.json"):
        return model(num_classes)  # the validation job (read-only), or a second build
    report = []
    attempt(report, "read /etc/shadow", lambda: read("/etc/shadow"))
    attempt(report, "read the database", lambda: read(f"{data_dir}/service.db"))
    attempt(report, "read the server's secret", lambda: read(f"{data_dir}/secret"))
    attempt(report, "read another tenant's upload", lambda: read(victim))
    own = os.path.basename(os.getcwd())
    attempt(report, "see another job's folder", lambda: found(
        [job for job in os.listdir(f"{data_dir}/jobs") if job != own]))
    attempt(report, "write /etc/passwd", lambda: write("/etc/passwd"))
    attempt(report, "write into the server's data", lambda: write(f"{data_dir}/pwned"))
    attempt(report, "write the Python it runs", lambda: write(f"{os.__file__}"))
    attempt(report, "reach the server's port", lambda: connect(port))
    attempt(report, "signal the server", lambda: os.kill(server_pid, signal.SIGTERM))
    attempt(report, "become root", lambda: os.setuid(0))
    attempt(report, "see the server's processes", lambda: found(
        [p for p in os.listdir("/proc") if p.isdigit() and int(p) > 50]))
    attempt(report, "find a secret in its environment", lambda: found(
        [k for k in os.environ if "TOKEN" in k or "SECRET" in k or "PASSWORD" in k]))
    attempt(report, "fork without limit", fork_without_limit)
    attempt(report, "allocate past its memory", allocate_past_memory)
    attempt(report, "use more cores than its one slot", more_cores_than_its_slot)
    os.makedirs("run", exist_ok=True)
    os.symlink("/etc/passwd", "run/passwd")  # its own folder: planted, never served
    attempt(report, "plant a hard link to the server's database",
            lambda: os.link(f"{data_dir}/service.db", "run/db") or "planted")
    for name in ("mine.txt", "twice.txt"):
        with open(f"run/{name}", "w") as handle:
            handle.write("my own file\n")
    os.link("run/twice.txt", "run/twice-linked.txt")  # its own file, linked twice: not served
    facts = {"uid": os.getuid(), "euid": os.geteuid(), "pid": os.getpid(),
             "hostname": socket.gethostname()}
    with open("run/attacks.json", "w") as handle:
        json.dump({"attempts": report, "facts": facts}, handle)
    return model(num_classes)


def model(num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = LiveServer(
        tmp_path_factory.mktemp("hostile") / "data",
        2,
        None,
        "--memory-per-slot",
        str(MEMORY_PER_SLOT),
    ).start()
    yield live
    live.stop()


def submit(client, spec: str, files: dict[str, bytes] | None = None, **fields):
    parts = [("spec", ("spec.yaml", spec.encode()))]
    parts += [("files", (name, data)) for name, data in (files or {}).items()]
    return client.post("/api/jobs", files=parts, data=fields)


def everything_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def peak_rss_bytes(pid: int) -> int:
    """The server's high-water mark of resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_the_binary_tag_that_ran_os_system_in_the_server_leaves_no_file_and_no_process(
    server, tmp_path
):
    _, token = server.user("eve", "evil")
    client = server.client(token)
    jobs_before = everything_under(server.data_dir / "jobs")
    children_before = set(children(server.process.pid))
    cwd = Path.cwd()
    attacks = {
        "name: x\nmodel: {name: !!binary b3M6c3lzdGVt, kwargs: {command: 'id > pwned'}}\n"
        "data: {name: digits}\nbatch_size: 8\n": "tag !!binary is not allowed",
        "name: x\nmodel: {name: 'os:system', kwargs: {command: 'id > pwned'}}\n"
        "data: {name: digits}\nbatch_size: 8\n": "names code outside the job",
        "name: x\nmodel: {name: 'runpy:run_path', kwargs: {path_name: inputs/evil.py}}\n"
        "data: {name: digits}\nbatch_size: 8\n": "names code outside the job",
    }
    evil = {"evil.py": b"import os\nos.system('id > pwned')\n"}
    for spec, expected in attacks.items():
        answer = submit(client, spec, evil)
        assert answer.status_code == 422, answer.text
        assert expected in answer.json()["detail"]
    assert not (cwd / "pwned").exists() and not (server.data_dir / "pwned").exists()
    assert not list(server.data_dir.rglob("pwned"))
    assert everything_under(server.data_dir / "jobs") == jobs_before  # nothing left behind
    assert set(children(server.process.pid)) <= children_before | _validators(server)


def _validators(server) -> set[int]:
    """The server's waiting validators (new ones replace those used)."""
    found = set()
    for child in children(server.process.pid):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"dlscale.service.validate" in cmdline:
            found.add(child)
    return found


@pytest.mark.slow
def test_a_tenants_own_code_trains_while_every_escape_fails(server):
    _, alice_token = server.user("alice", "lab")
    alice = server.client(alice_token)
    x = np.zeros((40, 8, 8), dtype=np.float32)
    private = io.BytesIO()
    np.savez(private, x=x, y=np.arange(40) % 10)
    theirs = submit(alice, TINY, {"private.npz": private.getvalue(), "private.png": PNG})
    assert theirs.status_code == 201, theirs.text
    alice_job = theirs.json()["id"]
    wait_for_state(alice, alice_job, ENDED)
    victim = server.data_dir / "jobs" / alice_job / "inputs" / "private.npz"
    assert victim.is_file()
    before = {path: path.read_bytes() for path in (Path("/etc/passwd"), victim)}

    _, token = server.user("mallory", "evil-lab")
    mallory = server.client(token)
    facts = {
        "data_dir": str(server.data_dir),
        "port": server.port,
        "server_pid": server.process.pid,
        "victim": str(victim),
    }
    spec = TINY.replace("{name: mlp, kwargs: {hidden: [16]}}", "{name: 'inputs.attack:build'}")
    uploads = {"attack.py": ATTACK.encode(), "facts.json": json.dumps(facts).encode()}
    answer = submit(mallory, spec, uploads)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    job = wait_for_state(mallory, job_id, ENDED, 300)
    assert job["state"] == "succeeded", job  # the job itself trains
    artifacts = {a["name"]: a for a in mallory.get(f"/api/jobs/{job_id}/artifacts").json()}
    report_id = artifacts["run/attacks.json"]["id"]
    report = mallory.get(f"/api/jobs/{job_id}/artifacts/{report_id}").json()
    attempts = {a["attempt"]: a for a in report["attempts"]}
    assert len(attempts) == 17
    for name, outcome in attempts.items():
        assert outcome["refused"], (name, outcome)
    # Who it ran as: an unprivileged uid of its own, in a PID namespace of its own.
    assert report["facts"]["uid"] == report["facts"]["euid"] >= 1_000_000
    assert report["facts"]["hostname"] == "dlscale-job"
    # The server recorded what the kernel refused: the fork bomb's tasks, the allocation.
    sandbox = job["result"]["sandbox"]
    assert sandbox["tasks_refused"] >= 1 and sandbox["oom_kills"] >= 1, sandbox
    # Its spinners were held back at its CPU quota, unless the machine gave them less than the
    # quota (a busy machine: once in a fresh-clone suite, 0 s throttled); then the quota had
    # nothing to hold, and the attack measured under a core a second.
    held = attempts["use more cores than its one slot"]["detail"]
    used, wall = map(float, re.fullmatch(r".*: ([\d.]+) s of CPU in ([\d.]+) s", held).groups())
    assert sandbox["cpu_throttled_s"] > 0 or used < 0.95 * wall, (sandbox, held)
    # Links it planted are not served; its own regular file is.
    assert "run/mine.txt" in artifacts
    assert not {"run/passwd", "run/db", "run/twice.txt", "run/twice-linked.txt"} & set(artifacts)
    # Nothing outside its folder changed; the other tenant's job and the server are intact.
    for path, data in before.items():
        assert path.read_bytes() == data
    assert not (server.data_dir / "pwned").exists()
    assert alice.get(f"/api/jobs/{alice_job}").json()["state"] == "succeeded"
    assert server.client(None).get("/api/health").status_code == 200
    # Its files are its own uid's, never root's; the server's stay private to the server.
    folder = server.data_dir / "jobs" / job_id
    assert folder.stat().st_uid == report["facts"]["uid"]
    for path in (server.data_dir, server.data_dir / "jobs", folder):
        assert path.stat().st_mode & 0o077 == 0, path
    for name in ("service.db", "secret"):
        assert (server.data_dir / name).stat().st_mode & 0o077 == 0, name


ZEROS = bytes(16 << 20)


def _png() -> bytes:
    from PIL import Image

    packed = io.BytesIO()
    Image.new("L", (8, 8), 128).save(packed, format="PNG")
    return packed.getvalue()


PNG = _png()


def _idx_bomb(count: int) -> bytes:
    """A gzipped IDX image file of `count` 28×28 images, all zeros (1,000 times its size)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as packed:
        packed.write(struct.pack(">IIII", 0x803, count, 28, 28))
        _zeros(packed, count * 28 * 28)
    return raw.getvalue()


def _zeros(sink, size: int) -> None:
    for start in range(0, size, len(ZEROS)):
        sink.write(ZEROS[: min(len(ZEROS), size - start)])


def _labels(count: int) -> bytes:
    return gzip.compress(struct.pack(">II", 0x801, count) + bytes(count))


def _npz_bomb(rows: int, cols: int) -> bytes:
    """An .npz whose x is rows × cols float32 zeros, written in pieces (never whole here)."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(
                member, {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)}
            )
            _zeros(member, rows * cols * 4)
        y = io.BytesIO()
        np.save(y, np.zeros(rows, dtype=np.int64))
        archive.writestr("y.npy", y.getvalue())
    return packed.getvalue()


@pytest.mark.slow
def test_upload_bombs_are_refused_and_the_servers_memory_stays_flat(server):
    _, token = server.user("bomber", "bombs", cpu_slots=1)
    client = server.client(token)
    idx = _idx_bomb(330_000)  # 259 MB unpacked, 1 GiB as the float32 images it becomes
    npz = _npz_bomb(60_000, 4000)  # 916 MiB unpacked
    assert len(idx) < 260 << 10 and len(npz) < 1 << 20, (len(idx), len(npz))
    data = {
        "idx": (
            "{name: idx, images: inputs/i.gz, labels: inputs/l.gz}",
            {"i.gz": idx, "l.gz": _labels(330_000)},
        ),
        "npz": ("{name: npz, path: inputs/x.npz}", {"x.npz": npz}),
        "synthetic": ("{name: synthetic, num_samples: 20000, shape: [3, 64, 64]}", {}),
        "huge count": ("{name: synthetic, num_samples: 1000000000000}", {}),
    }
    base = peak_rss_bytes(server.process.pid)
    for name, (section, files) in data.items():
        spec = TINY.replace("{name: digits}", section)
        answer = submit(client, spec, files)
        assert answer.status_code == 422, (name, answer.text)
        detail = answer.json()["detail"]
        assert "memory" in detail and "\n" not in detail, (name, detail)
    grown = peak_rss_bytes(server.process.pid) - base
    assert grown < 100 << 20, f"the server grew by {grown / 2**20:.0f} MiB"
    assert server.client(None).get("/api/health").status_code == 200


def _hf_archive(tmp_path: Path, image_path: str) -> bytes:
    """A saved Hugging Face data set whose images are cells naming files by absolute path."""
    import datasets
    from datasets.arrow_writer import ArrowWriter

    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=2)}
    )
    embedded = {"image": [{"path": None, "bytes": PNG}] * 8, "label": [0, 1] * 4}
    datasets.Dataset.from_dict(embedded, features=features).save_to_disk(str(tmp_path / "ds"))
    # save_to_disk embeds the bytes of files it can read: the attacker's tool writes the path.
    (arrow,) = (tmp_path / "ds").glob("*.arrow")
    rows = {"image": [{"path": image_path, "bytes": None}] * 8, "label": [0, 1] * 4}
    with ArrowWriter(features=features, path=str(arrow), embed_local_files=False) as writer:
        writer.write_batch(rows)
        writer.finalize()
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for path in sorted((tmp_path / "ds").rglob("*")):
            if path.is_file():
                archive.write(path, f"ds/{path.relative_to(tmp_path / 'ds')}")
    return packed.getvalue()


@pytest.mark.slow
def test_a_data_set_naming_files_outside_its_job_reads_nothing(server, tmp_path):
    _, alice_token = server.user("ana", "lab-ana")
    ana = server.client(alice_token)
    theirs = submit(ana, TINY, {"secret.png": PNG})
    assert theirs.status_code == 201, theirs.text
    victim = server.data_dir / "jobs" / theirs.json()["id"] / "inputs" / "secret.png"
    assert victim.is_file()
    _, token = server.user("ivan", "lab-ivan")
    ivan = server.client(token)
    spec = TINY.replace("{name: digits}", "{name: hf, path: inputs/ds, image_column: image}")
    # Image cells naming another tenant's file by its absolute path.
    archive = _hf_archive(tmp_path, str(victim))
    parts = [("spec", ("spec.yaml", spec.encode())), ("archive", ("ds.zip", archive))]
    answer = ivan.post("/api/jobs", files=parts)
    assert answer.status_code == 422, answer.text
    assert "secret.png" in answer.json()["detail"]
    # state.json naming an Arrow file anywhere on the server.
    packed = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(packed, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("state.json"):
                state = json.loads(data)
                state["_data_files"] = [{"filename": str(server.data_dir / "service.db")}]
                data = json.dumps(state).encode()
            target.writestr(item, data)
    parts = [("spec", ("spec.yaml", spec.encode())), ("archive", ("ds.zip", packed.getvalue()))]
    answer = ivan.post("/api/jobs", files=parts)
    assert answer.status_code == 422, answer.text
    # In the sandbox the server's database does not exist (outside, it would be read as Arrow).
    assert "not a Hugging Face data set" in answer.json()["detail"]


@pytest.mark.slow
def test_a_job_at_its_tenants_storage_quota_is_stopped_and_deleting_it_frees_the_space(server):
    quota = 5 << 20
    _, token = server.user("hoarder", "hoard", storage_bytes=quota)
    client = server.client(token)
    # A checkpoint (about 0.5 MB) at every one of 1,100 steps, all kept: 500 MB unchecked.
    spec = TINY.replace("hidden: [16]", "hidden: [512]").replace("epochs: 1", "epochs: 50")
    spec += "checkpoint: {every_steps: 1, keep_last: 1000}\n"
    answer = submit(client, spec)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    job = wait_for_state(client, job_id, ENDED, 300)
    assert job["state"] == "failed", job
    assert "storage quota" in job["message"] and "what the job saved is kept" in job["message"]
    folder = server.data_dir / "jobs" / job_id
    assert "storage quota" in (folder / "log.txt").read_text()
    assert list((folder / "run").rglob("step-*.pt")), "what it saved is kept"
    used = client.get("/api/queue").json()["tenants"][0]["storage_used"]
    assert quota <= used < quota + (100 << 20), used  # stopped within a check of the quota
    refused = submit(client, TINY)
    assert refused.status_code == 409 and "storage quota" in refused.json()["detail"]
    # Deleting the job frees its storage: the tenant can submit again.
    deleted = client.delete(f"/api/jobs/{job_id}")
    assert deleted.status_code == 200 and deleted.json()["deleted"], deleted.text
    assert not folder.exists()
    assert client.get(f"/api/jobs/{job_id}").status_code == 404
    assert client.get("/api/queue").json()["tenants"][0]["storage_used"] == 0
    assert submit(client, TINY).status_code == 201
