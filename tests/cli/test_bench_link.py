"""`dlscale bench link`: what it measures is tested on the two-host testbed (tests/cluster);
here, that each way to ask wrongly is one line and a usage exit, before anything is measured,
and that a saved link reads back as the catalogue's links do."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.api.bench import link_name, save_link
from dlscale.cli.main import app
from dlscale.hardware.links import load_links


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--cluster", "local"], "measures between two hosts of a cluster"),
        (["--address", "127.0.0.1:1"], "does not answer"),
        (["--address", "nonsense"], "must be 'auto' or HOST:PORT"),
    ],
)
def test_asking_wrongly_is_one_line(argv: list[str], says: str, tmp_path: Path):
    result = CliRunner().invoke(app, ["bench", "link", *argv, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3  # the one line, however it wraps
    assert not (tmp_path / "o").exists()


def test_a_saved_link_reads_back_and_scale_finds_it(tmp_path: Path, monkeypatch):
    from dlscale.api.experiments import saved_cluster_link

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path))
    assert saved_cluster_link() is None
    fit = {"bytes_per_s": 11.8e6, "latency_s": 210e-6, "fit_max_error": 0.04, "timed": {}}
    result = {
        "hosts": ["10.0.0.1", "10.0.0.2"],
        "allreduce": fit,
        "p2p": {**fit, "bytes_per_s": 12.1e6, "latency_s": 95e-6},
        "name": link_name(["10.0.0.2", "10.0.0.1"]),
    }
    path = save_link(result)
    assert path == tmp_path / "hardware" / "link-10.0.0.1-10.0.0.2.toml"
    link = load_links()["link-10.0.0.1-10.0.0.2"]
    assert (link.bytes_per_s, link.latency_s, link.kind) == (11.8e6, 210e-6, "ethernet")
    assert "12.1 MB/s" in link.notes
    assert saved_cluster_link() == link
