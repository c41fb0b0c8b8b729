"""An empty argument is refused before any command runs, in one line (exit 2); the hint that
`.` names the current folder is given only where the option takes a path."""

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["bench", "machine", "--out", ""],
            "--out: an empty value names nothing (for the current folder, give .)",
        ),
        (
            ["bench", "machine", "--out="],
            "--out: an empty value names nothing (for the current folder, give .)",
        ),
        (["profile", "lenet", "--hardware", ""], "--hardware: an empty value names nothing"),
        (["profile", "lenet", "--devices", ""], "--devices: an empty value names nothing"),
        (["profile", "lenet", "--devices="], "--devices: an empty value names nothing"),
        (["hardware", "show", ""], "an empty argument names nothing"),
        (["train", ""], "an empty argument names nothing (for the current folder, give .)"),
    ],
)
def test_an_empty_argument_is_one_line_with_a_hint_only_for_paths(args, expected):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {expected}"]
    assert "Traceback" not in result.output


def test_the_path_options_are_found_in_every_command():
    from typer.main import get_command

    from dlscale.cli.help import path_options

    found = path_options(get_command(app))
    assert {"--out", "--plot", "--hardware-file"} <= found
    assert not {"--devices", "--hardware", "--strategies", "--batch"} & found
