"""How a command ends on Ctrl-C or SIGTERM: the hint to continue names --resume only where the
command has it."""

import pytest
import typer

from dlscale.cli.errors import user_errors
from dlscale.signals import Terminated


@user_errors
def resumable(resume: bool = False) -> None:
    raise KeyboardInterrupt


@user_errors
def one_shot(steps: int = 1) -> None:
    raise KeyboardInterrupt


@user_errors
def one_shot_terminated() -> None:
    raise Terminated


def ended(command, capsys) -> tuple[int, str]:
    with pytest.raises(typer.Exit) as caught:
        command()
    return caught.value.exit_code, " ".join(capsys.readouterr().err.split())


def test_the_resume_hint_only_where_the_command_resumes(capsys):
    """The defect: `estimate` and `profile` stopped by Ctrl-C said `continue later with
    --resume`, an option they do not have."""
    assert ended(resumable, capsys) == (130, "interrupted: continue later with --resume")
    assert ended(one_shot, capsys) == (130, "interrupted")
    assert ended(one_shot_terminated, capsys) == (143, "terminated (SIGTERM)")
