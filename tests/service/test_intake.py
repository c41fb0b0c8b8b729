"""A client's spec, read safely (size, depth, alias bombs, paths, code references), seeded, and
sized in slots; and the failed-authentication limiter's window."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from dlscale.errors import UserError
from dlscale.jobspec import load_spec
from dlscale.service import intake
from dlscale.service.limits import FailureLimiter

BASE = "name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 8\n"


def test_a_spec_without_a_seed_gets_one_drawn_and_appended_keeping_its_bytes():
    submitted = intake.with_seed(BASE.encode())
    assert submitted.seed_drawn and submitted.original == BASE
    assert submitted.text.startswith(BASE)
    assert yaml.safe_load(submitted.text)["seed"] == submitted.seed
    seeded = intake.with_seed((BASE + "seed: 9\n").encode())
    assert not seeded.seed_drawn and seeded.seed == 9 and seeded.text == BASE + "seed: 9\n"
    flow = intake.with_seed(b"{name: t, model: {name: mlp}, data: {name: digits}}")
    assert yaml.safe_load(flow.text)["seed"] == flow.seed


def test_two_drawn_seeds_differ():
    assert len({intake.with_seed(BASE.encode()).seed for _ in range(5)}) > 1


def test_an_alias_bomb_is_refused_without_expanding_it():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):  # 10**12 nodes if expanded
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i > 1 else "*a"] * 10) + "]")
    with pytest.raises(UserError, match="YAML nodes"):
        intake.parse("\n".join(lines))


def test_merge_keys_and_a_few_aliases_are_fine():
    raw = intake.parse(BASE + "base: &b {lr: 0.1}\noptimizer: {<<: *b, name: sgd}\n")
    assert raw["optimizer"] == {"lr": 0.1, "name": "sgd"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/etc/passwd", "not a path inside"),
        ("~/data.npz", "not a path inside"),
        ("inputs/../../x", "leaves the job"),
        ("file:///etc/passwd", "not a path inside"),
        ("os:system", "names code outside the job"),
        ("my.models:build", "names code outside the job"),
        ("inputs:build", "names code outside the job"),
    ],
)
def test_paths_and_code_references_are_refused(value, message):
    with pytest.raises(UserError, match=message):
        intake.parse(BASE + f"extra: {{where: '{value}'}}\n")


def test_ordinary_values_pass():
    intake.parse(BASE + "device: 'cuda:0'\nnote: 'lr 0.1: fast'\nfile: inputs/a.npz\n")


def test_the_tenants_own_modules_may_be_named():
    raw = intake.parse(BASE.replace("{name: mlp}", "{name: 'inputs.mynet:build'}"))
    assert raw["model"]["name"] == "inputs.mynet:build"
    intake.parse(BASE + "model_inputs: inputs.pkg.shapes:make\n")


def test_an_unquoted_date_is_text_and_only_plain_data_is_built():
    raw = intake.parse(BASE + "note: 2024-01-01\n")
    assert raw["note"] == "2024-01-01"
    for tagged in ("!!binary aGk=", "!!timestamp 2024-01-01", "!!omap [a: 1]", "!custom x"):
        with pytest.raises(UserError, match="is not allowed"):
            intake.parse(BASE + f"note: {tagged}\n")
    with pytest.raises(UserError, match="is not a spec value"):
        intake.check_untrusted({"note": b"os:system"})  # bytes are never turned into text


def test_a_swept_staging_path_is_refused_too():
    for sweep in (
        "sweep: {grid: {data.stage: [inputs/a, inputs/b]}}\n",
        "sweep: {random: {trials: 2, space: {data.stage: {choice: [x, y]}}}}\n",
    ):
        with pytest.raises(UserError, match="staging"):
            intake.parse(BASE + sweep)


def test_staging_is_refused():
    with pytest.raises(UserError, match="staging"):
        intake.parse(BASE.replace("{name: digits}", "{name: digits, stage: inputs}"))


def test_size_and_encoding():
    with pytest.raises(UserError, match="bytes"):
        intake.decode(b"x" * (intake.MAX_SPEC_BYTES + 1))
    with pytest.raises(UserError, match=r"not UTF-8.*byte 2"):
        intake.decode(b"ab\xffcd")


def test_resolved_paths_must_stay_in_the_job_folder(tmp_path):
    job = tmp_path / "job"
    (job / "inputs").mkdir(parents=True)
    outside = tmp_path / "other.npz"
    outside.write_bytes(b"x")
    (job / "inputs" / "link.npz").symlink_to(outside)
    spec = Path(job / "spec.yaml")
    spec.write_text(BASE)
    intake.check_inside(load_spec(spec), job)  # digits: no paths at all

    class Holder:
        model_fields: ClassVar[dict] = {"path": None}

        def __init__(self, path):
            self.path = path

    intake.check_inside(Holder(job / "inputs" / "a.npz"), job)
    with pytest.raises(UserError, match="outside the job"):
        intake.check_inside(Holder(job / "inputs" / "link.npz"), job)


def test_slots_count_processes_trials_and_gpus(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "device: cpu\nstrategy: {name: ddp, workers: 3}\n")
    spec = load_spec(path)
    assert intake.slots(spec, "train", None, 0) == (3, 0)
    assert intake.slots(spec, "sweep", 2, 0) == (6, 0)
    assert intake.slots(spec, "profile", None, 0) == (1, 0)
    path.write_text(BASE + "device: cuda\nstrategy: {name: ddp, workers: 2}\n")
    assert intake.slots(load_spec(path), "train", None, 0) == (2, 2)


def test_failed_attempts_are_limited_within_a_window():
    now = [0.0]
    limiter = FailureLimiter(limit=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.retry_after_s("1.2.3.4") is None
        limiter.fail("1.2.3.4")
    assert limiter.retry_after_s("1.2.3.4") == 61
    assert limiter.retry_after_s("5.6.7.8") is None  # per address
    now[0] = 30.0
    assert limiter.retry_after_s("1.2.3.4") == 31
    now[0] = 60.5
    assert limiter.retry_after_s("1.2.3.4") is None
