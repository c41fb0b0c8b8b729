"""Bad input refused in one line before it costs anything (issue 17, points 9, 10, 11, 13): user
factories that raise or exit, logits of the wrong shape, seeds out of range, duplicate YAML
keys, sweeps too large or with more folds than samples."""

import importlib
import sys
import textwrap

import pytest
import torch
from torch import nn

from dlscale.data import build_data
from dlscale.errors import UserError
from dlscale.jobspec import load_raw, load_spec, parse_spec
from dlscale.jobspec.base import MAX_SEED
from dlscale.jobspec.job import Spec
from dlscale.models import build_model
from dlscale.sweep.space import check_space
from dlscale.train.plan import check_model_fits_data

BAD_FACTORIES = """
import sys
import torch

def raises(num_classes=10):
    raise RuntimeError("my factory broke")

def raises_key(num_classes=10):
    raise KeyError("width")

def exits(num_classes=10):
    sys.exit(3)

def exits_quietly(num_classes=10):
    sys.exit()

class Scalar(torch.nn.Module):
    def __init__(self, input_size):
        super().__init__()
        self.linear = torch.nn.Linear(input_size, 1)

    def forward(self, x):
        return self.linear(x.flatten(1)).sum()  # () instead of (B, classes)

def scalar(input_size):
    return Scalar(input_size)

class Lookup(torch.nn.Module):
    def forward(self, x):
        return {}["logits"]

def lookup():
    return Lookup()

class ReadsValues(torch.nn.Module):
    def __init__(self, input_size):
        super().__init__()
        self.linear = torch.nn.Linear(input_size, 10)

    def forward(self, x):
        scale = float(x.abs().max().item()) or 1.0  # needs real values: no meta tensors
        return self.linear(x.flatten(1) / scale)

def reads_values(input_size):
    return ReadsValues(input_size)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Module "badnets" (factories that fail) and "exits_on_import", in a fresh directory."""
    (tmp_path / "badnets.py").write_text(textwrap.dedent(BAD_FACTORIES))
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(4)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # undo build_model's insert afterwards
    importlib.invalidate_caches()
    yield "badnets"
    for name in ("badnets", "exits_on_import"):
        sys.modules.pop(name, None)


def refused(call, *args) -> str:
    with pytest.raises(UserError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------ 9: user factories


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (
            "raises",
            "model 'badnets:raises' could not be built by its factory: RuntimeError: "
            "my factory broke (badnets.py, line 6)",
        ),
        ("raises_key", "by its factory: KeyError: 'width' (badnets.py, line 9)"),
        ("exits", "model 'badnets:exits' could not be built by its factory: it called sys.exit(3)"),
        ("exits_quietly", "by its factory: it called sys.exit(None)"),
    ],
)
def test_a_factory_that_raises_or_exits_is_one_line(user_module, factory, expected):
    assert expected in refused(build_model, f"{user_module}:{factory}")


def test_a_module_that_exits_on_import_is_one_line(user_module):
    message = refused(build_model, "exits_on_import:build")
    assert message == "importing module 'exits_on_import' failed: it called sys.exit(4)"


def test_logits_of_the_wrong_shape_are_named_with_the_shape_expected(user_module):
    data = build_data(parse_spec({**SPEC}).data, 0)  # digits: 64 features, 10 classes
    model = build_model(f"{user_module}:scalar", {}, data.model_defaults())
    message = refused(check_model_fits_data, model, data, "badnets:scalar")
    assert message == (
        "model 'badnets:scalar' returned logits of shape () for 1 sample; expected (1, 10): "
        "(batch, classes)"
    )


def test_a_forward_that_raises_is_one_line_naming_its_line(user_module):
    data = build_data(parse_spec({**SPEC}).data, 0)
    model = build_model(f"{user_module}:lookup")
    message = refused(check_model_fits_data, model, data, "badnets:lookup")
    assert (
        message
        == "model 'badnets:lookup' failed on one sample: KeyError: 'logits' (badnets.py, line 30)"
    )


def test_profile_names_a_user_model_that_fails(user_module):
    from dlscale.api.profiling import ProfileRequest, profile

    message = refused(profile, ProfileRequest(f"{user_module}:scalar", input_shape=(64,)))
    assert message.endswith(
        "cannot take samples of shape (64,): it returned (), not logits (batch, ..., classes)"
    )
    message = refused(profile, ProfileRequest(f"{user_module}:lookup", input_shape=(64,)))
    assert message.endswith(
        "failed on the meta device in '(model)' (Lookup): KeyError: 'logits' (badnets.py, line 30)"
    )
    message = refused(profile, ProfileRequest(f"{user_module}:raises", input_shape=(64,)))
    assert "by its factory: RuntimeError: my factory broke (badnets.py, line 6)" in message


def test_validate_leaves_a_model_that_needs_real_values_to_train(user_module):
    """The meta device has no values: a forward that reads one cannot be tried there, and
    that is no fault of the spec (train runs it on real tensors)."""
    from dlscale.train.preflight import preflight

    spec = parse_spec({**SPEC, "model": {"name": f"{user_module}:reads_values"}})
    assert preflight(spec).num_train == 1437
    scalar = parse_spec({**SPEC, "model": {"name": f"{user_module}:scalar"}})
    assert "returned logits of shape ()" in refused(preflight, scalar)


def test_logits_are_checked_against_token_labels():
    tokens = {
        "name": "synthetic",
        "kind": "tokens",
        "seq_len": 8,
        "vocab_size": 16,
        "task": "language_modeling",
    }
    spec = parse_spec({**SPEC, "data": tokens})
    data = build_data(spec.data, 0)
    per_sequence = nn.Sequential(nn.Embedding(16, 16), nn.Flatten(), nn.Linear(8 * 16, 16))
    message = refused(check_model_fits_data, per_sequence, data, "m")
    assert "returned logits of shape (1, 16) for 1 sample; expected (1, 8, 16)" in message
    check_model_fits_data(nn.Embedding(16, 16), data, "m")  # (1, 8, 16): fits


# ------------------------------------------------------------------ 10: seeds

SPEC = {"name": "t", "model": {"name": "mlp"}, "data": {"name": "digits"}, "batch_size": 32}


@pytest.mark.parametrize("seed", [2**63 + 1, 2**32, -1])
@pytest.mark.parametrize("where", ["seed", "data.seed"])
def test_a_seed_outside_what_numpy_and_torch_take_is_refused(seed, where):
    raw = (
        {**SPEC, "seed": seed}
        if where == "seed"
        else {**SPEC, "data": {"name": "digits", "seed": seed}}
    )
    message = refused(parse_spec, raw)
    assert message.startswith(f"spec: {where}: ") and "4294967295" in message


def test_the_largest_seed_trains_its_data_and_generators():
    spec = parse_spec({**SPEC, "seed": MAX_SEED})
    data = build_data(spec.data, spec.seed)  # scikit-learn's split takes at most 2**32 - 1
    assert data.num_train > 0
    # The loop seeds torch with seed + 1 + rank + 1_000_003 * step, and the sampler with
    # seed * 1_000_003 + epoch: far inside torch's 64 bits at the largest seed.
    torch.manual_seed(MAX_SEED * 1_000_003 + 10**6)


def test_ensemble_members_keep_their_seeds_in_range():
    raw = {**SPEC, "seed": MAX_SEED - 1, "sweep": {"ensemble": 3}}
    spec = parse_spec(raw)
    message = refused(check_space, spec, raw, None, "s.yaml")
    assert "sweep trial" in message and "member-2" in message and "seed" in message


# ------------------------------------------------------------------ 13: duplicate YAML keys


def test_duplicate_yaml_keys_are_refused_with_their_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 32\n"
        "optimizer:\n  name: sgd\n  lr: 0.1\n  lr: 0.5\n"
    )
    message = refused(load_spec, path)
    assert message == f"{path}: invalid YAML at line 8: duplicate key 'lr' (first at line 7)"


def test_yaml_merge_keys_still_override(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "base: &base {name: sgd, lr: 0.1}\noptimizer:\n  <<: *base\n  lr: 0.5\n"
    )  # an override of a merged key is YAML's own idiom, not a duplicate
    assert load_raw(path)["optimizer"] == {"name": "sgd", "lr": 0.5}


def test_duplicate_keys_in_a_sweep_section_are_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 32\n"
        "sweep:\n  grid:\n    optimizer.lr: [0.1]\n    optimizer.lr: [0.2]\n"
    )
    assert "duplicate key 'optimizer.lr'" in refused(load_raw, path)


# ------------------------------------------------------------------ 11: sweep sizes


def test_more_folds_than_samples_are_refused_up_front():
    raw = {**SPEC, "sweep": {"kfold": 5000}}
    message = refused(check_space, parse_spec(raw), raw, None, "s.yaml")
    assert message == (
        "s.yaml: sweep.kfold: 5000 folds need at least 10000 training samples (2 to score each "
        "fold on); the data has 1437: use at most 718 folds"
    )


def test_a_sweep_of_millions_of_runs_is_refused():
    grid = {"optimizer.lr": list(range(1, 1001)), "batch_size": list(range(1, 1001))}
    message = refused(parse_spec, {**SPEC, "sweep": {"grid": grid, "kfold": 3}})
    assert "1000000 trials × 3 folds = 3000000 runs" in message and "at most 10000" in message
    message = refused(parse_spec, {**SPEC, "sweep": {"kfold": 100_000}})
    assert "100000 runs" in message
    sampled = {"trials": 20_000, "space": {"optimizer.lr": {"uniform": [0.01, 0.1]}}}
    assert "20000 trials" in refused(parse_spec, {**SPEC, "sweep": {"random": sampled}})


def test_a_sweep_at_the_cap_is_accepted():
    assert Spec.model_validate({**SPEC, "sweep": {"ensemble": 10_000}}).sweep.ensemble == 10_000


def test_a_sweep_without_a_completed_trial_is_summarized_in_one_line():
    from dlscale.sweep.results import failure_summary

    def trial(number: int, status: str, error: str | None = None) -> dict:
        return {"id": f"t{number:03d}", "status": status, "error": error}

    too_big = "train: batch_size 4000 is larger than the training set (1437 samples)"
    trials = [
        trial(0, "failed", too_big),
        trial(1, "failed", "train: out of memory"),
        trial(2, "failed", too_big),
        trial(3, "pruned"),
    ]
    assert failure_summary({"trials": trials}) == (
        "no trial completed: 3 of 4 trials failed, 1 stopped early; t000: "
        + too_big
        + "; 1 more failed the same way; 1 failed otherwise (every error is in results.csv)"
    )
    assert failure_summary({"trials": [*trials, trial(4, "completed")]}) is None
    assert failure_summary({"trials": []}) is None


# ------------------------------------------------- issue 34, 9: generated data beyond memory


@pytest.mark.parametrize(
    "data",
    [
        {"name": "synthetic", "shape": [100_000, 100_000, 100_000], "num_samples": 10},
        {"name": "synthetic", "kind": "tokens", "seq_len": 10**8, "num_samples": 10**8},
    ],
)
def test_synthetic_data_beyond_memory_is_one_line_before_allocating(data):
    spec = parse_spec({**SPEC, "data": data})
    message = refused(build_data, spec.data, spec.seed)
    assert "of memory to generate; this machine has" in message and "PiB" in message
