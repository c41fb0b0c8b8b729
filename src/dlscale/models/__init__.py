"""The model zoo: plain nn.Modules, one file per family, and the registry that builds them."""

from dlscale.models.registry import (
    ZOO,
    ZooEntry,
    build_model,
    check_model,
    count_parameters,
    parameter_count_meta,
)

__all__ = [
    "ZOO",
    "ZooEntry",
    "build_model",
    "check_model",
    "count_parameters",
    "parameter_count_meta",
]
