"""Tensor parallel: the plan (auto, the model's, the spec's), equality with one process for an
MLP, the GPT (heads split) and CNNs, 2-D with data parallel, the record's collectives."""

import json
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.models import build_model, count_parameters
from dlscale.profiler.tensor_flow import record_flow
from dlscale.profiler.tensor_plan import make_plan
from tests.strategies.test_pipeline import GPT, LENET, assert_same_weights

MLP = {
    "name": "tp-mlp",
    "model": {"name": "mlp", "kwargs": {"hidden": [64, 32]}},
    "data": {"name": "digits"},
    "optimizer": {"name": "adam", "lr": 0.003},
    "device": "cpu",
    "seed": 3,
}


def plan_of(name: str, kwargs: dict, example: torch.Tensor, degree: int = 2, asked="auto"):
    model = build_model(name, kwargs)
    flow = record_flow(model, example)
    return make_plan(flow, degree, asked, count_parameters(model), getattr(model, "tp_plan", None))


def train(tmp_path: Path, base: dict, name: str, strategy: dict, batch: int, steps: int) -> Path:
    spec = parse_spec({**base, "batch_size": batch, "steps": steps, "strategy": strategy})
    api.train(spec, out_dir=tmp_path / name)
    return tmp_path / name


# ------------------------------------------------------------------------------- the plan


def test_auto_pairs_linear_layers_column_then_row():
    plan = plan_of("mlp", {"hidden": [64, 32]}, torch.zeros(1, 784))
    assert plan.styles == {"1": "colwise", "3": "rowwise"}  # the last layer stays whole
    # The first layer's input is data: no gradient to sum. One all-reduce in forward.
    assert plan.comm_per_step(8) == {"all_reduce": {"count": 1, "payload_bytes": 8 * 32 * 4}}
    whole = 784 * 64 + 64 + 64 * 32 + 32
    assert plan.params - plan.params_per_device == whole // 2 - 32 // 2  # row bias stays whole


def test_auto_splits_attention_by_heads_and_the_mlp_megatron_style():
    plan = plan_of("gpt", {"n_layer": 1, "d_model": 32, "n_head": 4}, torch.zeros(1, 8).long())
    assert plan.styles == {
        "blocks.0.attn.q": "colwise",
        "blocks.0.attn.k": "colwise",
        "blocks.0.attn.v": "colwise",
        "blocks.0.attn.proj": "rowwise",
        "blocks.0.mlp.fc": "colwise",
        "blocks.0.mlp.proj": "rowwise",
    }  # lm_head shares the embedding's weight: whole
    comm = plan.comm_per_step(2)
    # Forward: one all-reduce per pair; backward: the input gradient of q, k, v and fc.
    assert comm["all_reduce"]["count"] == 2 + 4
    assert comm["all_reduce"]["payload_bytes"] == 6 * 2 * 8 * 32 * 4


def test_auto_splits_convolutions_by_output_channels():
    plan = plan_of("lenet", {}, torch.zeros(1, 1, 28, 28))
    assert plan.styles == {
        "conv1": "colwise_gather",
        "conv2": "colwise_gather",
        "fc1": "colwise",
        "fc2": "rowwise",
    }


def test_alexnet_2gpu_has_the_papers_layers_and_its_columns_plan():
    model = build_model("alexnet_2gpu", {})
    assert count_parameters(model) == 60_965_224  # the layer shapes of the paper's Figure 2
    convs = [m for m in model.features if isinstance(m, torch.nn.Conv2d)]
    assert [c.groups for c in convs] == [1, 2, 1, 2, 2]  # columns meet at the third conv
    assert [c.out_channels for c in convs] == [96, 256, 384, 384, 256]
    plan = plan_of("alexnet_2gpu", {"num_classes": 10}, torch.zeros(1, 3, 64, 64))
    assert plan.source == "model" and plan.styles["features.10"] == "grouped"
    kinds = {row.name: (row.forward, row.backward) for row in plan.layers}
    assert kinds["features.10"] == ("", "")  # a column's own layer moves nothing
    assert kinds["features.4"] == ("all_gather", "")  # both columns' maps to the third conv
    with pytest.raises(UserError, match="2 groups, which do not divide among 4"):
        plan_of("alexnet_2gpu", {"num_classes": 12}, torch.zeros(1, 3, 64, 64), degree=4)


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ({"nope": "colwise"}, "names 'nope', which is not a Linear or Conv2d layer"),
        ({"1": "grouped"}, "'1' is a Linear layer; 'grouped' is for convolutions"),
        ({"5": "colwise"}, "has 10 output features, which do not split over 4 devices"),
    ],
)
def test_a_plan_that_cannot_split_is_one_line(asked, message):
    with pytest.raises(UserError, match=message):
        plan_of("mlp", {"hidden": [64, 32]}, torch.zeros(1, 784), degree=4, asked=asked)


# ----------------------------------------------------------------- equality with one process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("base", "batch", "steps"),
    [(MLP, 16, 6), (GPT, 8, 4), (LENET, 16, 4)],
    ids=["mlp", "gpt", "cnn"],
)
def test_tensor_parallel_equals_one_process(tmp_path: Path, base: dict, batch: int, steps: int):
    """After k steps, the weights assembled from the shards equal one process's."""
    single = train(tmp_path, base, "single", {"name": "single"}, batch, steps)
    split = train(tmp_path, base, "tensor", {"name": "tensor", "degree": 2}, batch, steps)
    assert_same_weights(single, split)
    record = json.loads((split / "run.json").read_text())
    section = record["tensor"]
    assert section["plan_source"] == "auto" and section["params_per_device"] < section["params"]
    # Every collective DTensor ran was foreseen by the plan: same kinds, counts and bytes.
    assert section["collectives_per_step"] == section["predicted_collectives_per_step"]


@pytest.mark.slow
def test_tensor_by_data_parallel_on_a_2d_mesh_equals_one_process_on_the_global_batch(tmp_path):
    single = train(tmp_path, MLP, "single", {"name": "single"}, 32, 4)
    grid = train(tmp_path, MLP, "grid", {"name": "tensor", "degree": 2, "data_parallel": 2}, 16, 4)
    assert_same_weights(single, grid)
    section = json.loads((grid / "run.json").read_text())["tensor"]
    assert section["global_batch_size"] == 32 and section["replica_sync_bytes_per_step"] > 0


@pytest.mark.slow
@pytest.mark.heavy
def test_the_two_column_alexnet_trains_on_two_devices_as_on_one(tmp_path: Path):
    base = {
        "name": "alexnet-columns",
        "model": {"name": "alexnet_2gpu", "kwargs": {"num_classes": 4, "dropout": 0.0}},
        "data": {"name": "synthetic", "shape": [3, 64, 64], "num_classes": 4, "num_samples": 64},
        "optimizer": {"name": "sgd", "lr": 0.01},
        "device": "cpu",
        "seed": 2,
    }
    single = train(tmp_path, base, "single", {"name": "single"}, 4, 2)
    columns = train(tmp_path, base, "columns", {"name": "tensor", "degree": 2}, 4, 2)
    assert_same_weights(single, columns)
    section = json.loads((columns / "run.json").read_text())["tensor"]
    assert section["plan_source"] == "model"
    assert section["collectives_per_step"] == section["predicted_collectives_per_step"]


@pytest.mark.slow
def test_a_plan_whose_split_changes_the_forward_is_refused(tmp_path: Path):
    """Column-split without its row partner: the next layer gets half its input."""
    spec = parse_spec(
        {
            **MLP,
            "batch_size": 8,
            "steps": 2,
            "strategy": {"name": "tensor", "plan": {"1": "colwise"}},
        }
    )
    with pytest.raises(Exception, match=r"tensor plan .* the split model fails"):
        api.train(spec, out_dir=tmp_path / "bad")


@pytest.mark.slow
@pytest.mark.heavy
def test_the_example_trains_and_prints_its_plan_first(tmp_path: Path):
    from typer.testing import CliRunner

    from dlscale.cli.main import app
    from tests.conftest import EXAMPLES

    args = ["train", str(EXAMPLES / "tensor-gpt.yaml"), "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run.json").read_text())
    # The GPT's ceiling is ~46% (each token of its Markov chain has two likely successors).
    assert record["final"]["val_accuracy"] >= 0.40, record["final"]
    words = " ".join(result.output.split())
    assert "tensor plan (auto): 2 devices" in words and "blocks.1.mlp.proj" in words
    assert words.index("tensor plan") < words.index("epoch 1")  # shown before training
    assert "collectives / step │ 12 all-reduce" in words


def test_fp16_is_refused_with_the_reason():
    with pytest.raises(UserError, match="strategy tensor trains in fp32 or bf16"):
        parse_spec({**MLP, "batch_size": 8, "precision": "fp16", "strategy": {"name": "tensor"}})


def test_split_and_whole_parameters_update_in_groups_of_their_own(tmp_path: Path):
    """Found on an H200: a GPU optimizer's foreach kernels refused a mix of DTensor and plain
    parameters ("got mixed torch.Tensor and DTensor"). foreach=True makes the CPU take that path."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dlscale.launch.local import free_port
    from dlscale.strategies.tensor.exchange import TensorExchange
    from dlscale.strategies.tensor.styles import apply_plan

    plan = plan_of("mlp", {"hidden": [64, 32]}, torch.zeros(1, 784))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        model = build_model("mlp", {"hidden": [64, 32]})
        apply_plan(model, init_device_mesh("cpu", (1,)), plan.layers)
        params = list(model.parameters())
        model(torch.randn(4, 784)).sum().backward()
        grouped = TensorExchange.param_groups(None, params)
        assert [len(group["params"]) for group in grouped] == [4, 2]  # '1' and '3'; '5' whole
        torch.optim.AdamW(grouped, foreach=True).step()
        with pytest.raises(RuntimeError, match=r"mixed torch\.Tensor and DTensor"):
            torch.optim.AdamW(params, foreach=True).step()
    finally:
        dist.destroy_process_group()


def test_a_model_with_nothing_to_split_is_one_line(tmp_path: Path):
    spec = parse_spec(
        {**MLP, "batch_size": 8, "steps": 1, "strategy": {"name": "tensor", "degree": 3}}
    )
    with pytest.raises(UserError, match="nothing in model 'mlp' splits over 3 devices"):
        api.train(spec, out_dir=tmp_path / "none")
    assert not (tmp_path / "none" / "run.json").exists()


def test_one_device_moves_nothing():
    """Degree 1 (a mesh of one, as on a single GPU): the plan predicts no collectives, as DTensor
    issues none (found on an H200, where the record's measured {} met a predicted all-reduce)."""
    plan = plan_of("mlp", {"hidden": [64, 32]}, torch.zeros(1, 784), degree=1)
    assert plan.styles == {"1": "colwise", "3": "rowwise"} and plan.comm_per_step(8) == {}


def test_compare_and_scale_take_tensor():
    from dlscale.bench.compare import compare_spec, parse_strategies
    from dlscale.bench.scale import scaled_spec, scaled_strategy

    spec = parse_spec({**MLP, "batch_size": 8, "strategy": {"name": "tensor", "data_parallel": 2}})
    assert parse_strategies("ddp,tensor") == ["ddp", "tensor"]
    four = compare_spec(spec, "tensor", 4, None).strategy
    assert (four.name, four.degree, four.data_parallel) == ("tensor", 2, 2)  # replicas kept
    with pytest.raises(UserError, match="give a multiple of 2"):
        compare_spec(spec, "tensor", 3, None)
    assert scaled_strategy(spec) == "tensor"
    assert scaled_spec(spec, 4, 10).strategy.degree == 4  # the degree scales, the batch stays
    assert scaled_spec(spec, 4, 10).batch_size == 8
