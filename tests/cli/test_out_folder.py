"""An output folder that cannot be one (a file, a read-only or forbidden place) is refused in
one line, before anything runs."""

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.train.ownership import claim

SPEC = (
    "name: t\nmodel: {name: mlp, kwargs: {hidden: [8]}}\ndata: {name: digits}\n"
    "batch_size: 32\nsteps: 2\n"
)


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("place", "expected"),
    [
        ("file", "{out} is a file, not a folder"),
        ("file/run", "{tmp}/file is a file, not a folder"),
        ("/proc/dlscale-test", "cannot create the folder /proc/dlscale-test"),
    ],
)
def test_train_refuses_an_out_that_cannot_be_a_folder(tmp_path: Path, place: str, expected: str):
    (tmp_path / "file").write_text("not a folder")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    out = tmp_path / place if not place.startswith("/") else Path(place)
    result = invoke("train", spec, "--out", out)
    assert_one_line(result, expected.format(out=out, tmp=tmp_path))
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.parametrize(
    "command",
    [
        ("sweep", "{spec}", "--out", "{out}"),
        ("scale", "{spec}", "--workers", "1", "--steps", "2", "--out", "{out}"),
        ("compare", "{spec}", "--strategies", "ddp", "--workers", "2", "--out", "{out}"),
        ("bench", "matmul", "--sizes", "8", "--out", "{out}"),
        ("bench", "width", "--widths", "8", "--out", "{out}"),
        ("bench", "machine", "--quick", "--no-save", "--out", "{out}"),
    ],
)
def test_every_out_option_refuses_a_file_up_front(tmp_path: Path, command):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "sweep:\n  grid:\n    optimizer.lr: [0.1]\n")
    out = tmp_path / "taken"
    out.write_text("a file")
    result = invoke(*[a.format(spec=spec, out=out) for a in command])
    assert_one_line(result, f"{out} is a file, not a folder")
    assert "measuring" not in result.stdout  # refused before the bench, not after it


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.EROFS, "{out} is on a read-only file system"),
        (errno.EACCES, "{out}: permission denied"),
        (errno.EPERM, "{out}: permission denied"),
        (errno.ENOSPC, "cannot create the folder {out}: no space left on device"),
    ],
)
def test_the_reason_a_folder_cannot_be_made_is_named(tmp_path, monkeypatch, code, expected):
    out = tmp_path / "run"

    def refuse(self, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(UserError) as caught, claim(out):
        pass
    assert expected.format(out=out) in str(caught.value)
    assert "\n" not in str(caught.value)
