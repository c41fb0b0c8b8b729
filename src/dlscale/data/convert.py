"""`dlscale data convert`: write a data set as WebDataset tar shards plus dataset.json.

The shard format (read by the webdataset reader, and what foreign shards follow): tar members
`{key}.{field}`, a sample's members consecutive; the input is `input.npy` or, for images with
`--image-format png`, `png`; the label is `cls` (ASCII integer) or `target.npy` (next tokens).
dataset.json lists every shard with its split, samples, bytes and sha256; it is written last,
so a convert that was interrupted leaves shards but no dataset.json.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
from pathlib import Path

import numpy as np
from webdataset import TarWriter

from dlscale.atomic import write_json_atomic
from dlscale.data.convert_hf import write_hf
from dlscale.data.pixels import png_bytes
from dlscale.data.sources import SPLITS, Progress, Source, open_source
from dlscale.errors import UserError, os_reason

FORMATS = ("webdataset", "hf")
IMAGE_FORMATS = ("npy", "png")
DEFAULT_SHARD_BYTES = 64 * 10**6  # 64MB: large reads, and still many shards to share out
SHARD_NAME = "{split}-{index:06d}.tar"
# Fixed member times make a convert reproducible: the same data gives byte-identical shards.
MEMBER_MTIME = 0  # an int: a float time makes tarfile add a 1 KiB PAX header per member


def convert(
    source: str | Path,
    out: Path,
    format: str = "webdataset",
    max_bytes: int = DEFAULT_SHARD_BYTES,
    image_format: str = "npy",
    on_progress: Progress | None = None,
    **options,
) -> dict:
    """Write `source` (see `open_source`; `options` are its samples, shape, ...) into `out`,
    in shards of about `max_bytes`.

    Returns what was written: {"out", "format", "shards", "samples", "bytes", "seconds", ...}.
    """
    started = time.perf_counter()
    if format not in FORMATS:
        raise UserError(f"--format: '{format}' is not one of {', '.join(FORMATS)}")
    if image_format not in IMAGE_FORMATS:
        raise UserError(f"--image-format: '{image_format}' is not one of npy, png")
    if max_bytes < 1:
        raise UserError(f"--shard-size: {max_bytes} is not a positive size such as 64MB or 1GiB")
    out = Path(out)
    check_empty(out)
    data = open_source(source, **options)
    if image_format == "png" and not data.images:
        raise UserError(
            f"--image-format png: samples of shape {data.input_shape} are not images "
            "(C, H, W) with C = 1 or 3; use npy"
        )
    progress = on_progress or (lambda done, total: None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if format == "hf":
            shards = write_hf(data, out, max_bytes, image_format == "png", progress)
        else:
            shards = write_shards(data, out, max_bytes, image_format == "png", progress)
            # written whole, and only once the shards are: its presence says they are complete
            # Readable as the shards are: a data set is written to be shared.
            write_json_atomic(out / "dataset.json", dataset_record(data, shards), shared=True)
    except OSError as exc:
        raise UserError(f"cannot write the data set into {out}: {os_reason(exc)}") from None
    return {
        "out": str(out),
        "format": format,
        "shards": len(shards),
        "samples": dict(data.counts),
        "bytes": sum(s["bytes"] for s in shards),
        "task": data.task,
        "num_classes": data.num_classes,
        "input_shape": data.input_shape,
        "seconds": time.perf_counter() - started,
        "warnings": shard_size_warnings(shards, max_bytes) if format == "webdataset" else [],
    }


def shard_size_warnings(shards: list[dict], max_bytes: int) -> list[str]:
    """A line where shards came out larger than `--shard-size` because one sample alone passes
    it: a shard holds at least one sample, and tar pads a file to 10 KiB (its record size)."""
    single = [s for s in shards if s["samples"] == 1 and s["bytes"] > max_bytes]
    if not single:
        return []
    smallest = min(s["bytes"] for s in single)
    return [
        f"--shard-size {max_bytes:,} bytes is less than a shard of one sample "
        f"({smallest:,} bytes or more: the sample, tar's headers and its padding to 10 KiB): "
        f"wrote {len(single)} shards of one sample each"
    ]


def check_empty(out: Path) -> None:
    """Convert writes into a new or empty folder only, so nothing is ever overwritten."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file: give a new or empty folder to write the data set into")
    if out.is_dir():
        first = next(iter(sorted(out.iterdir())), None)
        if first is not None:
            raise UserError(
                f"{out} is not empty (it holds {first.name}): give a new or empty folder; "
                "nothing was overwritten"
            )


def write_shards(data: Source, out: Path, max_bytes: int, png: bool, progress: Progress) -> list:
    """Every sample into `{split}-NNNNNN.tar` files of about `max_bytes`; the shards' records."""
    writers = {split: RollingShards(out, split, max_bytes) for split in SPLITS}
    total, done = sum(data.counts.values()), 0
    for split, x, y in data.chunks():
        writer = writers[split]
        for i in range(len(x)):
            writer.write(encode_sample(x[i], y[i], png, data.task))
        done += len(x)
        progress(done, total)
    return [record for split in SPLITS for record in writers[split].close()]


def encode_sample(x: np.ndarray, y: np.ndarray, png: bool, task: str) -> dict[str, bytes]:
    """One sample's tar members (field → bytes), in the shard format above."""
    sample = {"png": png_bytes(x)} if png else {"input.npy": npy_bytes(x)}
    if task == "language_modeling":
        sample["target.npy"] = npy_bytes(y)
    else:
        sample["cls"] = str(int(y)).encode("ascii")
    return sample


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


class _HashingFile:
    """A shard file that hashes what is written to it, so its sha256 needs no second read."""

    def __init__(self, path: Path):
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.name = self.file.name
        self.sha256 = hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    def close(self) -> None:
        self.file.close()


def closed_tar_bytes(offset: int) -> int:
    """The size of a tar file once closed, from the archive's position (`TarFile.offset`): two
    zero blocks end it, and it is padded to a whole record (10 KiB). The file's own position
    lags: tarfile's stream buffers up to a record, so a file read 0 bytes until 10 KiB were
    written and `--shard-size 1KB` made shards of six samples."""
    ended = offset + 2 * tarfile.BLOCKSIZE
    return -(-ended // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


class RollingShards:
    """Tar shards of one split: the next file starts once the current one reaches `max_bytes`.

    webdataset's ShardWriter counts payload bytes only; tar headers and padding add 1 KiB or more
    per small sample, so here the file's own size decides, and `--shard-size` is what disk holds.
    """

    def __init__(self, out: Path, split: str, max_bytes: int):
        self.out, self.split, self.max_bytes = out, split, max_bytes
        self.records: list[dict] = []
        self.file = self.tar = None
        self.samples = 0
        self.keys = 0  # keys run on across the split's shards: every sample's is unique

    def write(self, fields: dict[str, bytes]) -> None:
        if self.tar is None:
            name = SHARD_NAME.format(split=self.split, index=len(self.records))
            self.file = _HashingFile(self.out / name)
            self.tar = TarWriter(self.file, encoder=False, mtime=MEMBER_MTIME)
        self.tar.write({"__key__": f"{self.keys:09d}", **fields})
        self.keys += 1
        self.samples += 1
        if closed_tar_bytes(self.tar.tarstream.offset) >= self.max_bytes:
            self._finish()

    def close(self) -> list[dict]:
        if self.tar is not None:
            self._finish()
        return self.records

    def _finish(self) -> None:
        self.tar.close()
        self.file.close()
        path = Path(self.file.name)
        digest = self.file.sha256.hexdigest()
        self.records.append(
            {
                "file": path.name,
                "split": self.split,
                "samples": self.samples,
                "bytes": path.stat().st_size,
                "sha256": digest,
            }
        )
        self.file = self.tar = None
        self.samples = 0


def dataset_record(data: Source, shards: list[dict]) -> dict:
    """dataset.json: what the reader needs before opening a shard, and each shard's checksum."""
    return {
        "format": "webdataset",
        "task": data.task,
        "num_classes": data.num_classes,
        "vocab_size": data.vocab_size,
        "input_shape": data.input_shape,
        "shards": shards,
    }
