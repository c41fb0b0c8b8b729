"""The profile's tables at 80 and 120 columns and piped (issue 17, point 18): every number whole,
every layer named, the columns left out at a narrow terminal named, nothing left out in a file."""

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dlscale.api.profiling import ProfileRequest, profile, profile_report
from dlscale.cli.main import app
from dlscale.profiler.report import HARDWARE_COLUMNS, LAYER_COLUMNS, to_json
from dlscale.units import binary_bytes, si

HARDWARE = ["a100-40gb", "i7-7700k"]


@pytest.fixture(scope="module")
def resnet():
    """ResNet-18: 60-odd layers, nested names, figures from bytes to giga-FLOPs."""
    return profile(ProfileRequest("resnet18", hardware=tuple(HARDWARE)))


def layer_lines(text: str) -> list[str]:
    """The rows of the per-layer table (between its header rule and its bottom edge)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    return lines[start + 1 : end]


def check_whole(text: str, result) -> None:
    assert "…" not in text
    rows = layer_lines(text)
    layers = to_json(result)["layers"]
    assert len(rows) == len(layers)  # one line a layer: nothing wrapped onto a second line
    for line, layer in zip(rows, layers, strict=True):
        assert layer["name"] in line
        figures = [f"{layer['params']:,}", si(layer["forward_flops"])]
        if " MACs ┃" in text:  # left out first of the three at a narrow terminal
            figures.append(si(layer["forward_macs"]))
        for figure in figures:
            assert f" {figure} │" in line, (figure, line)


@pytest.mark.parametrize("width", [80, 120])
def test_at_a_terminal_columns_are_left_out_not_cut(resnet, width: int):
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    profile_report(resnet, console)
    text = console.file.getvalue()
    check_whole(text, resnet)
    assert max(len(line) for line in text.splitlines()) <= width
    joined = " ".join(text.split())
    assert f"not shown at {width} columns: " in joined and "in, out, weights" in joined
    for row in to_json(resnet)["layers"]:  # the most needed columns stay
        assert binary_bytes(row["saved_bytes"]) in text
    assert "a100-40gb" in text and "874 MiB / 36 GiB" in text


def test_piped_the_tables_are_whole(resnet):
    result = CliRunner().invoke(app, ["profile", "resnet18", "--hardware", ",".join(HARDWARE)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    check_whole(text, resnet)
    header = " ".join(text.split())
    for column in [*LAYER_COLUMNS, *HARDWARE_COLUMNS]:
        assert f" {column.header} ┃" in header, column.header
    assert "not shown" not in text


def test_the_macs_column_counts_the_lectures_way():
    """LeNet's conv1 at batch 1, by hand: 6 × 24 × 24 outputs × (1 × 5 × 5) inputs = 86,400
    MACs, half its FLOPs; the 3,456 bias adds (one per output) are in neither count."""
    profiled = profile(ProfileRequest("lenet", batch_size=1))
    layers = {row["name"]: row for row in to_json(profiled)["layers"]}
    conv1 = layers["conv1"]
    assert conv1["forward_macs"] == 6 * 24 * 24 * 25 and conv1["forward_flops"] == 2 * 86_400
    assert layers["fc1"]["forward_macs"] == 256 * 120
    text = CliRunner().invoke(app, ["profile", "lenet", "--batch", "1"]).stdout
    assert " MACs ┃" in text and " 86.4 k │  173 k │" in text


def test_at_a_narrow_terminal_the_scaling_table_keeps_fits_longest():
    """The defect: at 70 columns the scaling table left out `fits` (does it fit: the first
    question) and kept `bound`."""
    from dlscale.profiler.scaling_report import SCALING_COLUMNS

    keep = {column.header: column.keep for column in SCALING_COLUMNS}
    assert keep["fits"] < min(
        k for header, k in keep.items() if header not in ("devices", "strategy", "fits")
    )
