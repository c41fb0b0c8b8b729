"""`--resume` past a corrupt newest checkpoint: it continues from the newest readable one and
says which it skipped and why; with none readable, one line naming each."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.train.checkpoint import checkpoint_path, list_checkpoints, load_checkpoint

SPEC = """
name: corrupt
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
steps: 40
device: cpu
checkpoint: {every_steps: 20, keep_last: 3}
"""


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


@pytest.fixture
def trained(tmp_path: Path) -> tuple[Path, Path]:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "run"
    result = invoke("train", spec, "--out", out)
    assert result.exit_code == 0, result.output
    assert [step for step, _ in list_checkpoints(out)] == [20, 22, 40]  # 20, epoch end, end
    return spec, out


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_so(trained):
    spec, out = trained
    truncate(checkpoint_path(out, 40))
    result = invoke("train", spec, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    said = "".join(result.output.split())  # as printed, wrapped at the terminal's width
    skipped = f"warning: skipped {checkpoint_path(out, 40)}: not a readable dlscale checkpoint"
    assert "".join(skipped.split()) in said and "resumingatstep22" in said
    record = json.loads((out / "run.json").read_text())
    assert record["resumed_from_step"] == 22 and record["status"] == "completed"
    assert any("skipped" in warning for warning in record["warnings"])
    assert load_checkpoint(checkpoint_path(out, 40))["step"] == 40  # written again, whole
    # Set aside, not deleted: pruning keeps the newest K by step and must not keep a broken one.
    assert (out / "checkpoints" / "step-00000040.pt.unreadable").is_file()


def test_resume_with_no_readable_checkpoint_is_one_line_naming_each(trained):
    spec, out = trained
    for _, path in list_checkpoints(out):
        truncate(path)
    result = invoke("train", spec, "--out", out, "--resume")
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert f"nothing to resume: no readable checkpoint in {out / 'checkpoints'}" in result.stderr
    for step in (20, 22, 40):
        assert str(checkpoint_path(out, step).name) in result.stderr


# ------------------------------------------------- issue 34, point 3: flipped bytes that load


def flip_weight_bytes(path: Path) -> None:
    """Flip a few bytes inside the largest weight's data: the file still unpickles (torch does
    not check the zip's CRCs), but its weights are not the ones that were saved."""
    state = torch.load(path, weights_only=True)
    largest = max(state["model"].values(), key=lambda tensor: tensor.numel())
    raw = largest.contiguous().numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(raw[:64])
    assert at > 0, "the weight's bytes were not found in the file"
    for offset in (100, 101, 102):
        data[at + offset] ^= 0xFF
    path.write_bytes(bytes(data))
    torch.load(path, weights_only=True)  # still loads: only a digest tells


def test_a_checkpoint_whose_bytes_flipped_is_refused_by_its_digest(trained):
    _, out = trained
    path = checkpoint_path(out, 40)
    flip_weight_bytes(path)
    with pytest.raises(UserError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (
        f"{path}: corrupt: its contents do not match the sha256 digest saved with it"
    )


def test_resume_skips_a_checkpoint_with_flipped_bytes_and_says_so(trained):
    spec, out = trained
    flip_weight_bytes(checkpoint_path(out, 40))
    result = invoke("train", spec, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    said = "".join(result.output.split())
    skipped = (
        f"warning: skipped {checkpoint_path(out, 40)}: corrupt: its contents do not match the "
        "sha256 digest saved with it; resuming from step-00000022.pt instead"
    )
    assert "".join(skipped.split()) in said and "resumingatstep22" in said
    record = json.loads((out / "run.json").read_text())
    assert record["resumed_from_step"] == 22 and record["status"] == "completed"
    assert (out / "checkpoints" / "step-00000040.pt.unreadable").is_file()
    assert load_checkpoint(checkpoint_path(out, 40))["step"] == 40  # written again, whole


def test_a_checkpoint_from_before_digests_still_resumes_with_a_note(trained):
    spec, out = trained
    path = checkpoint_path(out, 40)
    state = torch.load(path, weights_only=True)
    older = {key: value for key, value in state.items() if key != "sha256"}
    torch.save({**older, "format": 1}, path)  # as dlscale wrote them before digests
    assert load_checkpoint(path)["step"] == 40
    result = invoke("train", spec, "--out", out, "--resume")
    assert result.exit_code == 0, result.output
    said = "".join(result.output.split())
    note = f"{path} has no digest (written before dlscale saved one): loaded unchecked"
    assert "".join(note.split()) in said
    record = json.loads((out / "run.json").read_text())
    assert record["resumed_from_step"] == 40 and any("no digest" in w for w in record["warnings"])


def test_a_digest_is_checked_even_when_the_format_says_there_is_none(trained):
    """A flipped byte may land on `format` itself (2 becomes 1): a file that holds a digest is
    checked against it whatever its format says."""
    _, out = trained
    path = checkpoint_path(out, 40)
    state = torch.load(path, weights_only=True)
    state["step"] = 41  # its contents changed ...
    torch.save({**state, "format": 1}, path)  # ... and its format reads "before digests"
    with pytest.raises(UserError, match="do not match the sha256 digest"):
        load_checkpoint(path)
