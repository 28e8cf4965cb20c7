"""CPU backend: onnxruntime's CPU execution provider, pinned to the device's cores."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from hetsched._errors import CompileError, StageExecutionError

from ._base import Backend, Capabilities, CompiledStage, Device

__all__ = ["CpuBackend", "CpuStage", "intra_op_affinities", "pin_current_thread"]


def intra_op_affinities(cpus: Sequence[int]) -> str | None:
    """onnxruntime's ``session.intra_op_thread_affinities`` value for these cores.

    onnxruntime numbers processors from **1** (id N is logical CPU N-1) and wants one
    entry per intra-op thread *except* the calling thread, which it does not pin: the
    worker thread that calls ``run`` is pinned separately (to ``cpus[0]``'s set), so the
    entries cover ``cpus[1:]``, one core each, ``;``-separated.
    """
    if len(cpus) <= 1:
        return None
    return ";".join(str(c + 1) for c in cpus[1:])


def pin_current_thread(cpus: Sequence[int]) -> set[int] | None:
    """Pin the calling thread to ``cpus``; returns the previous affinity (None if unsupported)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    return previous


class CpuStage:
    """One ``InferenceSession`` for one stage."""

    def __init__(self, session: ort.InferenceSession, name: str, device: Device):
        self._session = session
        self.name = name
        self.device = device
        self.input_names = tuple(i.name for i in session.get_inputs())
        self.output_names = tuple(o.name for o in session.get_outputs())
        self._run_options = ort.RunOptions()

    @property
    def session(self) -> ort.InferenceSession:
        return self._session

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self._session.run(None, dict(feeds), self._run_options)
        except Exception as exc:  # onnxruntime raises several unrelated types
            raise StageExecutionError(
                f"stage {self.name!r} failed on device {self.device.name!r}: {exc}",
                stage=self.name,
                device=self.device.name,
            ) from exc

    def close(self) -> None:
        # InferenceSession has no close(); dropping the reference frees it.
        self._session = None  # type: ignore[assignment]


class CpuBackend:
    """onnxruntime CPU EP. Options (``Device.options``): ``allow_spinning`` (bool),
    ``graph_optimization_level`` (an ``ort.GraphOptimizationLevel``)."""

    name = "cpu"

    def capabilities(self, device: Device) -> Capabilities:
        # The CPU EP implements (nearly) every standard op; what it lacks fails at compile
        # time with a CompileError naming the stage, exactly as bare onnxruntime would fail.
        return Capabilities.everything()

    def session_options(self, device: Device) -> ort.SessionOptions:
        so = ort.SessionOptions()
        threads = max(1, len(device.cpus))
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        aff = intra_op_affinities(device.cpus)
        if aff is not None:
            so.add_session_config_entry("session.intra_op_thread_affinities", aff)
        spinning = device.options.get("allow_spinning")
        if spinning is not None:
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        level = device.options.get("graph_optimization_level")
        if level is not None:
            so.graph_optimization_level = level
        so.log_severity_level = 3
        return so

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        try:
            session = ort.InferenceSession(
                model.SerializeToString(),
                sess_options=self.session_options(device),
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:
            raise CompileError(f"onnxruntime could not compile stage {name!r} for {device.name!r}: {exc}") from exc
        return CpuStage(session, name, device)


backend_class: type[Any] = CpuBackend
_check: type[Backend] = CpuBackend  # static check that CpuBackend satisfies the protocol
