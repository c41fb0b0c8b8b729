"""build_data: pick the reader for a data spec. A new dataset is one file plus one entry here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlscale.data.bundle import DataBundle
from dlscale.data.cache import loaded
from dlscale.data.cifar import read_cifar10
from dlscale.data.dataset_files import stage_spec
from dlscale.data.digits import read_digits
from dlscale.data.hf import read_hf
from dlscale.data.holdout import cross_validation_fold
from dlscale.data.idx import read_idx
from dlscale.data.images import read_images
from dlscale.data.npz import read_npz
from dlscale.data.synthetic import make_synthetic
from dlscale.data.wds import read_webdataset
from dlscale.jobspec import (
    Cifar10Data,
    DataSpec,
    DigitsData,
    HfData,
    IdxData,
    ImagesData,
    NpzData,
    StoredData,
    SyntheticData,
    WebDatasetData,
)

# Spec class → reader(spec, seed). The seed drives generation and the train/validation split.
READERS: dict[type, Callable[[Any, int], DataBundle]] = {
    DigitsData: read_digits,
    SyntheticData: make_synthetic,
    IdxData: read_idx,
    Cifar10Data: read_cifar10,
    NpzData: read_npz,
    ImagesData: read_images,
    HfData: read_hf,
    WebDatasetData: read_webdataset,
}


def build_data(
    spec: DataSpec, seed: int, stage: bool = False, run: str | None = None
) -> DataBundle:
    """Read or generate the data set a spec describes; bad files raise a one-line UserError.

    `seed` is the spec's; the data section's own `seed`, when given, takes its place. With a
    `fold`, training and validation become the fold's split of the training part. `stage`:
    copy the files to the spec's `stage` folder first, for the run whose folder is `run`
    (its staging record counts the copies any of the run's processes made).
    """
    reader = READERS.get(type(spec))
    # The spec's discriminated union only admits the classes above, so a miss is our bug.
    assert reader is not None, f"no data reader registered for {type(spec).__name__}"
    seed = spec.seed if spec.seed is not None else seed
    staging = None
    # Only the processes that train copy the data to local disk (`stage`): checks, validate and
    # profile read it where it is.
    if stage and isinstance(spec, StoredData) and spec.stage is not None:
        spec, staging = stage_spec(spec, run)  # copied to local disk first; read from there
    if staging is not None:
        bundle = reader(spec, seed)
        bundle.staging = staging
    else:  # a sweep's slot keeps what it read for its next trials (data/cache.py)
        whole = spec.model_copy(update={"fold": None})
        key = f"{type(spec).__name__}:{whole.model_dump_json()}:{seed}"
        bundle = loaded(key, lambda: reader(whole, seed))
    if spec.fold is not None:
        bundle = cross_validation_fold(bundle, spec.fold.folds, spec.fold.index, seed)
    return bundle
