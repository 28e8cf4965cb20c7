"""A content-addressed cache of stages converted by Rockchip's toolkit.

Layout under the cache directory (``Device.options["cache_dir"]``, else ``HETSCHED_RKNN_CACHE``,
else ``$XDG_CACHE_HOME/hetsched/rknn-cache``, ``~/.cache`` when XDG_CACHE_HOME is unset)::

    <kk>/<key>.onnx     the prepared stage model (what the toolkit converts; a simulator context
                        is built from it again, since the simulator cannot run a loaded .rknn)
    <kk>/<key>.rknn     the converted stage, for the board (rknn-toolkit-lite2 loads it)
    <kk>/<key>.json     the verdict: {"ok": bool, "message": str, "seconds": float, ...,
                        "accuracy": {...} once measured (see :meth:`CompileCache.record_accuracy`)}

``key`` is a sha256 over everything that changes the conversion (:func:`stage_key`), ``kk`` its
first two hex digits. Every file is written to a temporary name in its final directory and
renamed into place, so a reader sees a whole entry or none, and nothing is written outside
the cache directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import BackendError
from .._platform.files import CacheStatistics, ContentCache
from .._platform.files import atomic_write as _atomic_write

__all__ = [
    "CacheStatistics",
    "CompileCache",
    "Verdict",
    "calibration_hash",
    "default_cache_dir",
    "stage_key",
]

_KEY_VERSION = 1
"""Bumped when what a key covers changes, so old entries are never read under a new meaning."""


def default_cache_dir(options: Mapping[str, Any] | None = None) -> Path:
    """Where converted stages are kept: ``options["cache_dir"]``, else ``$HETSCHED_RKNN_CACHE``, else
    ``$XDG_CACHE_HOME/hetsched/rknn-cache`` (``~/.cache/hetsched/rknn-cache``)."""
    given = (options or {}).get("cache_dir") or os.environ.get("HETSCHED_RKNN_CACHE")
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hetsched" / "rknn-cache"


def calibration_hash(dataset: str | os.PathLike[str] | None) -> str | None:
    """sha256 over a toolkit dataset file (a text file listing ``.npy`` paths) and every file it lists,
    in order; None without a dataset.

    :raises BackendError: the dataset file or a file it lists cannot be read.
    """
    if dataset is None:
        return None
    h = hashlib.sha256()
    path = Path(dataset)
    try:
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
        for line in lines:
            for item in line.split():  # a line lists one .npy per model input
                p = Path(item) if os.path.isabs(item) else path.parent / item
                h.update(len(item).to_bytes(4, "little"))
                h.update(p.read_bytes())
    except OSError as exc:
        raise BackendError(f"cannot read the calibration dataset {str(path)!r}: {exc}") from exc
    return h.hexdigest()


def stage_key(
    model_bytes: bytes,
    *,
    toolkit_version: str,
    target: str,
    float_dtype: str,
    quantize: bool = False,
    quantized_dtype: str | None = None,
    quantized_algorithm: str | None = None,
    calibration: str | None = None,
) -> str:
    """The cache key (64 hex digits) of converting ``model_bytes`` (a prepared, serialized stage)
    with these settings; ``calibration`` is :func:`calibration_hash` of the dataset."""
    h = hashlib.sha256()
    h.update(hashlib.sha256(model_bytes).digest())
    settings = {
        "v": _KEY_VERSION, "toolkit": toolkit_version, "target": target, "float_dtype": float_dtype,
        "quantize": bool(quantize), "quantized_dtype": quantized_dtype if quantize else None,
        "quantized_algorithm": quantized_algorithm if quantize else None,
        "calibration": calibration if quantize else None,
    }
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Verdict:
    """What the toolkit said about one conversion."""

    ok: bool
    message: str
    """The toolkit's own error text when not ``ok`` ("" when ok)."""
    seconds: float
    """How long the conversion took."""
    toolkit_version: str
    target: str
    accuracy: Mapping[str, Any] | None = None
    """The converted stage's accuracy as measured on its first compile (None: not measured yet)."""

    def to_json(self) -> str:
        data: dict[str, Any] = {"ok": self.ok, "message": self.message, "seconds": self.seconds,
                                "toolkit_version": self.toolkit_version, "target": self.target,
                                "created": time.time()}
        if self.accuracy is not None:
            data["accuracy"] = dict(self.accuracy)
        return json.dumps(data, indent=1)


class CompileCache(ContentCache):
    """The converted stages and verdicts under one directory, with counters. Thread-safe; several
    processes may share a directory (entries are replaced whole)."""

    def onnx_path(self, key: str) -> Path:
        return self._entry(key, ".onnx")

    def rknn_path(self, key: str) -> Path:
        return self._entry(key, ".rknn")

    def verdict_path(self, key: str) -> Path:
        return self._entry(key, ".json")

    def put_model(self, key: str, model_bytes: bytes) -> Path:
        """Store the prepared stage model (unless the same bytes are there) and return its path.

        :raises BackendError: the cache directory cannot be written.
        """
        path = self.onnx_path(key)
        try:
            if not (path.is_file() and path.stat().st_size == len(model_bytes)):
                _atomic_write(path, model_bytes)
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc
        return path

    def temp_rknn_path(self, key: str) -> Path:
        """A fresh name beside the ``.rknn`` entry for the toolkit to export to (then :meth:`store`)."""
        final = self.rknn_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        return Path(tmp)

    def lookup(self, key: str) -> Verdict | None:
        """The stored verdict, or None (no entry, an unreadable one, or a success whose ``.rknn``
        is gone); a hit is counted."""
        try:
            data = json.loads(self.verdict_path(key).read_text())
            accuracy = data.get("accuracy")
            verdict = Verdict(bool(data["ok"]), str(data["message"]), float(data["seconds"]),
                              str(data["toolkit_version"]), str(data["target"]),
                              dict(accuracy) if isinstance(accuracy, dict) else None)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if verdict.ok and not self.rknn_path(key).is_file():
            return None
        self._count_hit(not verdict.ok)
        return verdict

    def store(self, key: str, verdict: Verdict, exported: Path | None = None) -> None:
        """Record a conversion: move ``exported`` (from :meth:`temp_rknn_path`) into place, then write
        the verdict (last, so a verdict never names a missing file); counts a conversion.

        :raises BackendError: the cache directory cannot be written.
        """
        self._count_conversion(verdict.seconds)
        try:
            if exported is not None:
                if verdict.ok:
                    os.replace(exported, self.rknn_path(key))
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(exported)
            _atomic_write(self.verdict_path(key), verdict.to_json().encode())
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc

    def record_accuracy(self, key: str, accuracy: Mapping[str, Any]) -> None:
        """Add a measured accuracy to the stored success ``key`` (no entry, or a refusal: nothing);
        not a conversion, not a hit.

        :raises BackendError: the cache directory cannot be written.
        """
        path = self.verdict_path(key)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # gone or being replaced: the next compile measures again
        if not isinstance(data, dict) or not data.get("ok"):
            return
        data["accuracy"] = dict(accuracy)
        try:
            _atomic_write(path, json.dumps(data, indent=1).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc
