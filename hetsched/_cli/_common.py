"""Helpers shared by CLI subcommands."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from hetsched._planning.model import embedded_model, model_path

DEFAULT_MODEL = "light_squeezenet"


def light_model(name: str) -> Path:
    """A model shipped in the onnx wheel (``light_squeezenet``, ``light_resnet50``, ...)."""
    return embedded_model(name)


def resolve_model_arg(arg: str) -> Path:
    return model_path(arg)


def default_host_devices() -> list[str]:
    """Each host core alone plus all of them together (at most 4 single cores)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) == 1:
        return [f"cpu:{cpus[0]}"]
    singles = [f"cpu:{c}" for c in cpus[:4]]
    return [*singles, "cpu"]


def add_devices_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", nargs="+", metavar="SPEC",
                   help="device specs: cpu, cpu:N, cpu:N-M, cpu:N,M, big, little, clusters "
                        "(default: each host core plus all cores)")
    p.add_argument("--policy", default="power-thermal",
                   help="power-thermal (default), heft, random[:SEED], pinned:DEVICE, or an entry point name")
    p.add_argument("--max-unit-nodes", type=int, default=None, metavar="N",
                   help="cut unit subgraphs to at most N nodes")


def random_feeds(session_inputs: Sequence[onnx.ValueInfoProto], seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for vi in session_inputs:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dt.kind == "f":
            feeds[vi.name] = rng.standard_normal(dims).astype(dt)
        else:
            feeds[vi.name] = rng.integers(0, 4, dims).astype(dt)
    return feeds


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal or forced)."""

    def __init__(self, total: int, *, enabled: bool | None = None, label: str = "requests"):
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label = label
        self.done = 0
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        width = 30
        filled = int(width * self.done / max(1, self.total))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.label}")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
