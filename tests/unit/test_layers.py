"""The import arrows of DESIGN.md: lower layers never import higher ones or the cluster engines."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dlscale"

# package -> the dlscale modules it may import (besides itself)
BASE = {"dlscale.errors", "dlscale.units"}
TRAIN = BASE | {"dlscale.spec", "dlscale.models", "dlscale.data", "dlscale.train"}
ALLOWED = {
    "models": {"dlscale.errors"},
    "data": {"dlscale.errors", "dlscale.spec"},
    "spec": BASE,  # errors, and units (byte sizes such as max_memory_per_worker: 512MiB)
    "hardware": BASE | {"dlscale.train.files"},
    "train": TRAIN,
    "profiler": TRAIN | {"dlscale.hardware", "dlscale.profiler"},
    "bench": TRAIN | {"dlscale.hardware", "dlscale.profiler", "dlscale.bench"},
    # A sweep runs its trials with the strategies, on a launcher's task pool.
    "sweep": TRAIN | {"dlscale.launch", "dlscale.strategies", "dlscale.sweep"},
}
NEVER_IN_MODELS = ("ray", "torch.distributed")


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


def test_models_never_touch_cluster_engines():
    for path in files_of("models"):
        for name in imports_of(path):
            assert not name.startswith(NEVER_IN_MODELS), f"{path.name} imports {name}"
