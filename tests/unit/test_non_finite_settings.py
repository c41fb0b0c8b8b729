"""Numbers that are not numbers (issue 34, point 4): `.inf` or `.nan` in any float setting of a
spec is refused in one line naming the setting, before anything trains."""

import pytest

from dlscale.jobspec import load_spec, parse_spec
from tests.unit.test_bad_input import SPEC, refused


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize(
    "where",
    [
        {"optimizer": {"name": "sgd", "lr": None}},
        {"optimizer": {"name": "momentum", "momentum": None}},
        {"optimizer": {"name": "adamw", "weight_decay": None}},
        {"optimizer": {"name": "adam", "betas": [0.9, None]}},
        {"strategy": {"name": "ddp", "workers": 2, "heartbeat_warn_s": None}},
        {"data": {"name": "digits", "val_fraction": None}},
    ],
    ids=["lr", "momentum", "weight_decay", "betas", "heartbeat_warn_s", "val_fraction"],
)
def test_a_non_finite_float_setting_is_refused_in_one_line(where, value):
    ((section, fields),) = where.items()
    filled = {k: (value if v is None else v) for k, v in fields.items()}
    if "betas" in filled:
        filled["betas"] = [0.9, value]
    message = refused(parse_spec, {**SPEC, section: filled})
    assert message.startswith(f"spec: {section}."), message
    assert "finite number" in message, message


def test_yaml_infinity_in_a_spec_file_is_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 32\n"
        "optimizer: {name: sgd, lr: .inf}\n"
    )
    message = refused(load_spec, path)
    assert "optimizer.lr" in message and "finite number" in message, message


def test_a_large_finite_setting_is_still_accepted():
    spec = parse_spec({**SPEC, "optimizer": {"name": "sgd", "lr": 1e30}})
    assert spec.optimizer.lr == 1e30


def test_a_non_finite_end_of_a_sweep_range_is_refused():
    space = {"optimizer.lr": {"uniform": [0.1, float("inf")]}}
    message = refused(parse_spec, {**SPEC, "sweep": {"random": {"trials": 2, "space": space}}})
    assert "sweep.random.space.optimizer.lr.uniform[1]" in message and "finite" in message
