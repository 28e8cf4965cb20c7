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
renamed into place, so a reader sees a whole entry or none.

Integrity (:class:`~hetsched._platform.files.ContentCache`): nothing below the cache directory is
reached through a link (a ``<kk>`` folder or a file replaced by a link is never followed, read
or written through), and content is verified, not its size: the ``.onnx`` against the sha256 of
the prepared stage the caller holds, the ``.rknn`` against the ``rknn_sha256`` its verdict
recorded. A bad entry is logged as a warning, counted (``rejected``), removed and converted
again. A refusal read back from the cache says so and names its verdict file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import BackendError
from .._platform.files import CacheStatistics, ContentCache, read_regular_file

__all__ = [
    "CacheStatistics",
    "CompileCache",
    "Verdict",
    "calibration_hash",
    "default_cache_dir",
    "stage_key",
]

_KEY_VERSION = 1
_RKNN_SHA = "rknn_sha256"
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
    :raises NotRegularFileError: one of them is a FIFO, device or directory (nothing read from it).
    """
    if dataset is None:
        return None
    h = hashlib.sha256()
    path = Path(dataset)
    try:
        text = read_regular_file(path, what="calibration dataset").decode("utf-8", "replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        for line in lines:
            for item in line.split():  # a line lists one .npy per model input
                p = Path(item) if os.path.isabs(item) else path.parent / item
                h.update(len(item).to_bytes(4, "little"))
                h.update(read_regular_file(p, what="calibration file"))
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
    cached_from: str | None = field(default=None, compare=False)
    """The verdict file this was read from (:meth:`CompileCache.lookup`); None for a fresh one.
    A refusal read from the cache has ``message`` saying so, naming this file, then the toolkit's
    words; ``toolkit_message`` keeps them alone."""
    toolkit_message: str = field(default="", compare=False)

    def to_json(self, **extra: Any) -> str:
        data: dict[str, Any] = {"ok": self.ok, "message": self.toolkit_message or self.message,
                                "seconds": self.seconds, "toolkit_version": self.toolkit_version,
                                "target": self.target, "created": time.time(), **extra}
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
        """Store the prepared stage model (unless a regular file with the same bytes is there:
        verified by sha256, a link or other bytes are replaced with a warning) and return its path.

        :raises BackendError: the cache directory cannot be written.
        """
        try:
            if self.read_entry(key, ".onnx", hashlib.sha256(model_bytes).hexdigest()) is None:
                self.write_entry(key, ".onnx", model_bytes)
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc
        return self.onnx_path(key)

    def temp_rknn_path(self, key: str) -> Path:
        """A fresh name beside the ``.rknn`` entry for the toolkit to export to (then :meth:`store`).

        :raises BackendError: the cache directory cannot be written.
        """
        try:
            return self.entry_temp_path(key, ".rknn")
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc

    def _verdict_data(self, key: str) -> dict[str, Any] | None:
        raw = self.read_entry(key, ".json")
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def lookup(self, key: str) -> Verdict | None:
        """The stored verdict, or None (no entry, an unreadable one, a success whose ``.rknn`` is
        gone, is a link or does not hash to the ``rknn_sha256`` its verdict recorded: the last
        two are warned about and removed); a hit is counted. A refusal's ``message`` says it is
        cached and names the verdict file."""
        data = self._verdict_data(key)
        if data is None:
            return None
        try:
            accuracy = data.get("accuracy")
            verdict = Verdict(bool(data["ok"]), str(data["message"]), float(data["seconds"]),
                              str(data["toolkit_version"]), str(data["target"]),
                              dict(accuracy) if isinstance(accuracy, dict) else None)
        except (ValueError, KeyError, TypeError):
            return None
        path = str(self.verdict_path(key))
        if verdict.ok:
            sha = data.get(_RKNN_SHA)
            if not isinstance(sha, str) or not self.verify_entry(key, ".rknn", sha):
                return None  # from before hashes were recorded, or gone/bad: converted again
            verdict = dataclasses.replace(verdict, cached_from=path)
        else:
            verdict = dataclasses.replace(
                verdict, cached_from=path, toolkit_message=verdict.message,
                message=f"refused by rknn-toolkit2 {verdict.toolkit_version or '(unknown version)'} on an earlier "
                        f"conversion (a cached refusal, {path}; delete it to try again): {verdict.message}")
        self._count_hit(not verdict.ok)
        return verdict

    def store(self, key: str, verdict: Verdict, exported: Path | None = None) -> None:
        """Record a conversion: move ``exported`` (from :meth:`temp_rknn_path`) into place, then write
        the verdict with the ``.rknn``'s sha256 (last, so a verdict never names a missing file);
        counts a conversion.

        :raises BackendError: the cache directory cannot be written.
        """
        self._count_conversion(verdict.seconds)
        extra: dict[str, Any] = {}
        try:
            if exported is not None:
                if verdict.ok:
                    extra[_RKNN_SHA] = self.adopt_entry(key, ".rknn", exported)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(exported)
            elif verdict.ok:
                sha = self.entry_sha256(key, ".rknn")
                if sha is not None:
                    extra[_RKNN_SHA] = sha
            self.write_entry(key, ".json", verdict.to_json(**extra).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc

    def record_accuracy(self, key: str, accuracy: Mapping[str, Any]) -> None:
        """Add a measured accuracy to the stored success ``key`` (no entry, or a refusal: nothing);
        not a conversion, not a hit.

        :raises BackendError: the cache directory cannot be written.
        """
        data = self._verdict_data(key)
        if data is None or not data.get("ok"):
            return  # gone or being replaced: the next compile measures again
        data["accuracy"] = dict(accuracy)
        try:
            self.write_entry(key, ".json", json.dumps(data, indent=1).encode())
        except OSError as exc:
            raise BackendError(f"cannot write the RKNN compile cache under {str(self.directory)!r}: {exc}") from exc
