"""Models from transformers, as users write them: built from configs with random weights (no
download), traced with nothing allocated, counted against a real CPU forward."""

import json
import os

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.profiler import trace_workload
from dlscale.profiler.target import resolve
from tests.unit.test_profiler import CPU_ATTENTION  # the CPU's fused attention kernel's formula

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")  # in the dev extras: always installed

MODELS = """
import torch
import transformers as t

def gpt2():
    return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500,
                                          n_positions=64, bos_token_id=0, eos_token_id=0))

def llama():
    return t.LlamaForCausalLM(t.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=500, max_position_embeddings=64))

def bert():
    return t.BertForMaskedLM(t.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        vocab_size=500, max_position_embeddings=64))

def vit():
    return t.ViTForImageClassification(t.ViTConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        image_size=32, patch_size=8, num_labels=10))

def t5():
    return t.T5ForConditionalGeneration(t.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=2, d_kv=32,
        vocab_size=500, decoder_start_token_id=0))

def tokens(batch):
    return torch.zeros(batch, 16, dtype=torch.long)

def gpt2_inputs(batch):
    return {"input_ids": torch.zeros(batch, 16, dtype=torch.long),
            "attention_mask": torch.ones(batch, 16, dtype=torch.long)}

def bert_inputs(batch):
    ids = torch.zeros(batch, 16, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, 16, dtype=torch.long),
            "token_type_ids": torch.zeros(batch, 16, dtype=torch.long)}

def t5_inputs(batch):
    ids = torch.zeros(batch, 16, dtype=torch.long)
    return {"input_ids": ids, "decoder_input_ids": ids}

def images(batch):
    return torch.zeros(batch, 3, 32, 32)

class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        if x.sum() > 0:  # a branch on the data's values
            return self.fc(x)
        return self.fc(-x)

def branchy():
    return Branchy()

def words(batch):
    return "a batch of text"
"""


@pytest.fixture
def hf_models(tmp_path, monkeypatch):
    (tmp_path / "hfnets.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import hfnets

    return importlib.reload(hfnets)


CASES = [
    ("gpt2", "tokens"),
    ("llama", "tokens"),
    ("bert", "bert_inputs"),
    ("vit", "images"),
    ("t5", "t5_inputs"),
]


@pytest.mark.parametrize(("model", "inputs"), CASES)
def test_transformers_models_trace_and_count_as_a_real_forward(hf_models, model, inputs):
    batch = 2
    workload = resolve(f"hfnets:{model}", batch_size=batch, inputs=f"hfnets:{inputs}")
    trace = trace_workload(workload)
    torch.manual_seed(0)
    real = getattr(hf_models, model)()
    assert trace.params == sum(p.numel() for p in real.parameters())  # tied weights once
    real.train()
    example = getattr(hf_models, inputs)(batch)
    args, kwargs = ((), example) if isinstance(example, dict) else ((example,), {})
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        real(*args, **kwargs)
    forward = sum(layer.forward.matmul_flops for layer in trace.layers)
    assert forward == counter.get_total_flops()
    assert trace.saved_activation_bytes > 0 and trace.optimizer_state_bytes == 2 * 4 * trace.params
    # Every op the trace saw is one it prices: a fake tensor's metadata queries (prim.device)
    # are not ops, and once counted ~1,000 of them for BERT's mask (its step 1.7× too slow).
    assert "device" not in trace.uncounted_ops, trace.uncounted_ops


def test_gpt2_from_the_cli_with_tokens_and_json(hf_models):
    result = CliRunner().invoke(
        app,
        [
            "profile",
            "hfnets:gpt2",
            "--input-shape",
            "16",
            "--tokens",
            "--json",
            "--hardware",
            "a100-40gb",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"model": "hfnets:gpt2"' in result.stdout


def test_dataflow_maps_gpt2s_conv1d_and_attention_and_says_what_it_leaves_out(hf_models):
    """GPT-2's projections are transformers' Conv1D (x @ W, W as (in, out)); its attention is
    batched products over batch × heads. All of them reach the arrays, from --inputs (ids and
    a mask); the share of the step they leave out is stated, in JSON and in one text line."""
    args = ["profile", "hfnets:gpt2", "--inputs", "hfnets:gpt2_inputs", "--batch", "2"]
    args += ["--hardware", "tpu-v3", "--dataflow", "ws"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    profile = json.loads(result.output)
    (report,) = profile["systolic"]
    gemms: dict[str, list] = {}
    for layer in report["layers"]:
        g = layer["gemm"]
        gemms.setdefault(g["name"], []).append((g["m"], g["k"], g["n"], g["repeats"]))
    tokens, embd, heads, size = 2 * 16, 64, 2, 32
    for block in ("transformer.h.0", "transformer.h.1"):
        for module, (k, n) in {
            "attn.c_attn": (embd, 3 * embd),
            "attn.c_proj": (embd, embd),
            "mlp.c_fc": (embd, 4 * embd),
            "mlp.c_proj": (4 * embd, embd),
        }.items():
            assert gemms[f"{block}.{module} forward: addmm"] == [(tokens, k, n, 1)]
            # its input's and its weight's gradients: each the forward's multiply-adds
            backward = gemms[f"{block}.{module} backward: mm"]
            assert [m * k_ * n_ for m, k_, n_, _ in backward] == [tokens * k * n] * 2
        # Q·Kᵀ and P·V for each of 2 × 2 (batch × heads): 16 × 32 × 16 and 16 × 16 × 32
        forward = []  # bmm twice on the math path, or the fused kernel's Q·Kᵀ and P·V
        for name, found in gemms.items():
            if name.startswith(f"{block}.attn forward"):
                forward += found
        assert sorted(forward) == sorted([(16, size, 16, 2 * heads), (16, 16, size, 2 * heads)])
    assert gemms["lm_head forward: mm"] == [(tokens, embd, 500, 1)]
    totals = profile["totals"]
    matmul = totals["forward_flops"] + totals["backward_flops"]
    assert report["mapped_flops"] == matmul and report["step_flops"] == totals["step_flops"]
    left = report["unmapped"]
    assert left["products"] == {} and left["flops"] == totals["step_flops"] - matmul
    assert left["share"] == pytest.approx(left["flops"] / totals["step_flops"])
    text = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert text.exit_code == 0, text.output
    share = f"{left['share']:.1%} of the step's"
    assert sum(share in line and "not mapped" in line for line in text.output.splitlines()) == 1


def test_failures_name_the_op_and_module_and_data_dependent_flow_is_explained(hf_models):
    with pytest.raises(UserError) as failure:
        trace_workload(resolve("hfnets:vit", inputs="hfnets:tokens"))
    message = str(failure.value)
    assert "cannot take the inputs of hfnets:tokens" in message
    assert "in 'vit.embeddings' (ViTEmbeddings): ValueError: not enough values" in message
    with pytest.raises(UserError) as failure:
        trace_workload(resolve("hfnets:branchy", input_shape=[8]))
    message = str(failure.value)
    expected = "model 'hfnets:branchy' cannot be traced: in '(model)' (Branchy), aten."
    assert message.startswith(expected)
    assert "needs the values of the data" in message and "\n" not in message
    result = CliRunner().invoke(app, ["profile", "hfnets:branchy", "--input-shape", "8"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    with pytest.raises(UserError, match="--inputs hfnets:words returned a str; return a tensor"):
        trace_workload(resolve("hfnets:gpt2", inputs="hfnets:words"))
    with pytest.raises(UserError, match=r"--inputs hfnets:gpt2 failed: TypeError: gpt2\(\)"):
        trace_workload(resolve("hfnets:gpt2", inputs="hfnets:gpt2"))
    with pytest.raises(UserError, match=r"--inputs must look like package\.module:function"):
        resolve("hfnets:gpt2", inputs="tokens")


def test_a_spec_names_the_inputs_and_its_epochs_reach_the_run_figures(hf_models, tmp_path):
    spec = tmp_path / "bert.yaml"
    spec.write_text(
        "name: bert-synthetic\n"
        "model: {name: 'hfnets:bert', inputs: 'hfnets:bert_inputs'}\n"
        "data: {name: synthetic, kind: tokens, task: language_modeling, seq_len: 16,\n"
        "       vocab_size: 500, num_samples: 640}\n"
        "batch_size: 8\nsteps: 150\n"
    )
    workload = resolve(str(spec))
    assert workload.inputs_label == "hfnets:bert_inputs"
    assert workload.epochs == 3  # 150 steps of 8 over ~576 training samples: 72 a epoch
    trace = trace_workload(workload)
    assert trace.batch_size == 8 and trace.input_shape == [16]
    bad = tmp_path / "bad.yaml"
    bad.write_text(spec.read_text().replace("hfnets:bert_inputs", "not a reference"))
    result = CliRunner().invoke(app, ["profile", str(bad)])
    assert result.exit_code == 2 and "model.inputs" in result.output
