"""`dlscale data convert --format hf`: a Hugging Face DatasetDict saved to disk (Arrow files).

Columns: `input` (a fixed-shape array) or, with `--image-format png`, `image` (datasets.Image);
and `label` (class, or next tokens). Splits `train` and `validation`. Read back with
`data: {name: hf, path: OUT, input_column: input}` (or `image_column: image`).
"""

from __future__ import annotations

import secrets
import shutil
import uuid
from pathlib import Path

from dlscale.data.pixels import png_bytes
from dlscale.data.sources import Progress, Source
from dlscale.errors import UserError

HF_SPLITS = {"train": "train", "val": "validation"}


def write_hf(data: Source, out: Path, max_bytes: int, png: bool, progress: Progress) -> list:
    """Save `data` into `out` in Arrow files of at most about `max_bytes`; their records."""
    import datasets

    datasets.disable_progress_bars()  # the caller shows one progress bar for the whole convert
    features = hf_features(data, png)
    # from_generator writes Arrow into a cache as rows arrive (memory stays bounded); the cache
    # lives beside OUT, not in ~/.cache, and is removed once save_to_disk has copied it.
    # Named before it exists, and made inside the `try` that removes it: a stop at any point
    # leaves no cache folder behind (mkdtemp names it only once it exists).
    cache = out.parent / f".{out.name}-convert-{secrets.token_hex(6)}"
    total, done = sum(data.counts.values()), [0]

    def rows(split: str):
        for _, x, y in data.chunks((split,)):
            for i in range(len(x)):
                if png:
                    row = {"image": {"bytes": png_bytes(x[i]), "path": None}}
                else:
                    row = {"input": x[i]}
                row["label"] = y[i] if data.task == "language_modeling" else int(y[i])
                yield row
            done[0] += len(x)
            progress(done[0], total)

    try:
        cache.mkdir(mode=0o700)
        parts = {}
        for split, name in HF_SPLITS.items():
            # A fresh fingerprint: datasets would otherwise hash the generator and what it holds.
            parts[name] = datasets.Dataset.from_generator(
                rows,
                features=features,
                cache_dir=str(cache),
                gen_kwargs={"split": split},
                fingerprint=uuid.uuid4().hex,
                split=name,
            )
        datasets.DatasetDict(parts).save_to_disk(str(out), max_shard_size=max_bytes)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return [
        {"file": str(path.relative_to(out)), "split": split, "bytes": path.stat().st_size}
        for split, name in HF_SPLITS.items()
        for path in sorted((out / name).glob("*.arrow"))
    ]


def hf_features(data: Source, png: bool):
    """The columns' types: fixed-shape arrays, so a reader knows every sample's shape up front."""
    import datasets

    shape, dtype = tuple(data.input_shape), data.dtype
    if png:
        column = {"image": datasets.Image()}
    elif len(shape) == 1:
        column = {"input": datasets.List(datasets.Value(dtype), length=shape[0])}
    elif 2 <= len(shape) <= 5:
        array = getattr(datasets, f"Array{len(shape)}D")
        column = {"input": array(shape=shape, dtype=dtype)}
    else:
        raise UserError(f"--format hf: inputs of {len(shape)} dimensions {list(shape)} (1 to 5)")
    if data.task == "language_modeling":
        label = datasets.List(datasets.Value("int64"), length=shape[0])
    else:
        label = datasets.Value("int64")
    return datasets.Features({**column, "label": label})
