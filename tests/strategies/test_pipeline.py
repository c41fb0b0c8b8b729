"""Pipeline and hybrid: the split, equality with one process, the memory cap, the record."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.models import build_model, count_parameters
from dlscale.profiler.pipeline_split import candidate_names, in_flight, partition, plan_split
from dlscale.profiler.trace import trace_step
from dlscale.strategies.pipeline.plan import predicted_bubble
from tests.small_runs import SGD, base_spec, final_weights, synthetic_images

LENET = base_spec("pp-lenet", synthetic_images(800), optimizer=SGD, device="cpu", seed=5)
GPT = {
    "name": "pp-gpt",
    "model": {"name": "gpt", "kwargs": {"n_layer": 2, "d_model": 32, "n_head": 2}},
    "data": {
        "name": "synthetic",
        "kind": "tokens",
        "task": "language_modeling",
        "seq_len": 16,
        "vocab_size": 32,
        "num_samples": 400,
    },
    "optimizer": {"name": "sgd", "lr": 0.1},
    "device": "cpu",
    "seed": 5,
}


def assert_same_weights(reference: Path, other: Path) -> None:
    """Relative difference ≤ 1e-5, over the model and per tensor. A tensor whose true value is
    zero stays at rounding noise in both runs (a key bias: softmax ignores a shift shared by
    every key, so its gradient is 0 up to rounding; 2e-12 here), so 1e-9 is added per tensor."""
    expected, got = final_weights(reference), final_weights(other)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        difference = (got[name] - value).norm()
        assert difference <= 1e-5 * value.norm() + 1e-9, (name, float(difference))
    whole = torch.cat([v.flatten() for v in expected.values()])
    delta = torch.cat([(got[k] - v).flatten() for k, v in expected.items()])
    assert delta.norm() / whole.norm() <= 1e-5


def lenet_trace(batch: int = 4):
    return trace_step(
        lambda: build_model("lenet", {}),
        torch.zeros(1, 28, 28),
        batch,
        "fp32",
        torch.optim.SGD,
        "sgd",
    )


def test_partition_minimises_the_costliest_stage():
    assert partition([1, 1, 1, 1], 2) == [0, 2]
    assert partition([5, 1, 1, 1, 1, 1], 2) == [0, 1]  # {5} | {1,1,1,1,1}
    assert partition([1, 2, 3, 4, 5], 3) == [0, 3, 4]  # {1,2,3} {4} {5}: largest 6
    assert partition([3, 3, 3], 3) == [0, 1, 2]


def test_microbatches_in_flight_follow_the_schedule():
    assert [in_flight("gpipe", 8, 4, s) for s in range(4)] == [8, 8, 8, 8]
    assert [in_flight("1f1b", 8, 4, s) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight("naive", 8, 4, 0) == 1
    assert predicted_bubble(2, 4) == pytest.approx(1 / 5)
    assert predicted_bubble(2, 1) == pytest.approx(1 / 2)


def test_candidates_open_up_sequences():
    names = candidate_names(build_model("gpt", {"n_layer": 3}))
    assert names == [
        "tok_emb",
        "pos_emb",
        "drop",
        "blocks.0",
        "blocks.1",
        "blocks.2",
        "ln_f",
        "lm_head",
    ]


def test_split_plan_balances_and_accounts_every_parameter():
    model = build_model("lenet", {})
    plan = plan_split(model, lenet_trace(), 2, "gpipe", 4)
    assert plan.balanced_by == "flops"  # no hardware given
    assert sum(stage.params for stage in plan.stages) == sum(p.numel() for p in model.parameters())
    assert plan.boundaries == [plan.stages[1].units[0]]
    flops = [stage.flops for stage in plan.stages]
    assert max(flops) < sum(flops)  # both stages do work
    given = plan_split(model, lenet_trace(), 2, "gpipe", 4, split=["fc1"])
    assert given.balanced_by == "given" and given.stages[1].units == [
        "fc1",
        "relu3",
        "fc2",
        "relu4",
        "fc3",
    ]


def test_bad_splits_are_one_line():
    model = build_model("lenet", {})
    with pytest.raises(UserError, match="nope cannot begin a stage; choose from relu1, pool1"):
        plan_split(model, lenet_trace(), 2, "gpipe", 4, split=["nope"])
    with pytest.raises(UserError, match="more than the model's 12 splittable layers"):
        plan_split(model, lenet_trace(), 13, "gpipe", 4)
    with pytest.raises(UserError, match=r"split lists the modules that begin stages 2\.\.3"):
        parse_spec(
            {
                **LENET,
                "batch_size": 8,
                "strategy": {"name": "pipeline", "stages": 3, "split": ["fc1"]},
            }
        )


def test_a_memory_cap_refuses_one_worker_and_names_the_split_that_fits():
    model = build_model("lenet", {})
    whole = plan_split(model, lenet_trace(), 1, "gpipe", 4).stages[0].memory_bytes
    cap = int(whole * 0.7)
    with pytest.raises(UserError, match=r"stage 1 of 1 .* a split into 2 stages fits"):
        plan_split(model, lenet_trace(), 1, "gpipe", 4, max_memory=cap)
    plan = plan_split(model, lenet_trace(), 2, "gpipe", 4, max_memory=cap)
    assert max(stage.memory_bytes for stage in plan.stages) <= cap


@pytest.mark.slow
@pytest.mark.parametrize(("base", "schedule"), [(LENET, "gpipe"), (GPT, "1f1b")])
def test_pipeline_weights_equal_one_process(tmp_path: Path, base: dict, schedule: str):
    """k steps through two stages (4 microbatches) leave the weights one process would have."""
    single = parse_spec({**base, "batch_size": 16, "steps": 6})
    piped = parse_spec(
        {
            **base,
            "batch_size": 16,
            "steps": 6,
            "strategy": {"name": "pipeline", "stages": 2, "microbatches": 4, "schedule": schedule},
        }
    )
    api.train(single, out_dir=tmp_path / "single")
    record = api.train(piped, out_dir=tmp_path / "pipe")
    assert_same_weights(tmp_path / "single", tmp_path / "pipe")
    pipe = record.pipeline
    assert pipe["stages"] == 2 and pipe["microbatches"] == 4 and len(pipe["per_stage"]) == 2
    assert sum(s["params"] for s in pipe["per_stage"]) >= record.model.parameters
    assert all(0 < s["busy_s"] < s["schedule_s"] for s in pipe["per_stage"])
    assert 0 < pipe["bubble_measured"] < 1 and pipe["bubble_predicted"] == pytest.approx(0.2)
    assert record.final.step == 6 and record.epochs


@pytest.mark.slow
def test_hybrid_two_by_two_equals_one_process_at_twice_the_batch(tmp_path: Path):
    single = parse_spec({**LENET, "batch_size": 16, "steps": 5})
    hybrid = parse_spec(
        {
            **LENET,
            "batch_size": 8,
            "steps": 5,
            "strategy": {"name": "hybrid", "data_parallel": 2, "stages": 2, "microbatches": 2},
        }
    )
    api.train(single, out_dir=tmp_path / "single")
    record = api.train(hybrid, out_dir=tmp_path / "hybrid")
    assert_same_weights(tmp_path / "single", tmp_path / "hybrid")
    assert record.pipeline["data_parallel"] == 2 and len(record.workers) == 4
    assert all(r["sync_s"] > 0 for r in record.pipeline["replicas"])


@pytest.mark.slow
def test_a_model_refused_on_one_worker_trains_when_split(tmp_path: Path):
    model = build_model("lenet", {})
    whole = plan_split(model, lenet_trace(8), 1, "gpipe", 2).stages[0].memory_bytes
    strategy = {"name": "pipeline", "microbatches": 2, "max_memory_per_worker": int(whole * 0.7)}
    one = parse_spec({**LENET, "batch_size": 16, "steps": 4, "strategy": {**strategy, "stages": 1}})
    with pytest.raises(UserError, match="a split into 2 stages fits"):
        api.train(one, out_dir=tmp_path / "one")
    two = parse_spec({**LENET, "batch_size": 16, "steps": 4, "strategy": {**strategy, "stages": 2}})
    record = api.train(two, out_dir=tmp_path / "two")
    assert record.status == "completed"
    assert record.pipeline["balanced_by"] in ("time", "flops", "memory")
    assert all(s["memory_bytes"] <= int(whole * 0.7) for s in record.pipeline["per_stage"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "minimum_accuracy"),
    # The GPT's ceiling is ~46% (each token of its Markov chain has two likely successors).
    [
        pytest.param("pipeline-gpt.yaml", 0.40, marks=pytest.mark.heavy),
        pytest.param("hybrid-digits.yaml", 0.93, marks=pytest.mark.heavy),
    ],
)
def test_examples_train_and_print_their_split(tmp_path: Path, example: str, minimum_accuracy):
    from typer.testing import CliRunner

    from dlscale.cli.main import app
    from tests.conftest import EXAMPLES

    result = CliRunner().invoke(app, ["train", str(EXAMPLES / example), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["final"]["val_accuracy"] >= minimum_accuracy, record["final"]
    words = " ".join(result.output.split())
    assert "pipeline stages (balanced by" in words and "bubble" in words
    assert words.index("pipeline stages") < words.index("epoch 1")  # printed before training


def alexnet_trace(batch: int = 2):
    return trace_step(
        lambda: build_model("alexnet", {"num_classes": 10, "in_channels": 1}),
        torch.zeros(1, 64, 64),
        batch,
        "fp32",
        torch.optim.SGD,
        "sgd",
    )


def test_a_stage_never_begins_at_an_in_place_op():
    """AlexNet's ReLUs run in place: a stage beginning at one would modify its input, which is
    a leaf of the stage's graph (the defect: `a leaf Variable that requires grad is being used
    in an in-place operation`)."""
    model = build_model("alexnet", {"num_classes": 10, "in_channels": 1})
    in_place = {name for name, m in model.named_modules() if getattr(m, "inplace", False)}
    trace = alexnet_trace()
    for stages in (2, 3, 4):
        plan = plan_split(model, trace, stages, "gpipe", 2)
        assert not in_place & set(plan.boundaries), plan.boundaries
        units = [u for stage in plan.stages for u in stage.units]
        assert not in_place & {stage.units[0] for stage in plan.stages}
        assert sum(stage.params for stage in plan.stages) == count_parameters(model)
        assert len(units) == len(set(units))
    with pytest.raises(UserError, match=r"features\.1 runs in place .* cannot begin a stage"):
        plan_split(model, trace, 2, "gpipe", 2, split=["features.1"])


@pytest.mark.slow
def test_a_model_with_in_place_activations_trains_in_stages(tmp_path: Path, monkeypatch):
    """End to end, what AlexNet at 3 stages hit: a balanced split of these layers began a stage
    at an in-place ReLU, and every step failed in the stage process. Its first stage (the
    Flatten) has no parameters to train."""
    (tmp_path / "inplace_models.py").write_text(
        "from torch import nn\n"
        "def mlp(input_size, num_classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(input_size, 64), nn.ReLU(inplace=True),\n"
        "                         nn.Linear(64, 64), nn.ReLU(inplace=True),\n"
        "                         nn.Linear(64, num_classes))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse_spec(
        {
            **LENET,
            "model": {"name": "inplace_models:mlp"},
            "batch_size": 8,
            "steps": 3,
            "strategy": {"name": "pipeline", "stages": 3, "microbatches": 2},
        }
    )
    record = api.train(spec, out_dir=tmp_path / "run")
    assert record.status == "completed" and record.final.step == 3
    assert not {"2", "4"} & set(record.pipeline["split"])  # the in-place ReLUs
    assert record.pipeline["per_stage"][0]["params"] == 0


@pytest.mark.slow
def test_the_pipeline_evaluates_its_model_in_eval_mode(tmp_path: Path):
    """Dropout of 0.5 in every stage: the pipeline's own evaluation (its eval-mode trace) scores
    the final weights exactly as one process scores them in eval mode."""
    from dlscale.data import build_data
    from dlscale.train.score import evaluate

    base = {**GPT, "model": {"name": "gpt", "kwargs": {**GPT["model"]["kwargs"], "dropout": 0.5}}}
    spec = parse_spec(
        {
            **base,
            "batch_size": 16,
            "steps": 6,
            "strategy": {"name": "pipeline", "stages": 2, "microbatches": 2},
        }
    )
    record = api.train(spec, out_dir=tmp_path)
    data = build_data(spec.data, spec.seed)
    model = build_model("gpt", spec.model.kwargs, data.model_defaults())
    model.load_state_dict(final_weights(tmp_path))
    loader = torch.utils.data.DataLoader(data.val, batch_size=64)
    val_loss, val_accuracy = evaluate(model, loader, torch.device("cpu"), "fp32")
    assert record.final.val_loss == pytest.approx(val_loss, rel=1e-5)
    assert record.final.val_accuracy == pytest.approx(val_accuracy)


@pytest.mark.slow
def test_a_validation_set_smaller_than_a_batch_is_evaluated(tmp_path: Path):
    """Found by the tensor benchmark: 9 validation samples were padded with 9 more, not to the
    batch of 32, and GPT's stages (traced at a microbatch of 8, the batch baked into their
    reshapes) failed on microbatches of 5."""
    data = {**GPT["data"], "num_samples": 100, "val_fraction": 0.05}  # 5 to validate
    strategy = {"name": "pipeline", "stages": 2, "microbatches": 2}
    spec = parse_spec({**GPT, "data": data, "batch_size": 16, "steps": 2, "strategy": strategy})
    record = api.train(spec, out_dir=tmp_path / "small-val")
    assert record.data.val_samples == 5
    assert record.final.val_accuracy is not None


@pytest.mark.slow
def test_2bw_records_staleness_and_no_steady_idle_slot_where_gpipe_has_some(tmp_path: Path):
    """The same split, 6 steps of 4 microbatches: 2bw's run.json counts its bubble in slots
    (zero in steady state) and the staleness of its 6 updates; gpipe's has idle slots."""
    runs = {}
    for schedule in ("gpipe", "2bw"):
        spec = parse_spec(
            {
                **LENET,
                "batch_size": 16,
                "steps": 6,
                "strategy": {
                    "name": "pipeline",
                    "stages": 2,
                    "microbatches": 4,
                    "schedule": schedule,
                },
            }
        )
        runs[schedule] = api.train(spec, out_dir=tmp_path / schedule).pipeline
    pipe, gpipe = runs["2bw"], runs["gpipe"]
    assert pipe["split"] == gpipe["split"]
    # 2 × (S − 1) = 2 idle slots per stage in all (fill and drain), none in between; gpipe
    # idles 2 per stage in every one of its 6 steps.
    assert pipe["bubble_slots"]["steady_idle_slots"] == 0
    assert pipe["bubble_slots"]["per_stage_idle"] == [2, 2]
    assert gpipe["bubble_slots"]["per_stage_idle"] == [12, 12]
    assert gpipe["bubble_slots"]["steady_idle_slots"] > 0
    # Batch 0 applied to the weights it ran on; batches 1..5 one update late (the last after
    # the drain).
    assert pipe["staleness_histogram"] == {"0": 1, "1": 5} and pipe["max_staleness"] == 1
    assert gpipe["staleness_histogram"] == {"0": 6} and gpipe["mean_staleness"] == 0
    assert pipe["bubble_predicted"] == 0 and gpipe["bubble_predicted"] == pytest.approx(0.2)


FX_STAGE_CALL = """
import torch, torch.fx
from dlscale.strategies.pipeline.exchange import thread_progress_lock
thread_progress_lock()
module = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
torch.fx.Interpreter(module).run(torch.zeros(1, 2))  # as a pipeline stage's call does
from tqdm.std import TqdmDefaultWriteLock
print(getattr(TqdmDefaultWriteLock, "mp_lock", None))
"""


def test_a_stage_call_makes_no_multiprocessing_lock():
    """torch.fx's Interpreter opens a disabled tqdm bar on each call; tqdm's default lock is a
    multiprocessing one, whose semaphore was reported as leaked when Ctrl-C ended the workers."""
    done = subprocess.run([sys.executable, "-c", FX_STAGE_CALL], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "None"), done.stderr


DATA_DEPENDENT = """
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x):
        h = self.a(x.flatten(1))
        if h.sum() > 0:  # reads a value: no trace on the meta device
            h = h * 2
        return self.b(h.relu())


def branchy():
    return Branchy()
"""


def pipeline_spec(tmp_path: Path, monkeypatch, module: str, source: str, factory: str) -> Path:
    """A pipeline spec of `module:factory`, written from `source` into an importable file."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: {factory}\nmodel: {{name: '{module}:{factory}'}}\ndata: {{name: digits}}\n"
        "batch_size: 16\nsteps: 2\ndevice: cpu\n"
        "strategy: {name: pipeline, stages: 2, microbatches: 2}\n"
    )
    return spec


UNTRACEABLE = "cannot be traced on the meta device to place its pipeline stages"


def test_a_model_whose_forward_reads_values_is_refused_for_a_pipeline_at_validate(
    tmp_path: Path, monkeypatch
):
    """The defect: `validate` said valid, then `train` said the model 'cannot take samples of
    shape (1, 8, 8)', which it can (it trains under single). A pipeline places its stages from
    a step traced on the meta device: validate and train both say that is what fails."""
    spec = pipeline_spec(tmp_path, monkeypatch, "branchy_models", DATA_DEPENDENT, "branchy")
    with pytest.raises(UserError, match=UNTRACEABLE):
        api.validate(spec)
    with pytest.raises(UserError, match=UNTRACEABLE) as caught:
        api.train(spec, out_dir=tmp_path / "run")
    assert "cannot take samples" not in str(caught.value)
    single = tmp_path / "single.yaml"
    single.write_text(
        spec.read_text().replace("strategy: {name: pipeline", "strategy: {name: single}\n#")
    )
    api.validate(single)  # the same model passes where nothing is traced


FACTORY_READS_VALUES = """
import torch
from torch import nn


def seeded():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    if model[1].weight.abs().sum() == 0:  # reads a value while it is built
        raise ValueError("all-zero weights")
    return model
"""


def test_a_model_whose_factory_reads_values_is_refused_for_a_pipeline_at_validate(
    tmp_path: Path, monkeypatch
):
    """The defect: `validate` passed a pipeline of a model whose factory (not its forward)
    reads a value, since a factory that cannot run on the meta device is left for train, which
    then refused it. A pipeline traces the factory there too: validate says so; ddp, which
    builds real models, still passes."""
    spec = pipeline_spec(tmp_path, monkeypatch, "seeded_models", FACTORY_READS_VALUES, "seeded")
    with pytest.raises(UserError, match=UNTRACEABLE):
        api.validate(spec)
    with pytest.raises(UserError, match=UNTRACEABLE):
        api.train(spec, out_dir=tmp_path / "run")
    for strategy in ("{name: ddp, workers: 2}", "{name: tensor, degree: 2}"):
        other = tmp_path / "other.yaml"
        other.write_text(
            spec.read_text().replace("{name: pipeline, stages: 2, microbatches: 2}", strategy)
        )
        api.validate(other)  # the factory runs on a real device there


def test_a_pipeline_of_one_stage_trains(tmp_path: Path):
    """The defect: one stage (`compare --strategies pipeline --workers 1`, or `stages: 1`) died
    with a StopIteration traceback: the record written as training starts asked for the slots
    of zero steps."""
    spec = {**LENET, "batch_size": 16, "steps": 2}
    one = parse_spec({**spec, "strategy": {"name": "pipeline", "stages": 1, "microbatches": 2}})
    record = api.train(one, out_dir=tmp_path / "one")
    assert record.status == "completed" and record.pipeline["stages"] == 1
