"""Files hetsched owns outside any board tree (compile caches): written whole or not at all, kept
under content keys."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CacheStatistics", "ContentCache", "atomic_write"]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader (another process sharing the cache) sees the old file or the new
    one, never a part. The directory is created if missing.

    :raises OSError: the directory cannot be created or the file written (the temporary file
        is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class CacheStatistics:
    """Counters of a :class:`ContentCache` (a compile cache)."""

    conversions: int
    """Conversions or builds run (cache misses), refusals included."""
    cache_hits: int
    """Lookups the cache answered (a stored success or refusal)."""
    refusals_cached: int
    """Of ``cache_hits``, those that answered with a stored refusal (nothing tried)."""
    seconds: float
    """Seconds spent converting or building."""


class ContentCache:
    """Entries named by a content key (64 hex digits: a SHA-256) under one directory, two levels
    deep, with hit and conversion counters. Thread-safe; processes may share the directory
    (entries are replaced whole, :func:`atomic_write`). The compile caches of the vendor
    backends build on it."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._conversions = 0
        self._hits = 0
        self._refusals = 0
        self._seconds = 0.0

    def _entry(self, key: str, suffix: str) -> Path:
        """The path of ``key``'s file with ``suffix``.

        :raises ValueError: ``key`` is not 64 lowercase hex digits (never a path of its own).
        """
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.directory / key[:2] / f"{key}{suffix}"

    def _count_hit(self, refused: bool) -> None:
        with self._lock:
            self._hits += 1
            self._refusals += refused

    def _count_conversion(self, seconds: float) -> None:
        with self._lock:
            self._conversions += 1
            self._seconds += seconds

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(self._conversions, self._hits, self._refusals, self._seconds)
