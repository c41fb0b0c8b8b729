"""The Python API's page (docs/api.md) keeps up with the code: every public function of
dlscale.api and its public modules has a docstring and is named on the page under its module's
heading, and the page names no function those modules lack."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import dlscale.api

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# Every module of dlscale/api/ is public but these, which serve the verbs (docs/api.md says
# so): a new module is held to the page as soon as it exists.
SERVING = {"capacity", "rundir"}
MODULES = ["dlscale.api"] + [
    f"dlscale.api.{info.name}"
    for info in pkgutil.iter_modules(dlscale.api.__path__)
    if info.name not in SERVING
]


def public_functions(name: str) -> dict[str, object]:
    """The functions a module defines itself, without a leading underscore."""
    module = importlib.import_module(name)
    return {
        attr: value
        for attr, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == name and not attr.startswith("_")
    }


def sections() -> dict[str, str]:
    """The page's prose (outside code blocks: examples call other things) under each
    `## \\`dlscale.api...\\`` heading, by module name."""
    found, current, fenced = {}, None, False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = re.fullmatch(r"## `(dlscale\.api(?:\.\w+)?)`", line)
        if heading:
            current = heading.group(1)
            found[current] = ""
        elif line.startswith("## "):
            current = None
        elif current is not None:
            found[current] += line + "\n"
    return found


def named(text: str) -> set[str]:
    """Functions the text names as code: a code span that begins `name(`."""
    return set(re.findall(r"`(\w+)\(", text))


def test_the_page_has_a_section_for_each_module():
    assert sorted(sections()) == sorted(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_every_public_function_has_a_docstring(module: str):
    missing = [name for name, f in public_functions(module).items() if not inspect.getdoc(f)]
    assert missing == []


@pytest.mark.parametrize("module", MODULES)
def test_every_public_function_is_on_the_page_under_its_module(module: str):
    functions = set(public_functions(module))
    on_page = named(sections()[module])
    assert functions - on_page == set(), "add these to docs/api.md"
    stale = on_page - functions
    assert stale == set(), "docs/api.md names functions this module does not have"


def test_all_lists_the_verbs_of_the_package_module():
    assert sorted(dlscale.api.__all__) == sorted(public_functions("dlscale.api"))
