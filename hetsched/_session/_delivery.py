"""Delivery: handing a finished request's outputs to its caller (:func:`deliver`, :class:`Outputs`).

Zero-copy contract:

* A stage whose outputs have static shapes (after shape inference) and a backend that
  runs in place (:class:`~hetsched.backends.BindableStage`; the CPU backend does, through
  onnxruntime IO binding) writes its outputs straight into pool buffers, and the next
  stage on the same memory domain reads that very memory. Other stages get
  backend-allocated outputs; ``statistics().unbound_stages`` names them and why.
* ``await s.run(feeds)`` returns arrays the caller owns. A stage whose outputs only the
  caller reads then lets the backend allocate them and they are handed over as they are:
  no pool buffer, no copy (onnxruntime hands its allocation to numpy). An output that lives
  in a pool buffer because a stage reads it too (or it crossed a memory domain) is copied
  **exactly once** into a fresh array, in the worker that finished the request, and its
  buffer goes back to the pool right away (``statistics().bytes_copied_to_caller``).
* ``await s.run(feeds, zero_copy=True)`` returns :class:`Outputs`: read-only views of the
  pool memory itself, no copy at all, valid until ``outputs.release()`` (or the end of
  ``with outputs:``). Outputs still unreleased when the session closes are reported as a
  :class:`~hetsched.BufferLeakError` naming the stage that produced them.

The copy of the second point is made by the scheduler when the request finishes
(``copy_out``); :func:`deliver` copies whatever is still pool-backed when it hands over.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .._errors import InputError, RuntimeStateError
from .._runtime._buffers import TensorBuffer
from .._runtime._scheduler import _MISSING

__all__ = ["Outputs", "deliver"]


class Outputs(Mapping[str, np.ndarray]):
    """A request's outputs as read-only views of pool memory (``run(..., zero_copy=True)``).

    ::

        with await s.run(feeds, zero_copy=True) as out:
            top5 = np.argsort(out["prob"][0])[-5:]      # reads the memory the last stage wrote
        # the buffers are back in the pool here: views taken above must not be used any more

    Iteration follows the requested output order, so ``list(out.values())`` is
    onnxruntime's list form. Arrays that were not pool-backed (a fed input passed through,
    a constant, a backend-allocated output) are included as they are. ``release()`` is
    idempotent and thread-safe; afterwards indexing raises :class:`RuntimeStateError`.
    """

    __slots__ = ("_arrays", "_buffers", "_lock")

    def __init__(self, arrays: dict[str, np.ndarray], buffers: list[TensorBuffer]):
        self._arrays: dict[str, np.ndarray] | None = arrays
        self._buffers = buffers
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        arrays = self._arrays
        if arrays is None:
            raise RuntimeStateError("these outputs were released; their memory is back in the pool")
        return arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays or {})

    def __len__(self) -> int:
        return len(self._arrays or {})

    @property
    def released(self) -> bool:
        return self._arrays is None

    @property
    def buffers(self) -> tuple[TensorBuffer, ...]:
        """The pool buffers behind the views (for ``ptr``/``export()``), until released."""
        return tuple(self._buffers)

    def copy(self) -> dict[str, np.ndarray]:
        """Arrays that own their memory (one copy each), valid after :meth:`release`."""
        return {k: np.array(v, copy=True) for k, v in self.items()}

    def release(self) -> None:
        """Give the buffers back to their pools (views become invalid)."""
        with self._lock:
            bufs, self._buffers, self._arrays = self._buffers, [], None
        for b in bufs:
            b.release()

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        if self._arrays is None:
            return "<Outputs released>"
        return f"<Outputs {list(self._arrays)} zero-copy, {len(self._buffers)} pool buffer(s)>"


def deliver(pairs: list[tuple[str, Any]], zero_copy: bool,
            constants: Mapping[str, Any]) -> tuple[dict[str, Any] | Outputs, int]:
    """The wanted ``(name, value)`` pairs of a finished request as the caller gets them, and
    the bytes copied out of pool buffers on the way (0 with ``zero_copy``).

    A value the request never produced (``_MISSING``) is a graph output that is an
    initializer (taken from ``constants``) or an optional input nobody fed.

    :raises InputError: a wanted output is an optional input that was not fed (every buffer
        in ``pairs`` is released first).
    """
    missing = [n for n, obj in pairs if obj is _MISSING and n not in constants]
    if missing:
        for _, obj in pairs:
            if type(obj) is TensorBuffer:
                obj.release()
        raise InputError(f"output {missing[0]!r} is an optional input that was not fed")
    out: dict[str, Any] = {}
    if zero_copy:
        bufs: list[TensorBuffer] = []
        for name, obj in pairs:
            if type(obj) is TensorBuffer:
                view = obj.array().view()
                view.flags.writeable = False
                out[name] = view
                bufs.append(obj)
            else:
                out[name] = constants[name] if obj is _MISSING else obj
        return Outputs(out, bufs), 0
    copied = 0
    for name, obj in pairs:
        if type(obj) is TensorBuffer:
            arr = obj.array().copy()  # the one documented copy; the buffer goes back to the pool
            obj.release()
            copied += arr.nbytes
            out[name] = arr
        else:
            out[name] = constants[name] if obj is _MISSING else obj
    return out, copied
