"""`dlscale serve-model` refuses bad options and runs in one line and exit 2, before Ray starts
(the end-to-end test with a server is tests/integration/test_serve_model.py)."""

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.jobspec import parse_spec
from tests.small_runs import SGD, base_spec

runner = CliRunner()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """An MLP trained for one step on 64 synthetic feature vectors: a run to serve."""
    data = {"name": "synthetic", "shape": [8], "num_samples": 64}
    spec = base_spec("serve-cli", data, {"name": "mlp"}, batch_size=32, steps=1, optimizer=SGD)
    record = api.train(
        parse_spec({**spec, "device": "cpu"}), out_dir=tmp_path_factory.mktemp("r") / "run"
    )
    return Path(record.run_dir)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--replicas", "0"], "--replicas 0: at least 1"),
        (["--replicas", "2", "--max-replicas", "1"], "--max-replicas 1 is below --replicas 2"),
        (["--max-batch-size", "0"], "--max-batch-size 0: choose 1..256"),
        (["--batch-wait-ms", "-1"], "--batch-wait-ms -1.0: choose 0..1000"),
        (["--port", "70000"], "--port 70000"),
        (["--device", "cuda:1"], "--device cuda:1: choose one of auto, cpu, cuda"),
        (["--device", "cuda", "--precision", "int8"], "int8 runs on the CPU only"),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, flags: list[str], says: str):
    result = runner.invoke(app, ["serve-model", str(tmp_path), *flags])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path: Path):
    result = runner.invoke(app, ["serve-model", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "nowhere" in result.output


def test_a_port_in_use_is_one_line_before_ray(tmp_path: Path, trained_run: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve-model", str(trained_run), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("content", "says"), [(None, "cannot read it"), ("x", "a token of 1 characters")]
)
def test_a_bad_token_file_is_one_line_before_ray(
    tmp_path: Path, trained_run: Path, content: str | None, says: str
):
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    flags = ["--port", str(free_port()), "--token-file", str(token_file)]
    result = runner.invoke(app, ["serve-model", str(trained_run), *flags])
    assert result.exit_code == 2, result.output
    assert f"--token-file {token_file}: {says}" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this Python")
def test_an_ipv6_port_in_use_is_one_line_with_the_address_in_brackets(trained_run: Path):
    with socket.socket(socket.AF_INET6) as taken:
        try:
            taken.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback on this machine")
        port = taken.getsockname()[1]
        result = runner.invoke(
            app, ["serve-model", str(trained_run), "--host", "::1", "--port", str(port)]
        )
    assert result.exit_code == 2, result.output
    assert f"cannot listen on [::1]:{port}: Address already in use" in result.output


def test_a_stop_while_the_model_deploys_ends_as_a_stop_later_does(monkeypatch, tmp_path: Path):
    """SIGTERM (or Ctrl-C) before serve_model returned (its /health can answer first) ended the
    command with train's "continue later with --resume" and 143; it is the stop the command
    is meant to end by, whenever it comes."""
    from dlscale.cli import serve_model as command
    from dlscale.signals import Terminated

    def interrupted(run, options):
        raise Terminated

    monkeypatch.setattr(command, "serve_model", interrupted)
    result = runner.invoke(app, ["serve-model", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "stopped while Ray Serve started the model" in result.output
    assert "--resume" not in result.output
