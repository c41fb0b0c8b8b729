"""`dlscale profile` and `dlscale estimate` as a person runs them."""

import json
from pathlib import Path

from typer.testing import CliRunner

from dlscale.cli.main import app
from tests.conftest import EXAMPLES

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_profile_json_schema_for_a_zoo_model():
    result = run("profile", "lenet", "--batch", "16", "--hardware", "a100-40gb,i7-7700k", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "dlscale.profile/1" and data["batch_size"] == 16
    assert data["totals"]["params"] == 41_282
    assert data["totals"]["forward_flops"] == 2 * data["totals"]["forward_macs"]
    names = [layer["name"] for layer in data["layers"]]
    assert names[:3] == ["conv1", "relu1", "pool1"] and names[-1] == "(loss)"
    conv1 = data["layers"][0]
    assert conv1["working_set_bytes"] == (
        conv1["input_bytes"] + conv1["output_bytes"] + conv1["weight_bytes"]
    )
    memory = data["totals"]["memory"]
    assert memory["total_bytes"] == sum(
        memory[k]
        for k in (
            "weights_bytes",
            "gradients_bytes",
            "optimizer_state_bytes",
            "activations_bytes",
            "batch_bytes",
        )
    )
    devices = {hw["name"]: hw for hw in data["hardware"]}
    assert set(devices) == {"a100-40gb", "i7-7700k"}
    a100 = devices["a100-40gb"]
    assert a100["fits"] and a100["step_s"] > 0 and a100["h2d_s"] > 0
    assert devices["i7-7700k"]["h2d_s"] == 0  # a CPU trains from its own memory


def test_a_gpu_beats_a_cpu_on_a_real_network_and_idles_on_a_tiny_one():
    """Large layers run at the GPU's FLOP/s; tiny ones only pay its per-kernel launch cost."""

    def hardware(model, batch):
        args = ["profile", model, "--batch", batch, "--hardware", "a100-40gb,i7-7700k", "--json"]
        return {hw["name"]: hw for hw in json.loads(run(*args).stdout)["hardware"]}

    resnet = hardware("resnet18", 64)
    assert resnet["a100-40gb"]["step_s"] * 20 < resnet["i7-7700k"]["step_s"]
    lenet = hardware("lenet", 4)["a100-40gb"]
    bounds = [layer["bound"] for layer in lenet["layers"] if layer["bound"] != "none"]
    assert bounds.count("overhead") == len(bounds) == 12  # 13 rows; flatten is only a view
    assert any("launch overhead dominates" in note for note in lenet["advice"])


def test_profile_table_and_plots(tmp_path: Path):
    result = run("profile", "gpt", "--batch", "4", "--hardware", "h100-sxm", "--plot", tmp_path)
    assert result.exit_code == 0, result.output
    assert "per layer" in result.stdout and "h100-sxm" in result.stdout
    for name in ("working_set.png", "memory.png", "roofline.png", "step_time.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name


def test_profile_a_spec_file_takes_its_settings():
    result = run("profile", EXAMPLES / "gpt-synthetic.yaml", "--hardware", "l4", "--json")
    data = json.loads(result.stdout)
    assert data["batch_size"] == 32 and data["optimizer"] == "adamw"
    assert data["dataset_size"] == 1638 and data["hardware"][0]["steps_per_epoch"] == 51


def test_a_model_too_big_for_a_device_is_told_to_split():
    """A 1.5-billion-parameter GPT (GPT-2 XL's shape) with Adam needs ~24 GB before activations."""
    gpt_xl = '{"n_layer": 48, "d_model": 1600, "n_head": 25, "vocab_size": 50257}'
    args = ["profile", "gpt", "--kwargs", gpt_xl, "--batch", "1", "--hardware", "gtx-1080,h100-sxm"]
    hardware = json.loads(run(*args, "--json").stdout)["hardware"]
    gtx, h100 = hardware
    assert not gtx["fits"] and gtx["max_batch"] == 0
    assert "split it across ≥ 4 devices" in gtx["advice"][0] and "pipeline" in gtx["advice"][0]
    assert h100["fits"] and h100["max_batch"] > 1


def test_lstm_advice_is_about_bandwidth_only_where_the_lstm_is_memory_bound():
    """At batch 256 the LSTM's small products are memory-bound on a desktop CPU; on a V100 the
    same layers are launch-bound, and the bandwidth note (given for any LSTM before) is absent."""
    hardware = "v100-sxm2-16gb,i7-7700k"
    out = run("profile", "lstm", "--batch", "256", "--hardware", hardware, "--json").stdout
    v100, i7 = json.loads(out)["hardware"]
    assert "lstm" in i7["memory_bound_layers"] and "lstm" not in v100["memory_bound_layers"]
    assert any("recurrent layers (lstm) are memory-bound" in note for note in i7["advice"])
    assert not any("memory bandwidth" in note for note in v100["advice"])
    assert any("launch overhead dominates" in note for note in v100["advice"])


def test_profile_bad_inputs_are_one_line_exit_2():
    cases = [
        (["profile", "lenet", "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'"),
        (["profile", "lenet", "--input-shape", "1,8,8"], "cannot take samples of shape (1, 8, 8)"),
        (["profile", "lenet", "--input-shape", "a,b"], "--input-shape: 'a' is not an integer"),
        (["profile", "nosuch"], "unknown model 'nosuch'"),
        (["profile", "lenet", "--precision", "fp8"], "--precision must be"),
        (["profile", "lenet", "--kwargs", "{bad"], "--kwargs is not valid JSON"),
        (["profile", "missing.yaml"], "spec file not found"),
        (["profile", "mymodels:build"], "cannot import module 'mymodels'"),
    ]
    for args, expected in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


def test_estimate_measures_and_extrapolates(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path))  # no `local` entry: measurement only
    result = run(
        "estimate", EXAMPLES / "mlp-digits.yaml", "--steps", "5", "--warmup", "2", "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["steps_measured"] == 5 and data["total_steps"] == 20 * 22
    assert data["step_s_p10"] <= data["step_s_median"] <= data["step_s_p90"]
    expected = data["setup_s"] + 440 * data["step_s_median"] + 20 * data["eval_s"]
    assert abs(data["total_s"] - expected) < 1e-9 and data["predicted_step_s"] is None


def test_estimate_shows_the_roofline_when_this_machine_was_measured(tmp_path: Path, monkeypatch):
    from dlscale.hardware.catalogue import save_local
    from dlscale.hardware.device import Hardware

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path))
    save_local(
        Hardware(
            name="local",
            display_name="this machine",
            kind="cpu",
            vendor="test",
            peak_flops={"fp32": 100e9},
            memory_bytes=8 * 2**30,
            memory_bandwidth_bytes_per_s=20e9,
            compute_efficiency=1.0,
            memory_efficiency=1.0,
            op_overhead_s=3e-6,
        )
    )
    args = ["estimate", EXAMPLES / "mlp-digits.yaml", "--steps", "4", "--warmup", "1"]
    data = json.loads(run(*args, "--json").stdout)
    assert data["predicted_step_s"] > 0
    assert data["ratio"] == data["predicted_step_s"] / data["step_s_median"]
    table = run(*args)
    assert table.exit_code == 0 and "roofline / measured step time" in table.stdout


def test_devices_over_every_catalogue_entry_scale_those_with_a_link_and_name_the_rest():
    """The defect: `--hardware all --devices 1,2` stopped at the first CPU entry (no
    interconnect or host link). Those are left out of the scaling, named with why; a device
    asked for alone with no link is still one line."""
    result = run("profile", "mlp", "--hardware", "a100-40gb,i7-7700k", "--devices", "1,2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [report["hardware"] for report in data["scaling"]] == ["a100-40gb"]
    assert list(data["scaling_skipped"]) == ["i7-7700k"]
    assert "no interconnect or host link" in data["scaling_skipped"]["i7-7700k"]
    table = run("profile", "mlp", "--hardware", "a100-40gb,i7-7700k", "--devices", "1,2")
    assert table.exit_code == 0, table.output
    assert "not scaled: i7-7700k" in " ".join(table.output.split())
    alone = run("profile", "mlp", "--hardware", "i7-7700k", "--devices", "1,2")
    assert alone.exit_code == 2 and "no interconnect or host link" in alone.output


def test_a_spec_refuses_the_model_options_it_decides_itself():
    """The defect: with a spec, --kwargs and --tokens were silently ignored (the spec's model
    profiled), while --input-shape was refused."""
    spec = EXAMPLES / "lenet-digits.yaml"
    kwargs = run("profile", spec, "--kwargs", '{"num_classes": 5}', "--hardware", "a100-40gb")
    assert kwargs.exit_code == 2, kwargs.output
    assert "--kwargs" in kwargs.output and "model.kwargs" in kwargs.output
    tokens = run("profile", spec, "--tokens", "--hardware", "a100-40gb")
    assert tokens.exit_code == 2 and "--tokens" in tokens.output


def test_input_shape_takes_x_between_sizes_and_names_a_bad_part():
    """The defect: every x became a comma, so `3,x` said `'' is not an integer`."""
    bad = run("profile", "resnet18", "--input-shape", "3,x", "--hardware", "a100-40gb")
    assert bad.exit_code == 2 and "'x' is not an integer" in bad.output, bad.output
    good = run("profile", "mlp", "--input-shape", "1x8x8", "--hardware", "a100-40gb", "--json")
    assert good.exit_code == 0 and json.loads(good.stdout)["input_shape"] == [1, 8, 8]


def test_a_global_batch_past_the_epoch_has_no_epoch_time_or_cost():
    """The defect: a point whose global batch passed the data set was priced as a one-step
    epoch (one device's rows, and `--dataset-size` under one batch, are refused or floored)."""
    args = ["profile", "lenet", "--batch", "32", "--hardware", "a100-40gb", "--devices", "1,8"]
    args += ["--dataset-size", "100", "--strategies", "ddp"]
    result = run(*args, "--json", "--deadline", "1h")
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["scaling"]
    one, eight = report["points"]
    assert one["steps_per_epoch"] == 3 and one["epoch_s"] == 3 * one["step_s"]
    assert eight["global_batch"] == 256 and eight["steps_per_epoch"] == 0
    assert eight["epoch_s"] is None and eight["cost_epoch"] is None and eight["run_s"] is None
    assert report["pick"]["devices"] == 1
    text = " ".join(run(*args).output.split())
    assert "no full step in an epoch of 100 samples: 8 × ddp (global batch 256)" in text


def test_devices_over_nodes_name_the_network_between_them():
    """The defect: with --nodes and --network the header and JSON named only the link within a
    node, though the row was bound by the network."""
    args = ["profile", "resnet50", "--hardware", "h100-sxm", "--devices", "32", "--nodes", "4"]
    args += ["--network", "eth-10g", "--strategies", "ddp"]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["scaling"]
    assert report["nodes"] == 4 and report["network"]["name"] == "eth-10g"
    assert report["link"]["name"] == "nvlink4"
    text = " ".join(run(*args).output.split())
    assert "between 4 nodes over" in text and "10" in text


def test_estimate_says_how_many_steps_warmed_up_and_when_it_timed_past_the_run(tmp_path):
    """The defect: `--warmup 0` printed `after a warm-up`, and timing more steps than the whole
    run has went unsaid."""
    spec = tmp_path / "short.yaml"
    spec.write_text((EXAMPLES / "mlp-digits.yaml").read_text().replace("epochs: 20", "steps: 6"))
    cold = " ".join(run("estimate", spec, "--steps", "8", "--warmup", "0").output.split())
    assert "measured 8 steps with no warm-up" in cold, cold
    assert "more than the whole run's 6" in cold
    warm = run("estimate", spec, "--steps", "3", "--warmup", "2", "--json")
    assert warm.exit_code == 0 and json.loads(warm.stdout)["warmup_steps"] == 2
    text = " ".join(run("estimate", spec, "--steps", "3", "--warmup", "2").output.split())
    assert "measured 3 steps after 2 warm-up steps" in text and "whole run's" not in text


def test_a_device_without_the_asked_precision_says_it_ran_at_another():
    """The defect: `--precision bf16` on a V100 (no bf16 units) was timed at fp32's rate with
    only the JSON saying so, and its does-not-fit advice offered bf16 activations."""
    args = ["profile", "resnet50", "--hardware", "v100-sxm2-16gb,a100-40gb"]
    text = " ".join(run(*args, "--batch", "64", "--precision", "bf16").output.split())
    assert "v100-sxm2-16gb: no bf16 peak in its entry: its matrix products are timed at" in text
    assert "a100-40gb: no bf16 peak" not in text
    advice = " ".join(run(*args, "--batch", "256").output.split())
    v100 = next(line for line in advice.split("v100-sxm2-16gb: ") if "does not fit" in line)
    assert "fp16 activations" in v100 and "bf16" not in v100.split("does not fit")[1][:200]


TWO_INPUTS = """
import torch


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 8), torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x, y):
        return self.out(torch.relu(self.a(x) + self.b(y)))


def two():
    return Two()


def two_inputs(batch):
    return (torch.zeros(batch, 16), torch.zeros(batch, 4))
"""


def test_a_model_of_two_inputs_shows_both(tmp_path, monkeypatch):
    """The defect: the header said `input (16,)` for a forward taking (16,) and (4,)."""
    (tmp_path / "twonets.py").write_text(TWO_INPUTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["profile", "twonets:two", "--inputs", "twonets:two_inputs", "--batch", "5"]
    args += ["--hardware", "a100-40gb"]
    data = json.loads(run(*args, "--json").stdout)
    assert data["input_shapes"] == [[16], [4]] and data["input_shape"] == [16]
    assert "inputs (16,), (4,)" in " ".join(run(*args).output.split())


def test_small_messages_say_the_right_thing(tmp_path, monkeypatch):
    """The trial's small ones: 'returned a int', a zero deadline called no duration, a near
    miss of a device name without a suggestion, a hardware file that is a device said to be
    missing, and one that is not UTF-8 read as a traceback through the links."""
    (tmp_path / "badinputs.py").write_text("def five(batch):\n    return 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["profile", "mlp", "--hardware", "a100-40gb"]
    said = run(*args, "--inputs", "badinputs:five").output
    assert "returned an int" in said, said
    deadline = run(*args, "--devices", "2", "--dataset-size", "1000", "--deadline", "0s")
    assert deadline.exit_code == 2 and "must be a positive duration" in deadline.output
    near = run("hardware", "show", "h100")
    assert near.exit_code == 2 and "did you mean" in near.output and "h100-sxm" in near.output
    device = run(*args, "--hardware-file", "/dev/null")
    assert device.exit_code == 2 and "not a regular file" in device.output, device.output
    (tmp_path / "latin1.toml").write_bytes(b"# caf\xe9\n")
    binary = run("hardware", "links", "--hardware-file", tmp_path / "latin1.toml")
    assert binary.exit_code == 2 and "cannot read hardware file" in binary.output, binary.output


def test_plots_replace_only_plots_profile_wrote(tmp_path: Path):
    """The defect: `--plot DIR` replaced a file of the user's named like a plot
    (roofline.png) without a word. Plots a profile wrote there may be replaced by the next."""
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "roofline.png").write_text("keep")
    args = ["profile", "lenet", "--hardware", "a100-40gb", "--plot", folder]
    refused = run(*args)
    assert refused.exit_code == 2 and "roofline.png" in refused.output, refused.output
    assert (folder / "roofline.png").read_text() == "keep"
    assert sorted(p.name for p in folder.iterdir()) == ["roofline.png"]  # nothing written
    from PIL import Image

    Image.new("L", (2, 2)).save(folder / "roofline.png")  # a PNG of the user's own
    assert run(*args).exit_code == 2 and len(list(folder.iterdir())) == 1
    (folder / "roofline.png").unlink()
    (folder / "scaling.png").write_text("mine")  # no --devices: no scaling plot is written
    assert run(*args).exit_code == 0
    again = run(*args)  # its own plots, replaced
    assert again.exit_code == 0, again.output
    assert (folder / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    assert (folder / "scaling.png").read_text() == "mine"
    assert run(*args, "--devices", "2").exit_code == 2  # now it would be


def test_an_epoch_of_fewer_samples_than_an_accumulated_step_is_refused(tmp_path):
    """As for a batch: with accumulate: 4 an optimizer step takes 4 × 32 samples, and an epoch
    of 100 has none (it was priced at 0 s and $0)."""
    spec = tmp_path / "accumulate.yaml"
    spec.write_text((EXAMPLES / "mlp-digits.yaml").read_text() + "accumulate: 4\n")
    args = ["profile", spec, "--hardware", "a100-40gb", "--batch", "32"]
    short = run(*args, "--dataset-size", "100")
    assert short.exit_code == 2 and "fewer than one step" in short.output, short.output
    assert run(*args, "--dataset-size", "128").exit_code == 0


def test_a_v100_too_small_for_the_model_is_offered_fp16():
    """The same defect as the does-not-fit advice, in its sibling for a model whose state
    alone passes the device: it offered bf16 on a V100."""
    kwargs = '{"n_layer": 24, "d_model": 2048, "n_head": 16, "vocab_size": 50304, '
    kwargs += '"context_length": 256}'
    args = ["profile", "gpt", "--kwargs", kwargs, "--input-shape", "256", "--tokens"]
    text = " ".join(run(*args, "--hardware", "v100-sxm2-16gb", "--batch", "1").output.split())
    assert "optimizer state alone need" in text
    assert "an optimizer with less state, fp16)" in text and "bf16" not in text


def test_bench_batch_refuses_a_spec_in_its_own_words():
    """`bench batch --model SPEC` said `spec: name: String should match pattern` (the spec's
    path put in a name), then, after --kwargs was refused with a spec, named --kwargs, which
    was not given."""
    said = run("bench", "batch", "--model", EXAMPLES / "lenet-digits.yaml", "--batches", "8")
    assert said.exit_code == 2 and "not a spec" in said.output and "--kwargs" not in said.output
