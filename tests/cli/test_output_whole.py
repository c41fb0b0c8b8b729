"""Output piped or redirected has no window to fit: every table prints whole, no cell cut."""

import io

from rich.table import Table
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.tables import output_console


def wide_table() -> Table:
    table = Table(title="wide")
    for column in ("device", "figure", "another figure", "a third figure", "and a fourth"):
        table.add_column(column)
    table.add_row(
        "a-very-long-device-name-h100-sxm", "1,234,567.89", "2.5 GiB", "30.1 ms", "x" * 40
    )
    return table


def test_a_table_to_a_file_is_as_wide_as_it_needs_and_the_console_keeps_its_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = output_console(file=out, width=40)
    console.print(wide_table())
    console.print("a paragraph after it wraps at the console's width as before " * 2)
    text = out.getvalue()
    assert "…" not in text and "a-very-long-device-name-h100-sxm" in text and "x" * 40 in text
    assert console.width == 40


def test_the_hardware_catalogue_and_an_inference_table_are_whole_in_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    runner = CliRunner()
    listed = runner.invoke(app, ["hardware", "list"])
    assert listed.exit_code == 0 and "…" not in listed.stdout
    assert "a100-40gb" in listed.stdout and "h100-sxm" in listed.stdout
    inference = runner.invoke(
        app,
        [
            "profile",
            "lenet",
            "--batch",
            "32",
            "--hardware",
            "h100-sxm,a100-40gb,k80",
            "--precision",
            "int8",
            "--inference",
        ],
    )
    assert inference.exit_code == 0, inference.output
    assert "…" not in inference.stdout
    assert all(name in inference.stdout for name in ("h100-sxm", "a100-40gb", "k80"))


def test_a_table_with_prose_wraps_its_prose_and_cuts_no_word(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = output_console(file=out, width=60)
    table = Table(title="notes")
    table.add_column("name", no_wrap=True)
    table.add_column("notes")
    table.add_row("a-device-with-a-long-name", "a long paragraph of notes " * 20)
    console.print(table)
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue() and "a-device-with-a-long-name" in out.getvalue()
    assert max(len(line) for line in lines) <= 200  # wrapped, not one 500-column line
    assert sum("notes" in line for line in lines) > 2


def test_a_width_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    output_console(file=out).print(wide_table())
    assert max(len(line) for line in out.getvalue().splitlines()) <= 40
