"""What every spec section shares: strict models, paths relative to the spec, value types."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationInfo,
    model_validator,
)

from dlscale.units import parse_bytes

# scikit-learn's random_state and numpy's legacy seeding take 0..2**32 - 1 (the data split and
# the folds); torch takes 64 bits, which the offsets added to a seed (+ rank, × 1_000_003 per
# step or epoch) stay far inside of from here.
MAX_SEED = 2**32 - 1


def _seed_in_range(value: int) -> int:
    if not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"must be between 0 and {MAX_SEED} (2**32 - 1: the seeds numpy and scikit-learn take)"
        )
    return value


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits true/false anywhere in it (`bool`, `bool | None`, `Any`)."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    return any(_takes_bool(arg) for arg in get_args(annotation))


Seed = Annotated[int, AfterValidator(_seed_in_range)]
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
Bytes = Annotated[PositiveInt, BeforeValidator(parse_bytes)]  # 2048, "512MiB", "1.5GB"


class Strict(BaseModel):
    """Base of every spec section: unknown keys are errors, not silently ignored; a float
    setting must be a number (YAML's `.inf` and `.nan` are floats that train to nothing)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, data: Any) -> Any:
        """pydantic reads `true` as 1 where a number is expected: `seed: true` trained with seed
        1, `epochs: true` for one epoch. A count, a rate or a seed is never a yes/no, so such a
        value is wrapped where no number validator takes it, and fails at its own field."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        flagged = {
            key: BooleanGiven(value)
            for key, value in data.items()
            if isinstance(value, bool) and key in fields and not _takes_bool(fields[key].annotation)
        }
        return {**data, **flagged} if flagged else data


class BooleanGiven:
    """A true/false given where a number belongs (see Strict); the spec loader words its error."""

    def __init__(self, value: bool):
        self.value = value

    def __repr__(self) -> str:
        return str(self.value).lower()


def spec_relative(value: Any, info: ValidationInfo) -> Path:
    """A path as the spec gives it: `~` expanded, relative to the spec file's folder."""
    path = Path(str(value)).expanduser()
    base = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return path


def not_a_file(path: Path, what: str = "file") -> str | None:
    """Why `path` cannot be read as a `what` (a folder, a device, nothing there), or None."""
    if path.is_dir():
        return f"{path} is a folder, not a {what}"
    if path.exists() and not path.is_file():
        return f"{path} is not a regular file: give a {what}"
    if not path.is_file():
        return f"{what} not found: {path}"
    return None


def resolve_path(value: Any, info: ValidationInfo) -> Path | None:
    """Paths in a spec are relative to the spec file's folder; the file must exist."""
    if value is None:
        return None
    path = spec_relative(value, info)
    problem = not_a_file(path)
    if problem:
        raise ValueError(problem)
    return path.resolve()
