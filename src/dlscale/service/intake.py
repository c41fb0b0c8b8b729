"""A spec sent to the service: its structure checked, kept inside its job folder, sized in slots.

A client's spec is untrusted text, and the server only checks its structure: UTF-8, a size, the
plain-data YAML of `dlscale.jobspec.strict_yaml` (no `!!binary`, `!!timestamp`, `!!set` or python
tags; duplicate keys refused) nested and expanded within bounds checked before it is built, and
then the spec schema itself. Refused too: absolute or `..` paths (a tenant's spec reads only the
files uploaded with it), data staging (a path on the server), and code references other than the
tenant's own uploaded modules (`inputs.mynet:build`). Whatever needs the spec's model, data or
code runs in a validation job inside the job sandbox (service/validate.py), never here.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from dlscale.errors import UserError
from dlscale.jobspec.strict_yaml import load_yaml

MAX_SPEC_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_NODES = 20_000  # after expanding aliases; a real spec has a few hundred
KINDS = ("train", "sweep", "profile")
# A `module:attribute` reference anywhere in the document (a model factory, a custom input maker).
_CODE_REFERENCE = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")
# The tenant's own code: modules uploaded with the job, imported inside its sandbox only.
TENANT_PACKAGE = "inputs"
_PLAIN = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Submitted:
    """The spec as it will run: its text (seed added when the client gave none) and its facts."""

    original: str  # exactly as submitted: the reproduction record keeps these bytes
    text: str  # what the job runs: `original`, plus `seed:` when it had none
    seed: int
    seed_drawn: bool
    raw: dict


def decode(data: bytes) -> str:
    """The spec's bytes as text, or one line saying why not."""
    if len(data) > MAX_SPEC_BYTES:
        raise UserError(f"spec: {len(data)} bytes; the service takes specs up to {MAX_SPEC_BYTES}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"spec: not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})"
        ) from None


def parse(text: str) -> dict:
    """The spec's YAML as a mapping of plain data, its shape bounded before it is built."""
    try:
        raw = load_yaml(text, MAX_DEPTH, MAX_NODES)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UserError(f"spec: {' '.join(str(problem).split())}{where}") from None
    if not isinstance(raw, dict):
        raise UserError("spec: expected a YAML mapping (name:, model:, data:, ...)")
    check_untrusted(raw)
    return raw


def _is_staging(key: Any) -> bool:
    """`stage`, or a swept field path ending in it (`data.stage` in a grid or a space)."""
    return isinstance(key, str) and key.split(".")[-1] == "stage"


def check_untrusted(raw: Any, where: str = "") -> None:
    """Refuse values that are not plain data, paths that leave the job folder, server-side
    staging, and code references outside the tenant's own uploaded modules."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            here = f"{where}.{key}" if where else str(key)
            if not isinstance(key, _PLAIN):
                raise UserError(f"spec: {here}: a key must be plain text or a number")
            if _is_staging(key) and value is not None:
                raise UserError(f"spec: {here}: staging copies to a path on the server; not here")
            check_untrusted(value, here)
    elif isinstance(raw, list):
        for index, value in enumerate(raw):
            check_untrusted(value, f"{where}[{index}]")
    elif not isinstance(raw, _PLAIN):  # the loader builds none of these; never coerced to text
        raise UserError(f"spec: {where}: a {type(raw).__name__} is not a spec value")
    elif isinstance(raw, str):
        _check_text(raw, where)


def _check_text(raw: str, where: str) -> None:
    if code := _CODE_REFERENCE.match(raw):
        module = code.group(1)
        if module.split(".")[0] != TENANT_PACKAGE or module == TENANT_PACKAGE:
            raise UserError(
                f"spec: {where}: '{raw}' names code outside the job; the service imports only "
                f"modules uploaded with it, as {TENANT_PACKAGE}.MODULE:FUNCTION (the file "
                f"{TENANT_PACKAGE}/MODULE.py), inside the job's sandbox"
            )
        return
    if raw.startswith(("/", "~", "\\")) or "\x00" in raw or "://" in raw:
        raise UserError(
            f"spec: {where}: '{raw}' is not a path inside the job; the service reads only "
            "files uploaded with the spec, named relative to it (inputs/NAME)"
        )
    if ".." in PurePosixPath(raw.replace("\\", "/")).parts:
        raise UserError(f"spec: {where}: '{raw}' leaves the job's folder ('..')")


def with_seed(data: bytes) -> Submitted:
    """The submitted spec, with a seed drawn and appended when it names none (the seed is part
    of the reproduction record, so a rerun trains the same numbers)."""
    text = decode(data)
    raw = parse(text)
    seed = raw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UserError(f"spec: seed: expected a whole number, got {seed!r}")
    if seed is not None:
        return Submitted(text, text, seed, False, raw)
    seed = secrets.randbelow(2**31)
    if text.lstrip().startswith("{") or "seed" in raw:  # flow style or `seed: null`: re-dump
        runs = yaml.safe_dump({**raw, "seed": seed}, sort_keys=False)
    else:
        runs = (
            text + ("" if text.endswith("\n") else "\n") + f"seed: {seed}  # drawn by the service\n"
        )
    return Submitted(text, runs, seed, True, {**raw, "seed": seed})


def check_inside(spec: Any, job_dir: Path) -> None:
    """After validation: every path the spec resolved lies inside the job's folder (a symlink
    uploaded or planted cannot point the job at another tenant's files)."""
    root = job_dir.resolve()

    def visit(value: Any, where: str) -> None:
        if isinstance(value, Path):
            resolved = value.resolve()
            if resolved != root and root not in resolved.parents:
                raise UserError(f"spec: {where}: {value.name} is outside the job's folder")
        elif hasattr(type(value), "model_fields"):
            for name in type(value).model_fields:
                visit(getattr(value, name), f"{where}.{name}" if where else name)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(item, f"{where}.{key}")
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                visit(item, f"{where}[{index}]")

    visit(spec, "")


def slots(spec: Any, kind: str, parallel: int | None, machine_gpus: int) -> tuple[int, int]:
    """(cpu, gpu) slots a job holds while it runs: one per process it starts (a sweep: per
    process × trials at a time), and a GPU per trainer when it runs on CUDA."""
    if kind == "profile":
        return 1, 0
    processes = spec.strategy.processes
    device = str(spec.device)
    on_gpu = device.startswith("cuda") or (device == "auto" and machine_gpus > 0)
    gpus = spec.strategy.trainers if on_gpu else 0
    times = max(1, parallel or 1) if kind == "sweep" else 1
    return processes * times, gpus * times
