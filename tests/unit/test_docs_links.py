"""The docs stay a true map: every relative link in README.md and docs/ reaches a file that
exists (and a heading that exists, for a `#anchor`), every file they name in code (`tests/...`,
`train/step.py`) exists, README links every docs page, and the architecture page names every
package of the source tree."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dlscale"
PACKAGES = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
FROM_ROOT = ("src/", "tests/", "benchmarks/", "examples/", "deploy/", "docker/", "scripts/")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_with_code(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    return [re.sub(r"`+[^`]*`+", "", line) for line in prose_with_code(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.*)", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")  # GitHub numbers repeats
    return found


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose(path.read_text()) for m in LINK.finditer(line)]


def test_the_slug_is_githubs():
    assert slug("Many devices: `--devices 1,2,4,8`") == "many-devices---devices-1248"
    assert slug("`run.json`") == "runjson"
    assert slug("Does it fit, and how long?") == "does-it-fit-and-how-long"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page: Path):
    broken = []
    for target in links(page):
        if SCHEME.match(target):
            continue  # the web: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if ROOT not in file.parents and file != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken


def named_paths(path: Path) -> list[str]:
    """Repository paths named in inline code: `tests/...`, `benchmarks/x.py`, and paths inside
    the package (`train/step.py`, `strategies/*/section.py`, `service/routes/`)."""
    found = []
    for line in prose_with_code(path.read_text()):
        for span in re.findall(r"`([^`]+)`", line):
            for word in span.split():
                word = re.sub(r"\.py:[\w.]+$", ".py", word.rstrip(",;:)"))  # file.py:Name
                if word.startswith(FROM_ROOT) or (word.split("/")[0] in PACKAGES and "/" in word):
                    found.append(word)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_named_in_code_exists(page: Path):
    missing = []
    for name in named_paths(page):
        root = ROOT if name.startswith(FROM_ROOT) else SRC
        if not list(root.glob(name.rstrip("/"))):
            missing.append(name)
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_readme_links_every_docs_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_architecture_page_names_every_package():
    text = (ROOT / "docs" / "architecture.md").read_text()
    names = {f"{name}/" for name in PACKAGES}
    names |= {f"{p.stem}.py" for p in SRC.glob("*.py") if not p.stem.startswith("_")}
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"docs/architecture.md does not name {missing}"
