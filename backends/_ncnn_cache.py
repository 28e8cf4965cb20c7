"""A content-addressed cache of stages converted by pnnx for ncnn, on the shared verified
:class:`~hetsched._platform.files.ContentCache`.

Layout under the cache directory (``Device.options["cache_dir"]``, else ``HETSCHED_NCNN_CACHE``,
else ``$XDG_CACHE_HOME/hetsched/ncnn-cache``)::

    <kk>/<key>.param   the ncnn graph (text)
    <kk>/<key>.bin     the weights
    <kk>/<key>.json    the verdict: {"ok", "message", "seconds", "param_sha256", "bin_sha256", "accuracy"}

``key`` (:func:`stage_key`) is a sha256 over the prepared stage's bytes, the pnnx and ncnn
versions, the precision and this cache's format. Integrity is the shared cache's: everything
below the directory is reached without following links, and a success is only returned when the
``.param`` and ``.bin`` bytes hash to what its verdict recorded; a link or a mismatch is warned
about, counted (``rejected``), removed and converted again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched._errors import BackendError
from hetsched._platform.files import CacheStatistics, ContentCache

__all__ = ["CacheStatistics", "NcnnCache", "NcnnEntry", "default_cache_dir", "stage_key"]

_KEY_VERSION = 2
"""Bumped when what a key covers or how a converted stage is run changes (2: inputs in ncnn's own layout)."""


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


class NcnnCache(ContentCache):
    """Converted ncnn stages and verdicts under one directory; thread-safe, shareable by processes."""

    def lookup(self, key: str) -> NcnnEntry | None:
        """The verified entry (a hit is counted), or None: missing, unreadable, or rejected."""
        raw = self.read_entry(key, ".json")
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            ok, message, seconds = bool(data["ok"]), str(data["message"]), float(data["seconds"])
            acc = data.get("accuracy")
            accuracy = dict(acc) if isinstance(acc, dict) else None
            if not ok:
                self._count_hit(True)
                return NcnnEntry(False, message, seconds)
            param_sha, bin_sha = str(data["param_sha256"]), str(data["bin_sha256"])
        except (ValueError, KeyError, TypeError):
            return None
        param = self.read_entry(key, ".param", param_sha)
        weights = self.read_entry(key, ".bin", bin_sha) if param is not None else None
        if param is None or weights is None:
            return None
        self._count_hit(False)
        return NcnnEntry(True, message, seconds, param, weights, accuracy)

    def store(self, key: str, entry: NcnnEntry, *, conversion: bool = True) -> None:
        """Write an entry (files first, the verdict with their sha256 last); counts a conversion
        unless ``conversion`` is False (a probe's figures added to an entry read from the cache).

        :raises BackendError: the cache cannot be written.
        """
        if conversion:
            self._count_conversion(entry.seconds)
        data: dict[str, Any] = {"ok": entry.ok, "message": entry.message, "seconds": entry.seconds,
                                "created": time.time()}
        try:
            if entry.ok:
                data["param_sha256"] = self.write_entry(key, ".param", entry.param)
                data["bin_sha256"] = self.write_entry(key, ".bin", entry.bin)
            if entry.accuracy is not None:
                data["accuracy"] = dict(entry.accuracy)
            self.write_entry(key, ".json", json.dumps(data, indent=1).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the ncnn compile cache under {str(self.directory)!r}: {exc}") from exc
