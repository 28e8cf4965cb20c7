"""The board path of the RKNN backend: rknn-toolkit-lite2 runs a converted ``.rknn`` in-process.

Kept thin on purpose: preparation, the compile cache and capabilities are the simulator
path's (``backends/rknn.py``). **It cannot run on this project's CI** (x86-64: lite2 has
aarch64 wheels only and refuses to run without an NPU, "does not support simulator"), so
it follows rknn-toolkit-lite2's documented API (airockchip/rknn-toolkit2,
``rknn-toolkit-lite2/examples``): ``RKNNLite()`` -> ``load_rknn(path)`` ->
``init_runtime(core_mask=...)`` -> ``inference(inputs=[...], data_format="nchw")`` -> ``release()``,
one ``RKNNLite`` per worker thread with its core mask (as leafqycc/rknn-multi-threaded does).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetsched._errors import BackendUnavailableError, StageExecutionError

from ._base import Device, StageHooks, TensorSpec, WorkerInfo

__all__ = ["NPU_CORES", "NPU_CORE_AUTO", "LiteStage", "core_mask_for", "load_lite"]

NPU_CORES = 3
"""NPU cores of the RK3588 (Rockchip RK3588 datasheet: a 6 TOPS NPU of three cores)."""

NPU_CORE_AUTO = 0
"""rknn-toolkit-lite2's ``RKNNLite.NPU_CORE_AUTO``; core ``i`` alone is ``1 << i`` (``NPU_CORE_0``
= 1, ``NPU_CORE_1`` = 2, ``NPU_CORE_2`` = 4), ``NPU_CORE_0_1`` = 3, ``NPU_CORE_0_1_2`` = 7."""


def core_mask_for(device: Device, index: int, workers: int) -> int:
    """The core mask worker ``index`` of ``device`` runs with: core ``index`` for ``npu`` with
    per-core workers, else the device's mask as given."""
    given = int(device.options.get("core_mask", NPU_CORE_AUTO))
    if given == NPU_CORE_AUTO and workers > 1:
        return 1 << (index % NPU_CORES)
    return given


def load_lite() -> Any:
    """The ``rknnlite.api`` module.

    :raises BackendUnavailableError: rknn-toolkit-lite2 is not installed (names the extra).
    """
    try:
        import rknnlite.api as lite  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BackendUnavailableError(
            "the RKNN backend on a board needs rknn-toolkit-lite2 (import rknnlite.api failed: "
            f"{exc}); install it with pip install 'hetsched[rknn]' (aarch64 only) and librknnrt.so"
        ) from exc
    return lite


class LiteStage:
    """A converted stage on the board's NPU: one ``RKNNLite`` context per worker thread.

    lite2's Python ``inference`` returns new arrays (no user-owned output memory), so
    :meth:`run_into` copies them into the runtime's buffers.
    """

    def __init__(self, lite: Any, rknn_path: Path, name: str, device: Device,
                 specs: tuple[list[str], list[TensorSpec], list[str], list[TensorSpec]], workers: int):
        self._lite = lite
        self.rknn_path = rknn_path
        self.name = name
        self.device = device
        in_names, self._in_specs, out_names, self._out_specs = specs
        self.input_names = tuple(in_names)
        self.output_names = tuple(out_names)
        self._workers = workers
        self._local = threading.local()
        self.hooks = StageHooks(in_place=self, worker_state=self)

    def _error(self, what: str, exc: BaseException | None = None) -> StageExecutionError:
        err = StageExecutionError(f"stage {self.name!r} failed on device {self.device.name!r}: {what}",
                                  stage=self.name, device=self.device.name)
        err.__cause__ = exc
        return err

    def worker_state(self, worker: WorkerInfo) -> Any:
        """An ``RKNNLite`` with the ``.rknn`` loaded and the worker's core mask.

        :raises StageExecutionError: lite2 could not load the file or start the runtime.
        """
        r = self._lite.RKNNLite(verbose=False)
        if r.load_rknn(str(self.rknn_path)) != 0:
            r.release()
            raise self._error(f"RKNNLite.load_rknn({str(self.rknn_path)!r}) failed")
        mask = core_mask_for(self.device, worker.index, self._workers)
        if r.init_runtime(core_mask=mask) != 0:
            r.release()
            raise self._error(f"RKNNLite.init_runtime(core_mask={mask}) failed")
        return r

    def close_worker_state(self, state: object) -> None:
        release = getattr(state, "release", None)
        if callable(release):
            release()

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._out_specs)

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        ctx: Any = state if state is not None else self._thread_context()
        try:
            inputs = [np.ascontiguousarray(feeds[n], dtype=dt) for n, (dt, _s) in zip(self.input_names,
                                                                                      self._in_specs, strict=True)]
            outs = ctx.inference(inputs=inputs, data_format="nchw")
        except Exception as exc:  # lite2 raises several unrelated types
            raise self._error(str(exc), exc) from exc
        if outs is None:
            raise self._error("RKNNLite.inference returned no outputs")
        return [np.asarray(o, dtype=dt).reshape(shape) for o, (dt, shape) in zip(outs, self._out_specs, strict=True)]

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], state: object = None) -> None:
        for dst, src in zip(outputs, self.run(feeds, state=state), strict=True):
            dst[...] = src

    def _thread_context(self) -> Any:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = self.worker_state(WorkerInfo(self.device.name, 0, ()))
        return ctx

    def close(self) -> None:
        ctx = getattr(self._local, "ctx", None)
        if ctx is not None:
            self._local.ctx = None
            self.close_worker_state(ctx)
