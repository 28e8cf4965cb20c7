"""A content-addressed cache of serialized TensorRT engines (and of the stages TensorRT refused).

Layout under the cache directory (``Device.options["cache_dir"]``, else ``HETSCHED_TENSORRT_CACHE``,
else ``$XDG_CACHE_HOME/hetsched/tensorrt-cache``, ``~/.cache`` when XDG_CACHE_HOME is unset)::

    <kk>/<key>.engine   the serialized engine (``IHostMemory`` bytes)
    <kk>/<key>.json     the verdict: {"ok": bool, "message": str, "seconds": float, "engine_sha256": str}

``key`` is :func:`engine_cache_key`: engines are not portable across TensorRT, CUDA or driver
versions, GPU architectures, or between the GPU and a DLA core, so each of those is in the key
(../shared/reference/accelerators.md §2, "Engine cache key"). Files are written to a temporary
name in their final directory and renamed into place. Integrity is the shared compile-cache rule
(:class:`~hetsched._platform.files.ContentCache`): nothing below the directory is reached through a
link, an engine is returned only when its bytes hash to the ``engine_sha256`` its verdict
recorded, and a bad entry is warned about, counted (``rejected``), removed and built again.
RKNN's cache (``hetsched._rknn.cache``) is not reused: it is shaped around the toolkit's files
and lives in a layer this backend may not import.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetsched._errors import BackendError
from hetsched._platform.files import CacheStatistics, ContentCache

__all__ = ["EngineCache", "EngineCacheStatistics", "default_engine_cache_dir", "engine_cache_key"]

_KEY_VERSION = 1
"""Bumped when what a key covers changes, so old entries are never read under a new meaning."""


def default_engine_cache_dir(options: Mapping[str, Any] | None = None) -> Path:
    """``options["cache_dir"]``, else ``$HETSCHED_TENSORRT_CACHE``, else
    ``$XDG_CACHE_HOME/hetsched/tensorrt-cache`` (``~/.cache/hetsched/tensorrt-cache``)."""
    given = (options or {}).get("cache_dir") or os.environ.get("HETSCHED_TENSORRT_CACHE")
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hetsched" / "tensorrt-cache"


def engine_cache_key(
    model_bytes: bytes,
    *,
    tensorrt_version: str,
    cuda_version: int,
    driver_version: int,
    gpu_name: str,
    compute_capability: tuple[int, int],
    dla_core: int | None,
    precision: str,
    profiles: Sequence[tuple[str, Sequence[int], Sequence[int], Sequence[int]]] = (),
    workspace: int | None = None,
    compatibility: str = "",
    plugins: Sequence[str] = (),
) -> str:
    """The cache key (64 hex digits) of building ``model_bytes`` (the prepared, serialized stage)
    with these settings. ``profiles`` is ``(input, min, opt, max)`` per free input (order does not
    matter); ``cuda_version`` / ``driver_version`` are ``cudaRuntimeGetVersion`` /
    ``cudaDriverGetVersion``; ``compatibility`` names hardware/version-compatibility flags,
    ``plugins`` the plugin libraries loaded."""
    h = hashlib.sha256()
    h.update(hashlib.sha256(model_bytes).digest())
    settings = {
        "v": _KEY_VERSION, "tensorrt": tensorrt_version, "cuda": int(cuda_version), "driver": int(driver_version),
        "gpu": gpu_name, "sm": [int(compute_capability[0]), int(compute_capability[1])],
        "dla_core": dla_core, "precision": precision,
        "profiles": sorted([str(n), [int(x) for x in lo], [int(x) for x in opt], [int(x) for x in hi]]
                           for n, lo, opt, hi in profiles),
        "workspace": workspace, "compatibility": compatibility, "plugins": sorted(plugins),
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


EngineCacheStatistics = CacheStatistics
"""The engine cache's counters (``conversions`` are engine builds)."""


class EngineCache(ContentCache):
    """The engines under one directory, with counters. Thread-safe; processes may share it."""

    def engine_path(self, key: str) -> Path:
        return self._entry(key, ".engine")

    def lookup(self, key: str) -> bytes | str | None:
        """The stored engine (bytes, verified against its recorded sha256), the stored refusal (a
        message saying it is a cached refusal, naming the verdict file, then TensorRT's words), or
        None (no entry, an unreadable one, or a success whose engine is gone, a link, or other
        bytes: warned about and removed); a hit is counted.

        :raises ValueError: ``key`` is not a key (64 hex digits).
        """
        raw = self.read_entry(key, ".json")  # a bad key raises here
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            ok, message = bool(data["ok"]), str(data["message"])
            sha = data.get("engine_sha256") if ok else None
        except (ValueError, KeyError, TypeError):
            return None
        result: bytes | str
        if ok:
            if not isinstance(sha, str):
                return None  # from before hashes were recorded: built again
            engine = self.read_entry(key, ".engine", sha)
            if engine is None:
                return None
            result = engine
        else:
            result = (f"refused by TensorRT on an earlier build (a cached refusal, {self._entry(key, '.json')}; "
                      f"delete it to try again): {message}")
        self._count_hit(not ok)
        return result

    def store(self, key: str, engine: bytes | None, message: str, seconds: float) -> None:
        """Record a build: the engine (None: refused, with ``message``), then the verdict with the
        engine's sha256.

        :raises BackendError: the cache directory cannot be written.
        """
        self._count_conversion(seconds)
        verdict: dict[str, object] = {"ok": engine is not None, "message": message, "seconds": seconds}
        try:
            if engine is not None:
                verdict["engine_sha256"] = self.write_entry(key, ".engine", engine)
            self.write_entry(key, ".json", json.dumps(verdict, indent=1).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the TensorRT engine cache under {str(self.directory)!r}: {exc}") from exc
