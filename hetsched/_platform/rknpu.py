"""Rockchip NPU load and driver version (debugfs / procfs).

Layout::

    sys/kernel/debug/rknpu/load      "NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\\n"  (root-only)
    proc/rknpu/load                  the same with CONFIG_ROCKCHIP_RKNPU_PROC_FS
    sys/kernel/debug/rknpu/version   "RKNPU driver: v0.9.8"
    sys/module/rknpu/version         "0.9.8" (readable without root)
"""

from __future__ import annotations

import re

from ._fs import SysfsRoot

__all__ = ["NPU_LOAD_PATHS", "find_npu_load_path", "parse_npu_load", "parse_npu_version", "read_npu_version"]

NPU_LOAD_PATHS = ("sys/kernel/debug/rknpu/load", "proc/rknpu/load")
# Bounded digit runs: int() of a runaway digit string raises (Python caps conversions at 4300 digits).
_CORE_RE = re.compile(r"Core(\d{1,6}):\s*(\d{1,6})%")
_VERSION_RE = re.compile(r"v?(\d+(?:\.\d+)+)")


def parse_npu_load(text: str | None) -> tuple[float, ...]:
    """``"NPU load:  Core0:  0%, Core1: 37%, ..."`` -> per-core busy fractions ``(0.0, 0.37, ...)``.

    Cores come back in core-number order; an unparsable string gives ``()``.
    """
    if not text:
        return ()
    cores = sorted((int(c), min(int(p), 100)) for c, p in _CORE_RE.findall(text))
    return tuple(p / 100.0 for _, p in cores)


def parse_npu_version(text: str | None) -> str | None:
    """``"RKNPU driver: v0.9.8"`` or ``"0.9.8"`` -> ``"0.9.8"``."""
    if not text:
        return None
    m = _VERSION_RE.search(text)
    return m.group(1) if m else None


def find_npu_load_path(fs: SysfsRoot) -> str | None:
    for rel in NPU_LOAD_PATHS:
        if fs.exists(rel):
            return fs.realpath(rel)
    return None


def read_npu_version(fs: SysfsRoot) -> str | None:
    """Driver version from debugfs, else the unprivileged module file; None if neither is readable."""
    for rel in ("sys/kernel/debug/rknpu/version", "sys/module/rknpu/version"):
        try:
            version = parse_npu_version(fs.read_text(rel))
        except PermissionError:
            continue
        if version:
            return version
    return None
