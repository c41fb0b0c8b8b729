"""Sweep spaces, folds, scores and the search/stopping glue: pure functions, no processes."""

import statistics

import pytest
import torch

from dlscale.data import build_data
from dlscale.errors import UserError
from dlscale.jobspec import EarlyStoppingSpec, parse_spec
from dlscale.sweep import results as res
from dlscale.sweep.search import EarlyStopping, OptunaSearch
from dlscale.sweep.space import (
    RunUnit,
    check_space,
    config_raw,
    grid_points,
    probe_points,
    run_raw,
    run_units,
    set_path,
)
from dlscale.sweep.trial import PREDICTIONS
from tests.small_runs import base_spec

BASE = base_spec(
    "s", {"name": "digits"}, model={"name": "mlp", "kwargs": {"hidden": 16}}, batch_size=32, seed=3
)


def sweep_spec(**sweep):
    return parse_spec({**BASE, "sweep": sweep})


def test_set_path_creates_missing_sections_and_copies():
    raw = {"optimizer": {"lr": 0.1}}
    out = set_path(raw, "model.kwargs.hidden", 64)
    assert out["model"] == {"kwargs": {"hidden": 64}} and "model" not in raw
    assert set_path(raw, "optimizer.lr", 0.5)["optimizer"]["lr"] == 0.5
    with pytest.raises(UserError, match=r"'batch_size\.x' goes through 'batch_size', which"):
        set_path({"batch_size": 32}, "batch_size.x", 1)


def test_grid_is_every_combination_last_path_fastest():
    points = grid_points({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(points) == 6
    assert points[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}]
    grid = {"optimizer.lr": [0.1, 0.2], "batch_size": [8, 16, 32]}
    assert sweep_spec(grid=grid).sweep.trials == 6
    assert sweep_spec(kfold=3).sweep.trials == 1


def test_runs_of_a_configuration():
    config = config_raw({**BASE, "sweep": {"kfold": 3}}, {"optimizer.lr": 0.2})
    assert "sweep" not in config and config["optimizer"]["lr"] == 0.2
    fold = run_raw(config, RunUnit("fold", 1, 3))
    assert fold["data"]["fold"] == {"folds": 3, "index": 1}
    member = run_raw(config, RunUnit("member", 2, 4))
    # A member draws its own initialisation, but the configuration's data split.
    assert member["seed"] == 5 and member["data"]["seed"] == 3
    assert [u.name for u in run_units(sweep_spec(ensemble=2).sweep)] == ["member-0", "member-1"]
    assert [u.name for u in run_units(sweep_spec(grid={"seed": [1]}).sweep)] == ["train"]


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        (
            {"grid": {"seed": [1]}, "random": {"trials": 2, "space": {"seed": {"int": [0, 9]}}}},
            "give one of grid, random, tpe",
        ),
        ({"kfold": 3, "ensemble": 2}, "kfold or ensemble, not both"),
        ({"grid": {"optimizer.lr": []}}, "grid.optimizer.lr: give at least one value"),
        ({"grid": {"name": ["a"]}}, "'name' cannot be swept"),
        (
            {"tpe": {"trials": 3, "space": {"optimizer.lr": {"uniform": [0.1, 0.01]}}}},
            "range .* is empty",
        ),
        (
            {"random": {"trials": 3, "space": {"seed": {"int": [0, 3], "choice": [1]}}}},
            "exactly one of",
        ),
        ({"kfold": 1}, "sweep.kfold"),
    ],
)
def test_bad_sweep_sections_are_one_line(sweep, message):
    with pytest.raises(UserError, match=message):
        sweep_spec(**sweep)


def test_check_space_names_the_configuration_a_bad_path_or_value_comes_from():
    spec = sweep_spec(grid={"optimizer.lrr": [0.1]})
    with pytest.raises(UserError, match=r"sweep trial optimizer.lrr=0.1: unknown field"):
        check_space(spec, {**BASE, "sweep": {"grid": {"optimizer.lrr": [0.1]}}}, None, "x.yaml")
    raw = {**BASE, "sweep": {"grid": {"batch_size": [16, -1]}}}
    with pytest.raises(UserError, match=r"batch_size=-1: batch_size: Input should be greater"):
        check_space(parse_spec(raw), raw, None, "x.yaml")
    raw = {**BASE, "sweep": {"grid": {"model.kwargs.width": [4]}}}
    with pytest.raises(UserError, match=r"model.kwargs.width=4: model: .*width"):
        check_space(parse_spec(raw), raw, None, "x.yaml")


def test_a_sampled_space_is_probed_at_both_ends_of_each_range():
    space = {
        "optimizer.lr": {"log_uniform": [1e-4, 1e-1]},
        "model.kwargs.hidden": {"choice": [8, 32]},
    }
    spec = sweep_spec(random={"trials": 4, "space": space})
    points = probe_points(spec.sweep)
    assert {p["optimizer.lr"] for p in points} == {1e-4, 1e-1}
    assert {p["model.kwargs.hidden"] for p in points} == {8, 32}


def test_folds_partition_the_training_part_stratified_and_seeded():
    data = {"name": "digits", "val_fraction": 0.2}
    whole = build_data(parse_spec({**BASE, "data": data}).data, 3)
    vals = []
    for index in range(3):
        spec = parse_spec({**BASE, "data": {**data, "fold": {"folds": 3, "index": index}}})
        fold = build_data(spec.data, spec.seed)
        assert fold.num_train + len(fold.val) == whole.num_train
        labels = fold.val.tensors[1]
        share = torch.bincount(labels, minlength=10) / len(labels)
        overall = torch.bincount(whole.train.tensors[1], minlength=10) / whole.num_train
        assert torch.allclose(share, overall, atol=0.02)  # every class in proportion
        vals.append(fold.val.tensors[0])
    together = torch.cat(vals)
    assert len(together) == whole.num_train
    rows = sorted(map(tuple, together.flatten(1).tolist()))
    assert rows == sorted(map(tuple, whole.train.tensors[0].flatten(1).tolist()))
    with pytest.raises(UserError, match=r"data\.fold: index 3 does not exist"):
        parse_spec({**BASE, "data": {**data, "fold": {"folds": 3, "index": 3}}})


def test_data_seed_keeps_the_split_when_the_spec_seed_changes():
    one = parse_spec({**BASE, "seed": 1, "data": {"name": "digits", "seed": 7}})
    two = parse_spec({**BASE, "seed": 2, "data": {"name": "digits", "seed": 7}})
    assert torch.equal(
        build_data(one.data, one.seed).val.tensors[1], build_data(two.data, two.seed).val.tensors[1]
    )
    three = parse_spec({**BASE, "seed": 2})
    assert not torch.equal(
        build_data(one.data, one.seed).val.tensors[0],
        build_data(three.data, three.seed).val.tensors[0],
    )


def test_ensemble_score_averages_probabilities(tmp_path):
    labels = torch.tensor([0, 1, 1])
    members = [
        torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]]),
        torch.tensor([[0.6, 0.4], [0.2, 0.8], [0.6, 0.4]]),
    ]
    dirs = []
    for index, probabilities in enumerate(members):
        folder = tmp_path / f"m{index}"
        folder.mkdir()
        torch.save({"probabilities": probabilities, "labels": labels}, folder / PREDICTIONS)
        dirs.append(folder)
    scores = res.ensemble_scores(dirs)
    # averaged: [0.75 0.25], [0.4 0.6], [0.4 0.6] -> all three right; each member has 2 of 3
    assert scores["val_accuracy"] == pytest.approx(1.0)
    expected_loss = -(torch.log(torch.tensor([0.75, 0.6, 0.6]))).mean()
    assert scores["val_loss"] == pytest.approx(float(expected_loss), rel=1e-5)
    torch.save(
        {"probabilities": members[0], "labels": torch.tensor([1, 1, 1])}, dirs[1] / PREDICTIONS
    )
    with pytest.raises(RuntimeError, match="different validation sets"):
        res.ensemble_scores(dirs)


def test_a_trial_is_scored_by_its_folds_and_fails_with_any_run():
    sweep = sweep_spec(kfold=3).sweep
    runs = [
        {
            "name": f"fold-{i}",
            "status": "completed",
            "val_accuracy": v,
            "wall_s": 1.0,
            "error": None,
        }
        for i, v in enumerate([0.9, 0.8, 0.7])
    ]
    summary = res.summarize(sweep, runs)
    assert summary["metric"] == pytest.approx(0.8)
    assert summary["metric_std"] == pytest.approx(statistics.pstdev([0.9, 0.8, 0.7]))
    runs[1] = {**runs[1], "status": "failed", "error": "boom"}
    failed = res.summarize(sweep, runs)
    assert failed["status"] == "failed" and failed["metric"] is None
    assert failed["error"] == "fold-1: boom"
    assert res.trial_status(["completed", "pending"]) == "running"
    assert res.trial_status(["pending", "pending"]) == "pending"


def test_best_trial_follows_the_metric_direction():
    trials = [
        {"id": "a", "status": "completed", "metric": 0.3},
        {"id": "b", "status": "completed", "metric": 0.1},
        {"id": "c", "status": "failed", "metric": None},
    ]
    assert res.best_trial(trials, maximize=True)["id"] == "a"
    assert res.best_trial(trials, maximize=False)["id"] == "b"
    assert res.best_trial(trials[2:], maximize=True) is None


def test_median_stopping_stops_a_run_below_the_finished_ones():
    stopper = EarlyStopping(EarlyStoppingSpec(rule="median", min_runs=2), maximize=True)
    for key, curve in (("a", [0.3, 0.7, 0.8]), ("b", [0.25, 0.3, 0.4])):
        assert not any(stopper.report(key, e + 1, v) for e, v in enumerate(curve))
        stopper.finish(key, "completed", curve[-1])
    assert not stopper.report("good", 1, 0.5)
    assert stopper.report("bad", 1, 0.1)  # below the median 0.275 of the finished runs


def test_asha_keeps_the_top_third_at_a_rung():
    stopper = EarlyStopping(EarlyStoppingSpec(rule="asha", reduction_factor=3), maximize=True)
    verdicts = [stopper.report(f"r{i}", 1, value) for i, value in enumerate([0.9, 0.2, 0.1])]
    assert verdicts == [False, True, True]


def test_optuna_search_draws_within_the_space_and_resumes_unfinished_configurations():
    spec = sweep_spec(
        random={
            "trials": 3,
            "space": {
                "optimizer.lr": {"log_uniform": [1e-4, 1e-1]},
                "batch_size": {"int": [8, 64]},
                "model.kwargs.hidden": {"choice": [8, 32]},
            },
        }
    )
    first = OptunaSearch("random", spec.sweep.search, True, seed=0)
    drawn = [first.next_params(n) for n in range(3)]
    assert first.next_params(3) is None  # the budget
    for params in drawn:
        assert 1e-4 <= params["optimizer.lr"] <= 1e-1 and 8 <= params["batch_size"] <= 64
        assert params["model.kwargs.hidden"] in (8, 32)
    again = OptunaSearch("random", spec.sweep.search, True, seed=0)
    assert [again.next_params(n) for n in range(3)] == drawn  # seeded
    resumed = OptunaSearch("tpe", spec.sweep.search, True, seed=0)
    assert resumed.restore(0, drawn[0], "completed", 0.9)
    assert resumed.restore(1, drawn[1], None, None)  # it runs again, with the same values
    assert resumed.trials[1].params == drawn[1]
    assert not resumed.restore(2, {"seed": 1}, None, None)  # not this sweep's


@pytest.mark.parametrize("kind", ["random", "tpe"])
def test_a_resumed_drawn_sweep_draws_what_an_uninterrupted_one_would(kind):
    """An interrupted random sweep resumed with the same seed continues the seed's sequence:
    the trials still to come are those the sweep would have drawn, none drawn twice and none
    lost; TPE's random start the same (its first ten of 30 trials are drawn at random)."""
    spec = sweep_spec(
        random={
            "trials": 30,
            "space": {
                "optimizer.lr": {"log_uniform": [1e-4, 1e-1]},
                "batch_size": {"int": [8, 64]},
                "model.kwargs.hidden": {"choice": [8, 16, 32, 64]},
            },
        }
    )
    whole = OptunaSearch(kind, spec.sweep.search, True, seed=3)
    drawn = [whole.next_params(n) for n in range(6)]  # none told yet: TPE is still starting
    resumed = OptunaSearch(kind, spec.sweep.search, True, seed=3)
    assert resumed.restore(0, drawn[0], "completed", 0.5)
    assert resumed.restore(1, drawn[1], "failed", None)
    assert resumed.restore(2, drawn[2], None, None)  # interrupted: runs again as drawn
    assert resumed.trials[2].params == drawn[2]
    assert [resumed.next_params(n) for n in range(3, 6)] == drawn[3:]
