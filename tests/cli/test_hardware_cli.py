"""`dlscale hardware list/show/links`: the catalogue, its links and prices through the command,
with one-line errors (tests/unit/test_hardware.py and test_links.py check the catalogue itself)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from tests.unit.test_hardware import ENTRY, GIB, REQUIRED_DEVICES, write
from tests.unit.test_links import USER_FILE

runner = CliRunner()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty DLSCALE_HOME per test, so no user file leaks in."""
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_cli_list_json_has_every_device_in_si_units():
    result = runner.invoke(app, ["hardware", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert len(rows) >= 22 and set(rows) >= REQUIRED_DEVICES
    assert rows["a100-40gb"]["peak_flops"]["bf16"] == 312e12
    assert rows["a100-40gb"]["memory_bytes"] == 40 * GIB


def test_cli_list_table_and_hardware_file(tmp_path: Path):
    extra = write(tmp_path / "lab.toml", ENTRY.format(name="lab-gpu", fp32=10))
    result = runner.invoke(app, ["hardware", "list", "--hardware-file", str(extra)])
    assert result.exit_code == 0, result.output
    assert "lab-gpu" in result.stdout and "h100-sxm" in result.stdout


def test_cli_show_prints_every_field_with_sources():
    result = runner.invoke(app, ["hardware", "show", "A100-40GB"])
    assert result.exit_code == 0, result.output
    for text in ("19.5 TFLOP/s", "312 TFLOP/s", "1,555 GB/s", "NVLink", "nvidia.com", "sparsity"):
        assert text in result.stdout, text
    as_json = runner.invoke(app, ["hardware", "show", "tpu-v4", "--json"])
    assert json.loads(as_json.stdout)["peak_flops"]["bf16"] == 275e12


@pytest.mark.parametrize(
    ("name", "expected"),
    [("nope", "unknown hardware 'nope' (known: "), ("local", "dlscale bench machine")],
)
def test_cli_show_unknown_is_one_line_exit_2(name: str, expected: str):
    result = runner.invoke(app, ["hardware", "show", name])
    assert result.exit_code == 2
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_cli_list_and_show_give_each_device_its_link_and_price():
    listed = runner.invoke(app, ["hardware", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["p100-sxm2-16gb"]["link"] == "nvlink1" and rows["l4"]["link"] == "pcie4-x16"
    assert rows["i7-7700k"]["link"] is None and rows["i7-7700k"]["price_per_hour"] is None
    assert rows["p100-sxm2-16gb"]["price_per_hour"] == 1.46
    table = runner.invoke(app, ["hardware", "list"], env={"COLUMNS": "160"})
    assert table.exit_code == 0, table.output
    assert "nvlink1" in table.stdout and "1.46" in table.stdout and "$ per" in table.stdout
    shown = runner.invoke(app, ["hardware", "show", "p100-sxm2-16gb"])
    assert shown.exit_code == 0, shown.output
    assert "$1.46/hour" in shown.stdout and "2019-04" in shown.stdout
    assert "nvlink1 (dlscale hardware links)" in shown.stdout
    cpu = runner.invoke(app, ["hardware", "show", "i7-7700k"]).stdout
    assert "no cloud offer catalogued" in cpu and "No price" in cpu


def test_cli_links_lists_the_catalogue_and_user_links(tmp_path: Path):
    result = runner.invoke(app, ["hardware", "links"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for text in ("nvlink1", "pcie3-x16", "ib-ndr", "eth-400g", "if-mi300x", "ici-v4", "0.65"):
        assert text in result.stdout, text
    assert "[[link]]" in result.stdout  # rich must not eat the TOML table header
    extra = write(tmp_path / "lab.toml", USER_FILE.format(gbs=5))
    as_json = runner.invoke(app, ["hardware", "links", "--json", "--hardware-file", str(extra)])
    rows = {row["name"]: row for row in json.loads(as_json.stdout)}
    assert rows["lab-fabric"]["bytes_per_s"] == 5e9 and rows["nvlink4"]["sources"]
    bad = write(tmp_path / "bad.toml", '[[link]]\nname = "x"\nkind = "warp"\n')
    result = runner.invoke(app, ["hardware", "links", "--hardware-file", str(bad)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_hardware_links_lists_the_catalogue():
    result = CliRunner().invoke(app, ["hardware", "links"])
    assert result.exit_code == 0 and "nvlink1" in result.stdout and "ib-ndr" in result.stdout
    shown = CliRunner().invoke(app, ["hardware", "show", "p100-sxm2-16gb"]).stdout
    assert "$1.46/hour" in shown and "2019-04)" in shown


def shown_rows(stdout: str) -> dict[str, str]:
    """`hardware show`'s table as field -> its value, wrapped lines joined (text only)."""
    rows: dict[str, str] = {}
    field = ""
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if len(cells) != 2:
            continue
        field = cells[0] or field
        rows[field] = f"{rows.get(field, '')} {cells[1]}".strip()
    return rows


def test_cli_show_gives_cores_caches_and_the_figures_that_differ():
    result = runner.invoke(app, ["hardware", "show", "xeon-platinum-8180"])
    assert result.exit_code == 0, result.output
    rows = shown_rows(result.stdout)
    assert rows["cores"] == "28, 56 threads" and rows["L3"] == "38.5 MiB per socket"
    assert rows["L1 data"] == "32 KiB per core" and rows["L2"] == "1,024 KiB per core"
    differs = rows["differs from"]
    assert differs.startswith("clock behind the peak: ours 1.7 GHz AVX-512 base")
    assert "4.48 TFLOP/s" in differs and "specification update 336065" in differs


def test_cli_show_gives_int4_or_says_which_rate_it_falls_back_to():
    a100 = shown_rows(runner.invoke(app, ["hardware", "show", "a100-40gb"]).stdout)
    assert a100["peak int4"] == "1,248 TOP/s" and a100["multiprocessors"] == "108 SMs"
    assert a100["MIG slices"].startswith("a100-40gb:1g.5gb, a100-40gb:1g.10gb")
    h100 = shown_rows(runner.invoke(app, ["hardware", "show", "h100-sxm"]).stdout)
    assert h100["peak int4"] == "— (none catalogued; int4 runs at the int8 rate)"


def test_cli_list_mig_puts_each_slice_under_its_gpu():
    plain = runner.invoke(app, ["hardware", "list", "--json"])
    assert not any(":" in row["name"] for row in json.loads(plain.stdout))
    result = runner.invoke(app, ["hardware", "list", "--mig", "--json"])
    assert result.exit_code == 0, result.output
    names = [row["name"] for row in json.loads(result.stdout)]
    at = names.index("a100-40gb")
    assert names[at + 1 : at + 7] == [
        f"a100-40gb:{p}" for p in ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    ]
    shown = runner.invoke(app, ["hardware", "show", "h100-sxm:1g.10gb", "--json"])
    assert json.loads(shown.stdout)["sm_count"] == 16


def test_a_device_without_a_tdp_says_so_under_its_scaling_table(tmp_path: Path):
    """No `tdp_w` in the entry: the energy column's note says there is none, not "TDP ? W"."""
    extra = write(tmp_path / "lab.toml", ENTRY.format(name="lab-gpu", fp32=10))
    args = ["profile", "lenet", "--batch", "8", "--hardware", "lab-gpu", "--devices", "1,2"]
    result = runner.invoke(app, [*args, "--hardware-file", str(extra)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "no TDP in this device's entry: no energy" in text and "TDP ?" not in text
    catalogued = runner.invoke(app, [*args[:5], "h100-sxm", *args[6:]])
    assert "energy at TDP 700 W (an upper bound)" in " ".join(catalogued.stdout.split())
