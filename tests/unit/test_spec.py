"""Spec validation: good specs resolve with defaults, bad ones give one line naming the field."""

from pathlib import Path

import pytest

from dlscale.errors import UserError
from dlscale.jobspec import load_spec, parse_spec
from tests.conftest import EXAMPLES
from tests.small_runs import base_spec

BASE = base_spec("t", {"name": "digits"}, batch_size=32)


def spec_with(**changes):
    raw = {**BASE, **changes}
    return parse_spec({k: v for k, v in raw.items() if v is not None})


def error_of(**changes) -> str:
    with pytest.raises(UserError) as caught:
        spec_with(**changes)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults_fill_a_minimal_spec():
    spec = spec_with()
    assert spec.epochs == 1 and spec.steps is None
    assert spec.optimizer.name == "adam" and spec.precision == "fp32"
    assert spec.device == "auto" and spec.strategy.name == "single"
    assert spec.loader.workers == 0 and spec.checkpoint.keep_last == 2


def test_unknown_top_level_key_is_named_with_the_allowed_ones():
    message = error_of(optimiser={"name": "sgd"})
    assert "unknown field 'optimiser'" in message
    assert "optimizer" in message.split("allowed here:")[1]


def test_unknown_nested_key_names_its_section():
    assert "unknown field 'data.foo'" in error_of(data={"name": "digits", "foo": 1})
    assert "unknown field 'optimizer.lrate'" in error_of(optimizer={"lrate": 0.1})


def test_wrong_type_names_field_and_value():
    message = error_of(optimizer={"name": "sgd", "lr": "fast"})
    assert message.startswith("spec: optimizer.lr:") and "'fast'" in message


def test_negative_batch_size():
    assert "batch_size: Input should be greater than 0 (got -4)" in error_of(batch_size=-4)


def test_missing_required_field():
    with pytest.raises(UserError, match="model: required field is missing"):
        parse_spec({k: v for k, v in BASE.items() if k != "model"})


def test_unknown_data_and_strategy_names_list_the_choices():
    assert "unknown data name 'mnist' (choose from: digits, synthetic, idx" in error_of(
        data={"name": "mnist"}
    )
    choices = "(choose from: single, ddp, ps, pipeline, hybrid, tensor)"
    assert f"unknown strategy name 'gossip' {choices}" in error_of(strategy={"name": "gossip"})


def test_epochs_and_steps_are_exclusive():
    assert "give epochs or steps, not both" in error_of(epochs=2, steps=10)


def test_device_and_precision_are_checked():
    assert "'gpu' is not one of auto, cpu, cuda, cuda:N, mps" in error_of(device="gpu")
    assert spec_with(device="cuda:1").device == "cuda:1"
    assert "precision" in error_of(precision="fp8")


def test_missing_data_file_is_named_relative_to_the_spec(tmp_path: Path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        "name: t\nmodel: {name: lenet}\nbatch_size: 8\n"
        "data: {name: idx, images: imgs-idx3-ubyte, labels: lbl-idx1-ubyte}\n"
    )
    with pytest.raises(UserError) as caught:
        load_spec(spec_file)
    assert f"data.images: file not found: {tmp_path / 'imgs-idx3-ubyte'}" in str(caught.value)


def test_relative_data_paths_resolve_against_the_spec_folder(tmp_path: Path):
    (tmp_path / "d.npz").write_bytes(b"placeholder")  # existence is all the spec checks
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        "name: t\nmodel: {name: mlp}\nbatch_size: 8\ndata: {name: npz, path: d.npz}\n"
    )
    assert load_spec(spec_file).data.path == (tmp_path / "d.npz").resolve()


def test_bad_yaml_and_missing_spec_file(tmp_path: Path):
    with pytest.raises(UserError, match="spec file not found"):
        load_spec(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: t\nmodel: [unclosed\n")
    with pytest.raises(UserError, match=r"invalid YAML at line \d"):
        load_spec(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="expected a mapping"):
        load_spec(listing)


def test_ignored_settings_are_warned_about():
    spec = spec_with(
        optimizer={"name": "adam", "momentum": 0.5},
        loader={"prefetch": 4},
        data={"name": "synthetic", "seq_len": 10},
    )
    warnings = spec.warnings()
    assert "optimizer.momentum is ignored by optimizer 'adam'" in warnings
    assert "loader.prefetch is ignored with loader.workers: 0" in warnings
    assert "data.seq_len is ignored with data.kind: image" in warnings
    assert spec_with().warnings() == []


def test_spec_hash_is_stable_and_sensitive():
    assert spec_with().spec_hash() == spec_with().spec_hash()
    assert spec_with().spec_hash() != spec_with(seed=1).spec_hash()


def test_batches_are_pinned_on_cuda_unless_the_spec_says_not_and_old_hashes_hold():
    unset, off, on = (spec_with(loader={"pin_memory": pin}).loader for pin in (None, False, True))
    assert [unset.pinned_on("cuda"), off.pinned_on("cuda"), on.pinned_on("cuda")] == [1, 0, 1]
    assert not any(loader.pinned_on(d) for loader in (unset, on) for d in ("cpu", "mps"))
    # Unset hashes as the old default (false) did, so a run from before it resumes.
    assert spec_with().spec_hash() == spec_with(loader={"pin_memory": False}).spec_hash()


def test_settings_that_only_say_when_a_worker_is_silent_leave_the_spec_hash_alone():
    """A checkpoint written before `heartbeat_warn_s` existed still resumes: the setting changes
    no step, so it is not part of the run's identity (a timeout still is)."""
    ddp = {"name": "ddp", "workers": 2}
    base = spec_with(strategy=ddp).spec_hash()
    assert spec_with(strategy={**ddp, "heartbeat_warn_s": 30}).spec_hash() == base
    assert spec_with(strategy={**ddp, "workers": 3}).spec_hash() != base
    # The hash of the example spec, as the code before the setting computed it.
    assert load_spec(EXAMPLES / "ddp-digits.yaml").spec_hash() == "bd96f00322a71463"
