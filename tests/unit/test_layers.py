"""The import arrows of DESIGN.md, over every layer: lower layers never import higher ones or
the cluster engines, no module imports itself back; and the formatter owns every line."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dlscale"

# package -> the dlscale modules it may import (besides itself). Every package of the source
# tree is listed (a test below checks it), so a new one must state its place.
# home: where per-user state lives ($DLSCALE_HOME), for every layer (data caches, hardware);
# signals: how a dlscale process stops (SIGTERM as Ctrl-C, with its parent), for the command,
# its workers and their data loaders alike; free_memory: what a new allocation can take now,
# for every layer that refuses work that would not fit (a bench's sizes, synthetic data);
# atomic: writes that land whole or not at all, for every layer that writes files; cgroupfs: the
# kernel's cgroup files, for the service's job cgroups and a bench's memory-limited one; tables:
# a rich table's width whole, for the profiler's fitted tables and the commands' output alike.
BASE = {"dlscale.errors", "dlscale.units", "dlscale.home", "dlscale.__version__"}
BASE |= {"dlscale.signals", "dlscale.free_memory", "dlscale.atomic", "dlscale.cgroupfs"}
BASE |= {"dlscale.tables"}
TRAIN = BASE | {"dlscale.jobspec", "dlscale.models", "dlscale.data", "dlscale.train"}
ALLOWED = {
    "errors": set(),
    "home": set(),
    "units": set(),
    "signals": set(),
    "free_memory": set(),
    "atomic": {"dlscale.errors", "dlscale.signals"},
    "cgroupfs": set(),
    "tables": set(),
    "models": {"dlscale.errors"},
    "data": BASE | {"dlscale.jobspec"},
    "jobspec": BASE,  # errors, and units (byte sizes such as max_memory_per_worker: 512MiB)
    "hardware": BASE,
    "train": TRAIN,
    # Launchers start and supervise processes; they know nothing of training.
    "launch": BASE,
    "profiler": TRAIN | {"dlscale.hardware", "dlscale.profiler"},
    # A bench that times processes (the gloo link between two) starts them as a launcher does.
    "bench": TRAIN | {"dlscale.hardware", "dlscale.profiler", "dlscale.bench", "dlscale.launch"},
    # A strategy is an exchange for the one loop, placed by a launcher; a pipeline plans its
    # split with the profiler on the hardware model.
    "strategies": TRAIN | {"dlscale.launch", "dlscale.profiler", "dlscale.hardware"},
    # Using a trained model: the run's model and reader rebuilt, no training, no processes.
    "infer": TRAIN | {"dlscale.infer"},
    # Serving a model over HTTP: request checks, statistics, routes, the Ray Serve deployment;
    # the model itself comes from the verb that starts it (a Predictor), not from infer.
    "serving": BASE | {"dlscale.serving"},
    # A sweep runs its trials with the strategies, on a launcher's task pool.
    "sweep": TRAIN | {"dlscale.launch", "dlscale.strategies", "dlscale.sweep"},
    # The verbs: everything below them.
    "api": TRAIN
    | {"dlscale.launch", "dlscale.profiler", "dlscale.hardware"}
    | {"dlscale.bench", "dlscale.strategies", "dlscale.sweep", "dlscale.infer"}
    | {"dlscale.serving"},
    # A front door calls the verbs and nothing else; `dlscale serve` runs the service in-process.
    "cli": BASE | {"dlscale.api", "dlscale.service"},
    # The service is a front door like the CLI: its routes and job processes call the verbs
    # (its scheduler stays pure bookkeeping over tenants, slots and specs).
    "service": BASE | {"dlscale.jobspec", "dlscale.api"},
}
# What each layer must not import at all (the train step stays free of the cluster engine).
NEVER = {
    "models": ("ray", "torch.distributed"),
    "train": ("ray",),
    "jobspec": ("torch",),
    "service": ("torch", "ray"),
}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "dlscale":
            found.update(f"dlscale.{alias.name}" for alias in node.names)  # from dlscale import x
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def files_of(package: str) -> list[Path]:
    target = SRC / package
    return sorted(target.rglob("*.py")) if target.is_dir() else [SRC / f"{package}.py"]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_lower_layers_import_only_what_is_below_them(package: str):
    own = f"dlscale.{package}"
    for path in files_of(package):
        for name in imports_of(path):
            if not name.startswith("dlscale") or name.startswith(own):
                continue
            assert any(name.startswith(ok) for ok in ALLOWED[package]), f"{path.name}: {name}"


def test_every_package_has_its_place_in_the_arrows():
    top = {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    top |= {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert top == set(ALLOWED), top ^ set(ALLOWED)


@pytest.mark.parametrize("package", sorted(NEVER))
def test_lower_layers_never_touch_what_is_not_theirs(package: str):
    for path in files_of(package):
        for name in imports_of(path):
            assert not name.startswith(NEVER[package]), f"{path.name} imports {name}"


# The pragmas that keep lines from `ruff format`: fmt skip and off, and yapf's disable.
OPT_OUT = re.compile(r"\b(fmt:\s*(skip|off)|yapf:\s*disable)\b")


def formatter_opt_outs(path: Path) -> list[str]:
    """Where `path` keeps lines from the formatter (in comments: a string may name a pragma)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        f"{path.relative_to(SRC.parents[1])}:{token.start[0]}"
        for token in tokens
        if token.type == tokenize.COMMENT and OPT_OUT.search(token.string)
    ]


def test_the_formatter_owns_every_line_of_the_source():
    """A module is split by its jobs, never squeezed by hand to fit a line count: no line of
    src/, tests/ or benchmarks/ is kept from `ruff format` (`make lint` runs `ruff format
    --check` over all of it)."""
    root = SRC.parents[1]
    paths = [p for folder in ("src", "tests", "benchmarks") for p in (root / folder).rglob("*.py")]
    found = [where for path in sorted(paths) for where in formatter_opt_outs(path)]
    assert not found, found


def module_imports(path: Path) -> set[str]:
    """dlscale modules imported anywhere in the file: at module level, in TYPE_CHECKING blocks
    and inside functions. An import inside a function runs later, so a cycle through one does
    not fail at import time, but it is a cycle all the same: two modules that need each other."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dlscale"):
            for alias in node.names:  # `from dlscale.train import checkpoint` is a module
                child = f"{node.module}.{alias.name}"
                found.add(child if module_path(child) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dlscale"))
    return {name for name in found if module_path(name)}


def module_path(name: str) -> Path | None:
    base = SRC.parent / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_no_module_imports_itself_back():
    """No import cycles between modules, lazy imports included (train/loop.py and
    train/record.py had one; data/convert.py and convert_hf.py, launch/local.py and pool.py
    had one each through an import inside a function)."""
    graph = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = module_imports(path) - {name}
    visiting, done = [], set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, " -> ".join([*visiting[visiting.index(name) :], name])
        visiting.append(name)
        for child in graph.get(name, ()):
            visit(child)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
