"""What every spec section shares: strict models, paths relative to the spec, value types."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, ValidationInfo

from dlscale.units import parse_bytes

Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
Bytes = Annotated[PositiveInt, BeforeValidator(parse_bytes)]  # 2048, "512MiB", "1.5GB"


class Strict(BaseModel):
    """Base of every spec section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def resolve_path(value: Any, info: ValidationInfo) -> Path | None:
    """Paths in a spec are relative to the spec file's folder; the file must exist."""
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    base = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path.resolve()
