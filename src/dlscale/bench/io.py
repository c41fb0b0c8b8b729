"""`bench io`: storage reads, per-worker decoding and the model's appetite, side by side.

Training from disk runs as fast as the slowest of three: the storage delivering bytes (one
reader, and several at once: I/O contention), the loader workers turning bytes into tensors,
and the model consuming batches on its device. Each is measured here over a time budget, in
samples/s, and the verdict names the one that bounds training and what removes it.

Storage is read with threads (os.preadv releases the GIL) in large blocks, each byte at most
once per measurement, after asking the kernel to drop the files from the page cache: a file
already in memory would time memory, not the storage.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dlscale.bench.io_verdict import (
    NOISY_SPREAD,
    io_noise,
    io_verdict,
    relative_spread,
    with_noise,
)
from dlscale.bench.memory import load_averages
from dlscale.data.lazy import IO_FIELDS
from dlscale.errors import UserError
from dlscale.jobspec import Spec
from dlscale.jobspec.data import StoredData
from dlscale.train.device import synchronize
from dlscale.train.loop import Trainer
from dlscale.train.threads import intra_op_threads

SCHEMA = "dlscale.bench.io/1"
DEFAULT_SECONDS = 3.0
DEFAULT_READERS = 4  # when the spec runs no loader workers
BLOCK_BYTES = 4 * 2**20  # large sequential reads, as a tar or Arrow reader issues them
PIECE_BYTES = 64 * 2**20  # a large file is split so that concurrent readers share it
MODEL_WARMUP_STEPS = 2  # allocator growth and first-call dispatch, not the steady step
MODEL_MIN_STEPS = 3


# ------------------------------------------------------------------------- page cache


def drop_page_cache(files: list[str], flush: bool) -> bool:
    """Ask the kernel to forget the files' cached pages; False where it cannot be asked.

    DONTNEED drops clean pages only, so a data set written moments ago (by `dlscale data
    convert`) is flushed to disk first (`flush`), or it would stay in memory, dirty.
    """
    if not hasattr(os, "posix_fadvise"):  # macOS, Windows: no way to ask
        return False
    dropped = True
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            if flush:
                with contextlib.suppress(OSError):  # a file system that cannot: still drop
                    os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            dropped = False
        finally:
            os.close(fd)
    return dropped


def filesystem_of(path: str) -> str | None:
    """The file system type holding `path` (ext4, nfs4, tmpfs, ...) from the mount table: on
    tmpfs the files are memory, whatever the page cache holds."""
    try:
        with open("/proc/self/mounts") as handle:
            mounts = [line.split()[1:3] for line in handle if len(line.split()) > 2]
    except OSError:
        return None
    real = os.path.realpath(path)
    inside = [
        (point, kind)
        for point, kind in mounts
        if real == point or real.startswith(point.rstrip("/") + "/")
    ]
    return max(inside, key=lambda mount: len(mount[0]))[1] if inside else None


# ---------------------------------------------------------------------------- storage


def file_pieces(files: list[str]) -> list[tuple[str, int, int]]:
    """(path, offset, length) pieces of at most PIECE_BYTES, in file order."""
    pieces = []
    for path in files:
        try:
            size = os.path.getsize(path)
        except OSError as error:
            raise UserError(f"{path}: cannot read it ({error.strerror})") from None
        pieces += [(path, at, min(PIECE_BYTES, size - at)) for at in range(0, size, PIECE_BYTES)]
    return pieces


def storage_read(pieces: list[tuple[str, int, int]], readers: int, seconds: float) -> dict:
    """`readers` threads reading the pieces (each once) until they are done or time is up."""
    work = deque(pieces)  # popleft is atomic: readers share the queue without a lock
    start = time.perf_counter()
    deadline = start + seconds

    def reader() -> tuple[int, int]:
        block = memoryview(bytearray(BLOCK_BYTES))
        read_bytes = opened = 0
        while time.perf_counter() < deadline:
            try:
                path, offset, length = work.popleft()
            except IndexError:
                break
            fd = os.open(path, os.O_RDONLY)
            opened += 1
            try:
                end = offset + length
                while offset < end and time.perf_counter() < deadline:
                    got = os.preadv(fd, [block[: min(BLOCK_BYTES, end - offset)]], offset)
                    if got == 0:  # the file shrank under us
                        break
                    offset += got
                    read_bytes += got
            finally:
                os.close(fd)
        return read_bytes, opened

    with ThreadPoolExecutor(readers) as pool:
        results = list(pool.map(lambda _: reader(), range(readers)))
    seconds_taken = time.perf_counter() - start
    read_bytes = sum(got for got, _ in results)
    return {
        "readers": readers,
        "read_bytes": read_bytes,
        "pieces_opened": sum(opened for _, opened in results),
        "seconds": seconds_taken,
        "read_bytes_per_s": read_bytes / seconds_taken,
        "all_read": not work,
    }


# ------------------------------------------------------------------------------ decode


def batches_of(dataset, batch_size: int, seed: int):
    """`(x, y, io)` batches as one loader worker reads them: a seeded shuffle of the indices
    of a map-style data set, or the stream's own first epoch."""
    if getattr(dataset, "streamed", False):
        yield from dataset.batches(0, 0, batch_size, shuffle=True, drop_last=False)
        return
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    for first in range(0, len(order), batch_size):
        yield dataset[order[first : first + batch_size].tolist()]


def decode_rate(dataset, batch_size: int, seconds: float, seed: int) -> dict:
    """One process reading and decoding batches: what a single loader worker delivers."""
    totals = torch.zeros(len(IO_FIELDS), dtype=torch.float64)
    batches = 0
    start = last = time.perf_counter()
    per_sample_s: list[float] = []  # each batch's wall time a sample
    stream = batches_of(dataset, batch_size, seed)
    for _, _, io in stream:
        totals += io
        batches += 1
        now = time.perf_counter()
        per_sample_s.append((now - last) / max(1.0, float(io[IO_FIELDS.index("samples")])))
        last = now
        if now - start >= seconds:
            break
    stream.close()  # a stream's open shard is closed now, not at garbage collection
    seconds_taken = time.perf_counter() - start
    io = dict(zip(IO_FIELDS, totals.tolist(), strict=True))
    samples = max(1, int(io["samples"]))
    return {
        "batches": batches,
        "samples": int(io["samples"]),
        "seconds": seconds_taken,
        "samples_per_s": io["samples"] / seconds_taken,
        "read_s_per_sample": io["read_s"] / samples,
        "decode_s_per_sample": io["decode_s"] / samples,
        "read_bytes_per_sample": io["read_bytes"] / samples,
        "bad_samples": int(io["bad_samples"]),
        "batch_spread": relative_spread(per_sample_s),
    }


# ------------------------------------------------------------------------------- model


def model_rate(trainer: Trainer, seconds: float) -> dict:
    """The spec's own training step on one example batch, repeated: what the model consumes
    when data is never late (the median step, after warm-up)."""
    batch_size = trainer.spec.batch_size
    x, y = trainer.data.example(batch_size)
    x, y = x.to(trainer.device), y.to(trainer.device)
    for _ in range(MODEL_WARMUP_STEPS):
        float(trainer.step_fn(x, y))
    synchronize(trainer.device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MODEL_MIN_STEPS or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        float(trainer.step_fn(x, y))  # reading the loss waits for the device
        synchronize(trainer.device)
        times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    return {
        "steps": len(times),
        "step_time_s": step_s,
        "samples_per_s": len(x) / step_s,
        "step_spread": relative_spread(times),
    }


# ------------------------------------------------------------------------------- bench


def check_reads_from_disk(spec: Spec) -> None:
    if not isinstance(spec.data, StoredData):
        raise UserError(
            f"bench io measures data read from disk; data '{spec.data.name}' is held in memory "
            "(use data: {name: webdataset | hf | images}; `dlscale data convert` writes shards)"
        )


def measure(spec: Spec, readers: int, seconds: float) -> dict:
    """The four measurements, each after dropping the files from the page cache."""
    with tempfile.TemporaryDirectory() as scratch, intra_op_threads(spec.threads):
        trainer = Trainer(spec, Path(scratch))  # the data, the model and its step, as trained
        train = trainer.data.train
        files = sorted(train.files())
        pieces = file_pieces(files)
        if not pieces:
            raise UserError(f"data '{spec.data.name}': its {len(files)} file(s) hold no bytes")
        dropped = [drop_page_cache(files, flush=True)]
        one = storage_read(pieces, 1, seconds)
        dropped.append(drop_page_cache(files, flush=False))
        many = storage_read(pieces, readers, seconds)
        dropped.append(drop_page_cache(files, flush=False))
        return {
            "device": str(trainer.device),
            "threads": torch.get_num_threads(),
            "files": len(files),
            "files_bytes": sum(length for _, _, length in pieces),
            "filesystem": filesystem_of(files[0]),
            "samples": len(train),
            "page_cache_dropped": all(dropped),
            "storage_one_reader": one,
            "storage_readers": many,
            "contention_ratio": many["read_bytes_per_s"] / one["read_bytes_per_s"],
            "decode_one_worker": decode_rate(train, spec.batch_size, seconds, spec.seed),
            "model_step": model_rate(trainer, seconds),
        }


def check_io_inputs(spec: Spec, readers: int | None, seconds: float) -> None:
    """What `bench io` refuses before it measures (and before it says it measures)."""
    if not (seconds > 0 and math.isfinite(seconds)):  # NaN fails every comparison
        raise UserError(f"--seconds: must be a positive number of seconds (got {seconds:g})")
    if readers is not None and readers < 1:
        raise UserError(f"--readers: must be a positive integer (got {readers})")
    check_reads_from_disk(spec)


def run_io_bench(
    spec: Spec, readers: int | None = None, seconds: float = DEFAULT_SECONDS, cores: int = 1
) -> dict:
    """Storage (1 and N readers), decoding per worker and the model, then the verdict."""
    check_io_inputs(spec, readers, seconds)
    load_before = load_averages()  # before this bench's own readers and threads add to it
    measured = measure(spec, readers or spec.loader.workers or DEFAULT_READERS, seconds)
    decode, model = measured["decode_one_worker"], measured["model_step"]
    # Bytes a sample costs the storage: as the reader counted them, else the files' share.
    disk_bytes = decode["read_bytes_per_sample"] or measured["files_bytes"] / measured["samples"]
    storage_bytes_per_s = max(
        measured["storage_one_reader"]["read_bytes_per_s"],
        measured["storage_readers"]["read_bytes_per_s"],
    )
    model["needs_read_bytes_per_s"] = model["samples_per_s"] * disk_bytes
    verdict = io_verdict(
        storage_bytes_per_s / disk_bytes,
        decode["samples_per_s"],
        model["samples_per_s"],
        spec.loader.workers,
        cores,
    )
    noise = io_noise(
        model["step_spread"], decode["batch_spread"], load_before[0] if load_before else None, cores
    )
    spread = max(model["step_spread"], decode["batch_spread"])
    verdict = with_noise(verdict, noise, spread)
    return {
        "schema": SCHEMA,
        "spec": spec.name,
        "data": spec.data.name,
        "model": spec.model.name,
        "batch_size": spec.batch_size,
        "seconds_per_measurement": seconds,
        "disk_bytes_per_sample": disk_bytes,
        **measured,
        "loader_workers": spec.loader.workers,
        "cores": cores,
        **verdict,
        "noisy_spread": NOISY_SPREAD,
        "load_average_1m_5m_15m": load_averages(),
    }
