"""The manifest of a directory of stages converted offline (``hetsched compile ... --out DIR``).

``DIR`` is a compile cache (``cache`` module layout: ``<kk>/<key>.rknn`` ...) with a
``manifest.json`` beside the entries::

    {"format": 2, "model": str, "target": "rk3588", "toolkit_version": str,
     "stages": [{"name", "device", "model_sha256", "cache_key", "precision": "float16" | "int8",
                 "inputs": [{"name", "dtype", "shape"}], "outputs": [...],
                 "accuracy": {"min_cosine", "max_rel_error", "samples"} | null,
                 "rknn": "<kk>/<key>.rknn", "rknn_sha256": str}]}

On the board (no toolkit, so no toolkit version to rebuild a cache key from) a stage is found
by the sha256 of its prepared model, the target and the precision (:func:`select_entry`):
the board's session must split the model the same way (same ``--shape``) for a stage to match.
The board loads a ``.rknn`` only when it is a regular file (never through a link) hashing to the
``rknn_sha256`` the manifest recorded (format 1 manifests, which record none, are refused).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import CompileError
from .._platform.files import RejectedEntry, atomic_write, contained_sha256, read_regular_file

__all__ = ["MANIFEST", "ManifestEntry", "board_rknn_path", "model_sha256", "read_manifest", "select_entry",
           "write_manifest"]

MANIFEST = "manifest.json"
_FORMAT = 2


def model_sha256(model_bytes: bytes) -> str:
    """The hash a manifest names a prepared stage model by."""
    return hashlib.sha256(model_bytes).hexdigest()


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    device: str
    model_sha256: str
    cache_key: str
    precision: str
    target: str
    rknn: str
    """The ``.rknn`` file, relative to the manifest's directory."""
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    accuracy: Mapping[str, Any] | None = field(default=None)
    rknn_sha256: str = ""
    """The sha256 of the ``.rknn`` file ("" until :func:`write_manifest` hashes it)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "model_sha256": self.model_sha256,
                "cache_key": self.cache_key, "precision": self.precision, "target": self.target,
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "accuracy": dict(self.accuracy) if self.accuracy is not None else None, "rknn": self.rknn,
                "rknn_sha256": self.rknn_sha256}


def _rknn_sha256(entry: ManifestEntry, directory: str | os.PathLike[str]) -> str:
    """The sha256 of ``entry``'s ``.rknn``, read below ``directory`` without following a link.

    :raises CompileError: it is missing, a link, not a regular file, or names a path outside.
    """
    where = f"the manifest in {str(directory)!r} names {entry.rknn!r} for stage {entry.name!r}"
    try:
        return contained_sha256(directory, entry.rknn)
    except RejectedEntry as exc:
        raise CompileError(f"{where}, but {exc}: the board loads only a regular file inside the directory, "
                           "never through a link") from exc
    except FileNotFoundError as exc:
        raise CompileError(f"{where}, but the file is missing") from exc
    except OSError as exc:
        raise CompileError(f"{where}, but it cannot be read: {exc}") from exc


def write_manifest(directory: str | os.PathLike[str], entries: Sequence[ManifestEntry], *, model: str,
                   target: str, toolkit_version: str) -> Path:
    """Write ``directory/manifest.json`` (replaced whole) and return its path; each entry's
    ``rknn_sha256`` is that of its ``.rknn`` file now (read without following a link).

    :raises CompileError: an entry's ``.rknn`` is missing, a link, or not a cache entry's name.
    :raises OSError: the manifest cannot be written.
    """
    hashed = [dataclasses.replace(e, rknn_sha256=_rknn_sha256(e, directory)) for e in entries]
    data = {"format": _FORMAT, "model": model, "target": target, "toolkit_version": toolkit_version,
            "stages": [e.to_json() for e in hashed]}
    atomic_write(Path(directory) / MANIFEST, (json.dumps(data, indent=1) + "\n").encode())
    return Path(directory) / MANIFEST


def read_manifest(directory: str | os.PathLike[str]) -> list[ManifestEntry]:
    """The entries of ``directory/manifest.json``.

    :raises CompileError: there is no readable manifest (names the command that writes one).
    """
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(read_regular_file(path, what="RKNN manifest"))
        return [ManifestEntry(name=str(s["name"]), device=str(s["device"]), model_sha256=str(s["model_sha256"]),
                              cache_key=str(s["cache_key"]), precision=str(s["precision"]),
                              target=str(s.get("target", data.get("target", ""))), rknn=str(s["rknn"]),
                              inputs=tuple(s.get("inputs", ())), outputs=tuple(s.get("outputs", ())),
                              accuracy=s.get("accuracy"), rknn_sha256=str(s.get("rknn_sha256") or ""))
                for s in data["stages"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompileError(f"no readable {MANIFEST} in {str(directory)!r} ({exc}); convert the model on a PC "
                           "with 'hetsched compile MODEL --target rk3588 --out DIR' and point "
                           "HETSCHED_RKNN_CACHE at DIR") from exc


def select_entry(entries: Sequence[ManifestEntry], sha: str, *, target: str,
                 precision: str | None = None) -> ManifestEntry:
    """The entry converted from the stage model of hash ``sha`` for ``target``: of ``precision``
    when given, else float16 where there is one, else the only one.

    :raises CompileError: no entry matches (or several of other precisions and none given).
    """
    found = [e for e in entries if e.model_sha256 == sha and e.target == target]
    if precision is not None:
        found = [e for e in found if e.precision == precision]
    elif len(found) > 1:
        found = [e for e in found if e.precision == "float16"] or found[:0]
    if len(found) != 1:
        what = f"{len(found)} entries" if found else "no entry"
        raise CompileError(f"the manifest has {what} for this stage (model sha256 {sha[:12]}..., target {target}"
                           f"{', precision ' + precision if precision else ''}): was it compiled with the "
                           "same model and --shape?")
    return found[0]


def board_rknn_path(directory: str | os.PathLike[str], prepared: bytes, *, target: str,
                    precision: str | None = None) -> Path:
    """The ``.rknn`` file the board loads for a prepared stage model, from the manifest in
    ``directory``, verified: a regular file (not a link) whose bytes hash to the manifest's
    ``rknn_sha256``.

    :raises CompileError: no manifest, no matching entry, a manifest without hashes (format 1),
        or its file is missing, a link (never followed) or holds other bytes.
    """
    entry = select_entry(read_manifest(directory), model_sha256(prepared), target=target, precision=precision)
    where = f"the manifest in {str(directory)!r} names {entry.rknn!r} for stage {entry.name!r}"
    if not entry.rknn_sha256:
        raise CompileError(f"{where} without its sha256 (a manifest from an older hetsched): convert again with "
                           "'hetsched compile MODEL --target rk3588 --out DIR' so the board can verify the file")
    got = _rknn_sha256(entry, directory)
    if got != entry.rknn_sha256:
        raise CompileError(f"{where}, but its bytes do not hash to the manifest's sha256 "
                           f"({entry.rknn_sha256[:12]}..., the file: {got[:12]}...): it changed after conversion; "
                           "copy the directory from the PC again")
    path = Path(directory) / entry.rknn
    return path
