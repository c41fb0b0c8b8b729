"""Data sets kept loaded in a long-lived process (a sweep's slot) for the trials that follow.

Off unless the process asks for it (`keep_loaded`): a sweep's slot runs trial after trial, and
trials that read the same data (every configuration, every fold) find it already in memory.
Only in-memory sets are kept, the two most recently used, and they are shared read-only: a
fold or a trial's loader takes views and samples of them, never changes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

KEEP = 2
_enabled = False
_kept: OrderedDict[str, object] = OrderedDict()
counts = {"loads": 0, "hits": 0}  # while keeping: data sets read, and found already kept


def keep_loaded() -> None:
    """From now on, this process keeps the data sets it loads."""
    global _enabled
    _enabled = True


def loaded(key: str, load: Callable[[], object]):
    """The data set for `key`, loaded by `load` unless it is kept."""
    if not _enabled:
        return load()
    if key in _kept:
        _kept.move_to_end(key)
        counts["hits"] += 1
        return _kept[key]
    counts["loads"] += 1
    bundle = load()
    if getattr(bundle, "in_memory", False):
        _kept[key] = bundle
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
    return bundle
