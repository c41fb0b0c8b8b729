"""Where each sample starts in a tar shard, read from its headers alone (seeking over the data).

Python's tarfile parses a header in ~50-100 µs (checksums and every field, in Python): a
minute for the 400,000 samples of a 2 GB shard set, in every process that opens it. The common
headers (ustar, with PAX or GNU long-name extensions, as WebDataset, GNU tar and tarfile write
them) are read here from the few fields an index needs, ~10x faster; anything else — and
anything odd, so that the error names what is wrong — goes to tarfile.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

BLOCK_BYTES = 512  # tar's block: headers and data are padded to it
_FILE, _DIRECTORY, _PAX, _GLOBAL_PAX, _GNU_LONG_NAME = b"0\x00", b"5", b"x", b"g", b"L"


def split_name(name: str) -> tuple[str | None, str]:
    """(key, field) of a member name; key None for a member that is not part of a sample
    (no extension, or a hidden file), which WebDataset skips too."""
    folder, _, base = name.rpartition("/")
    stem, dot, field = base.partition(".")
    if not dot or not stem:
        return None, ""
    return (f"{folder}/{stem}" if folder else stem), field.lower()


def sample_starts(path: str) -> tuple[list[int], int]:
    """(offset of each sample's first header, offset where the last member ends). Raises
    tarfile.ReadError for what is not a tar or is cut short inside a member."""
    with open(path, "rb") as file:
        found = _fast_starts(file)
    return found if found is not None else _tarfile_starts(path)


def _tarfile_starts(path: str) -> tuple[list[int], int]:
    starts: list[int] = []
    last_key = None
    with tarfile.open(path, mode="r:") as tar:
        for member in _members(tar):
            key, _ = split_name(member.name)
            if key is not None and member.isfile() and key != last_key:
                starts.append(member.offset)  # the first header block, extensions included
                last_key = key
        return starts, tar.offset


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """A tar's members one at a time. tarfile keeps every header it has read in `members`;
    forgetting them keeps a large shard's index from costing a TarInfo per member."""
    while (member := tar.next()) is not None:
        tar.members.clear()
        yield member


class _Unknown(Exception):
    """A header the fast reader does not fully understand: tarfile takes over."""


def _walk(file, until_eof: bool = False) -> Iterator[tuple[int, str | None, bool, int, int]]:
    """(where a member's headers begin, its name, is it a directory, data offset, data size)
    of each file or folder member, then (end offset, None, False, 0, 0) at a clean end: the
    end-of-archive block, or with `until_eof` the end of the bytes (one sample's members).
    Raises _Unknown at anything it does not fully understand."""
    offset = 0
    first = None  # where the current member's headers began (an extension header comes first)
    long_name = None
    while True:
        file.seek(offset)
        block = file.read(BLOCK_BYTES)
        if until_eof and not block and first is None:
            yield offset, None, False, 0, 0
            return
        if not block.strip(b"\0"):
            # The end-of-archive zero block (or the file's end): a clean end only on a whole
            # block after at least one member; tarfile judges everything else.
            if len(block) == BLOCK_BYTES and offset:
                yield offset, None, False, 0, 0
                return
            raise _Unknown
        size = _header_size(block)
        if size is None:
            raise _Unknown
        data_end = offset + BLOCK_BYTES + -(-size // BLOCK_BYTES) * BLOCK_BYTES
        kind = block[156:157]
        if kind in (_PAX, _GNU_LONG_NAME):
            long_name = _extended_name(kind, file.read(size))
            if long_name is False:
                raise _Unknown
            first = offset if first is None else first
        elif kind == _GLOBAL_PAX:
            pass  # archive-wide defaults; they name no member
        elif (kind and kind in _FILE) or kind == _DIRECTORY:
            name = long_name or _ustar_name(block)
            yield (
                (offset if first is None else first),
                name,
                kind == _DIRECTORY,
                offset + BLOCK_BYTES,
                size,
            )
            first, long_name = None, None
        else:
            raise _Unknown  # links, devices, sparse files: tarfile knows them
        offset = data_end


def _fast_starts(file) -> tuple[list[int], int] | None:
    """The index from plain headers; None at the first header it does not fully understand."""
    starts: list[int] = []
    last_key = None
    try:
        for start, name, is_dir, _, _ in _walk(file):
            if name is None:
                return starts, start
            key, _ = split_name(name)
            if not is_dir and key is not None and key != last_key:
                starts.append(start)
                last_key = key
    except _Unknown:
        return None
    return None


def sample_members(chunk: bytes) -> list[tuple[str, bytes]] | None:
    """(name, data) of each file in one sample's bytes, read from the plain headers; None
    where tarfile must judge them (the same headers the index reads fast)."""
    members = []
    try:
        for _, name, is_dir, data_offset, size in _walk(io.BytesIO(chunk), until_eof=True):
            if name is None:
                return members
            if not is_dir:
                members.append((name, chunk[data_offset : data_offset + size]))
    except _Unknown:
        return None
    return None


def _header_size(block: bytes) -> int | None:
    """The member's data size, if the block is a ustar header with a valid checksum."""
    if len(block) < BLOCK_BYTES:
        return None
    try:
        checksum = int(block[148:156].strip(b"\0 ") or b"-1", 8)
        size = int(block[124:136].strip(b"\0 ") or b"0", 8)  # base-256 sizes fail: tarfile
    except ValueError:
        return None
    # The checksum counts its own field as eight spaces (POSIX ustar).
    if sum(block[:148]) + sum(block[156:]) + 8 * ord(" ") != checksum:
        return None
    return size


def _ustar_name(block: bytes) -> str:
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return f"{prefix}/{name}" if prefix else name


def _extended_name(kind: bytes, data: bytes) -> str | bool | None:
    """The name a PAX or GNU long-name header gives the next member (None: it keeps its own);
    False where the header says more than a name (a PAX size, a damaged record)."""
    if kind == _GNU_LONG_NAME:
        return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    name, position = None, 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0 or not data[position:space].isdigit():
            return False
        length = int(data[position:space])
        key, _, value = data[space + 1 : position + length - 1].partition(b"=")
        if key == b"size" or length <= 0:
            return False  # the size field is not the real size
        if key == b"path":
            name = value.decode("utf-8", "surrogateescape")
        position += length
    return name
