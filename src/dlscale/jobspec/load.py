"""Reading a spec: YAML in, a validated Spec out, every problem one line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from dlscale.errors import UserError
from dlscale.jobspec.base import BooleanGiven, not_a_file
from dlscale.jobspec.job import Spec
from dlscale.jobspec.strict_yaml import load_yaml


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; every problem becomes a one-line UserError."""
    raw = load_raw(path)
    return parse_spec(raw, base_dir=Path(path).resolve().parent, source=str(path))


def load_raw(path: str | Path) -> Any:
    """The spec file's YAML as parsed, before validation (a sweep derives its trials from it)."""
    path = Path(path)
    problem = not_a_file(path, "spec file")
    if problem:
        raise UserError(problem)
    try:
        raw = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot parse"
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read spec: {exc}") from None
    return raw


def parse_spec(raw: Any, base_dir: Path | None = None, source: str = "spec") -> Spec:
    """Validate an already-parsed mapping (from YAML, JSON or code)."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping of spec fields at the top level")
    try:
        return Spec.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise UserError(f"{source}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    """First error as 'field.path: reason', plus a count of the others."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    field, owner = _field_path(first["loc"])
    kind = first["type"]
    if kind == "extra_forbidden":
        allowed = (  # as a spec writes them: a field's alias where it has one
            ", ".join(f.alias or name for name, f in owner.model_fields.items())
            if owner is not None
            else ""
        )
        text = f"unknown field '{field}'" + (f" (allowed here: {allowed})" if allowed else "")
    elif kind == "missing":
        text = f"{field}: required field is missing"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        ctx = first.get("ctx", {})
        if "tag" in ctx:
            choices = ctx.get("expected_tags", "").replace("'", "")
            text = f"unknown {field} name '{ctx['tag']}' (choose from: {choices})"
        else:
            text = f"{field}.name is missing; it picks the kind of {field}"
    elif isinstance(first.get("input"), BooleanGiven):
        text = f"{field}: must be a number, not a boolean (got {first['input']!r})"
    else:
        message = first["msg"].removeprefix("Value error, ")
        shown = _short_input(first.get("input")) if kind != "value_error" else ""
        got = f" (got {shown})" if shown else ""
        text = f"{field}: {message}{got}" if field else f"{message}{got}"
    more = len(errors) - 1
    return text + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def _field_path(loc: tuple) -> tuple[str, type[BaseModel] | None]:
    """Dotted field path from a pydantic loc, minus union tags; and the model owning the leaf."""
    parts: list[str] = []
    model: Any = Spec
    owner: type[BaseModel] | None = Spec
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
            continue
        if model is None:
            parts.append(str(item))
            continue
        if isinstance(model, type) and issubclass(model, BaseModel) and item in model.model_fields:
            owner = model
            parts.append(str(item))
            model = _section_class(model.model_fields[item].annotation)
        elif isinstance(model, list):  # a discriminated union: this item is the tag
            model = next((m for m in model if _tag(m) == item), None)
        else:
            owner = model if isinstance(model, type) else owner
            parts.append(str(item))
            model = None
    return ".".join(parts), owner


def _section_class(annotation: Any) -> Any:
    """The spec-section class(es) behind a field annotation, if it is one."""
    args = getattr(annotation, "__args__", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if args:
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) > 1:
            return models
        if models:
            return models[0]
        for arg in args:  # Annotated[...] nests the union one level down
            found = _section_class(arg)
            if found is not None:
                return found
    return None


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("name")
    args = getattr(field.annotation, "__args__", ()) if field else ()
    return args[0] if args else None


def _short_input(value: Any) -> str:
    if isinstance(value, dict | list):
        return ""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
