"""The job spec: a YAML file validated by pydantic into one tree, with clear one-line errors.

Every section is a strict pydantic model (unknown keys are rejected). Sections that come in kinds
(`data`, `strategy`) are unions discriminated by their `name` key: a new kind is one new class
added to its union.
"""

from dlscale.jobspec.data import (
    DATA_KINDS,
    Cifar10Data,
    DataSection,
    DataSpec,
    DigitsData,
    FoldSpec,
    HfData,
    IdxData,
    ImagesData,
    NpzData,
    StoredData,
    SyntheticData,
    WebDatasetData,
)
from dlscale.jobspec.job import Spec
from dlscale.jobspec.load import describe_validation_error, load_raw, load_spec, parse_spec
from dlscale.jobspec.strategy import (
    STRATEGY_KINDS,
    DdpStrategy,
    HybridStrategy,
    PipelineStrategy,
    PsStrategy,
    SingleStrategy,
    StragglerSpec,
    StrategySection,
    StrategySpec,
    TensorStrategy,
)
from dlscale.jobspec.sweep import Distribution, EarlyStoppingSpec, SearchSpec, SweepSpec
from dlscale.jobspec.training import CheckpointSpec, LoaderSpec, ModelSpec, OptimizerSpec

__all__ = [
    "DATA_KINDS",
    "STRATEGY_KINDS",
    "CheckpointSpec",
    "Cifar10Data",
    "DataSection",
    "DataSpec",
    "DdpStrategy",
    "DigitsData",
    "Distribution",
    "EarlyStoppingSpec",
    "FoldSpec",
    "HfData",
    "HybridStrategy",
    "IdxData",
    "ImagesData",
    "LoaderSpec",
    "ModelSpec",
    "NpzData",
    "OptimizerSpec",
    "PipelineStrategy",
    "PsStrategy",
    "SearchSpec",
    "SingleStrategy",
    "Spec",
    "StoredData",
    "StragglerSpec",
    "StrategySection",
    "StrategySpec",
    "SweepSpec",
    "SyntheticData",
    "TensorStrategy",
    "WebDatasetData",
    "describe_validation_error",
    "load_raw",
    "load_spec",
    "parse_spec",
]
