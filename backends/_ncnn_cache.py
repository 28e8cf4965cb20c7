"""A content-addressed cache of stages converted by pnnx for ncnn, its content verified on read.

Layout under the cache directory (``Device.options["cache_dir"]``, else ``HETSCHED_NCNN_CACHE``,
else ``$XDG_CACHE_HOME/hetsched/ncnn-cache``)::

    <kk>/<key>.param   the ncnn graph (text)
    <kk>/<key>.bin     the weights
    <kk>/<key>.json    the verdict: {"ok", "message", "seconds", "param_sha256", "bin_sha256", ...}

``key`` (:func:`stage_key`) is a sha256 over the prepared stage's bytes, the pnnx and ncnn
versions and the precision. Integrity: the entry directory and every file are opened with
``O_NOFOLLOW`` relative to a descriptor of the directory (a symbolic link planted in place of
either is never followed: the entry is a miss and the write refused), and a success is only
returned when the ``.param`` and ``.bin`` bytes hash to what its verdict recorded (a tampered or
torn entry is a miss, counted in ``rejected``, and converted again). Files are written to a fresh
``O_EXCL`` name in the entry directory and renamed into place, so a reader sees whole files.
A shared, verified cache-entry helper would replace the two functions at the bottom.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched._errors import BackendError
from hetsched._platform.files import ContentCache

__all__ = ["NcnnCache", "NcnnCacheStatistics", "NcnnEntry", "default_cache_dir", "stage_key"]

_KEY_VERSION = 2
"""Bumped when what a key covers or how a converted stage is run changes (2: inputs in ncnn's own layout)."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_FILE = 1 << 31


def default_cache_dir(options: Mapping[str, Any] | None = None) -> Path:
    """``options["cache_dir"]``, else ``$HETSCHED_NCNN_CACHE``, else ``$XDG_CACHE_HOME/hetsched/ncnn-cache``."""
    given = (options or {}).get("cache_dir") or os.environ.get("HETSCHED_NCNN_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hetsched" / "ncnn-cache"


def stage_key(model_bytes: bytes, *, pnnx_version: str, ncnn_version: str, precision: str) -> str:
    h = hashlib.sha256()
    h.update(hashlib.sha256(model_bytes).digest())
    h.update(json.dumps({"v": _KEY_VERSION, "pnnx": pnnx_version, "ncnn": ncnn_version, "precision": precision},
                        sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class NcnnEntry:
    ok: bool
    message: str
    seconds: float
    param: bytes = b""
    bin: bytes = b""
    accuracy: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NcnnCacheStatistics:
    conversions: int
    cache_hits: int
    refusals_cached: int
    seconds: float
    rejected: int
    """Entries not used: content not matching its recorded sha256, or a link where a file or the
    entry directory should be."""


class NcnnCache(ContentCache):
    """Converted ncnn stages and verdicts under one directory; thread-safe, shareable by processes."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__(directory)
        self._rejected = 0
        self._rlock = threading.Lock()

    def _reject(self) -> None:
        with self._rlock:
            self._rejected += 1

    def ncnn_statistics(self) -> NcnnCacheStatistics:
        s = self.statistics()
        with self._rlock:
            return NcnnCacheStatistics(s.conversions, s.cache_hits, s.refusals_cached, s.seconds, self._rejected)

    def lookup(self, key: str) -> NcnnEntry | None:
        """The verified entry, or None (missing, unreadable, tampered, or reached through a link)."""
        path = self._entry(key, ".json")
        try:
            dfd = os.open(path.parent, _DIR)
        except OSError:
            if path.parent.is_symlink():
                self._reject()
            return None
        try:
            data = json.loads(_read_at(dfd, path.name))
            ok, message, seconds = bool(data["ok"]), str(data["message"]), float(data["seconds"])
            acc = data.get("accuracy")
            accuracy = dict(acc) if isinstance(acc, dict) else None
            if not ok:
                self._count_hit(True)
                return NcnnEntry(False, message, seconds)
            param = _read_at(dfd, f"{key}.param")
            weights = _read_at(dfd, f"{key}.bin")
            if (hashlib.sha256(param).hexdigest() != data["param_sha256"]
                    or hashlib.sha256(weights).hexdigest() != data["bin_sha256"]):
                self._reject()
                return None
        except _Link:
            self._reject()
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            os.close(dfd)
        self._count_hit(False)
        return NcnnEntry(True, message, seconds, param, weights, accuracy)

    def store(self, key: str, entry: NcnnEntry) -> None:
        """Write an entry (files first, verdict last); counts a conversion.

        :raises BackendError: the directory cannot be written, or a link stands where the entry
            directory or one of its files should be (nothing is written through it).
        """
        self._count_conversion(entry.seconds)
        path = self._entry(key, ".json")
        data: dict[str, Any] = {"ok": entry.ok, "message": entry.message, "seconds": entry.seconds,
                                "created": time.time()}
        if entry.ok:
            data["param_sha256"] = hashlib.sha256(entry.param).hexdigest()
            data["bin_sha256"] = hashlib.sha256(entry.bin).hexdigest()
        if entry.accuracy is not None:
            data["accuracy"] = dict(entry.accuracy)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path.parent)
            dfd = os.open(path.parent, _DIR)
        except OSError as exc:
            raise BackendError(f"cannot write the ncnn cache entry {str(path.parent)!r} (a link or not writable): "
                               f"{exc}") from exc
        try:
            if entry.ok:
                _write_at(dfd, f"{key}.param", entry.param)
                _write_at(dfd, f"{key}.bin", entry.bin)
            _write_at(dfd, path.name, json.dumps(data, indent=1).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the ncnn cache under {str(self.directory)!r}: {exc}") from exc
        finally:
            os.close(dfd)


class _Link(OSError):
    pass


def _read_at(dfd: int, name: str) -> bytes:
    """A regular file's bytes, opened relative to ``dfd`` without following a link.

    :raises _Link: ``name`` is a symbolic link (or not a regular file).
    """
    try:
        fd = os.open(name, _READ, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a link in the file's place
            raise _Link(str(exc)) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE:
            raise _Link(f"{name} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 22):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_at(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` to a fresh ``O_EXCL`` temporary name in ``dfd`` and rename it over ``name``
    (a link at ``name`` is replaced, never followed)."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _WRITE, 0o644, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
