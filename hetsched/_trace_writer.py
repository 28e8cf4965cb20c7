"""The file side of a session trace: Chrome trace event JSON, written incrementally.

:class:`TraceWriter` keeps a bounded buffer of events that hooks (device worker threads, compile
threads, the event loop) append to under a lock, and a writer thread of its own that encodes
and appends them to the file, by size or every ``flush_period_s``. No hook ever waits for the
disk. The file is always an unfinished prefix of::

    {"displayTimeUnit": "ms", "traceEvents": [
    {...},
    {...}
    ],
    "otherData": {...}}

and :meth:`TraceWriter.close` writes the tail, so it is valid JSON once closed (the session
closes it on every exit path: normal exit, error, cancellation, SIGTERM through the CLI).
When the disk cannot keep up, events beyond ``max_buffered`` are dropped and counted (in
``otherData.dropped_events`` and :meth:`statistics`): memory stays bounded.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["TraceStatistics", "TraceWriter"]


@dataclass(frozen=True, slots=True)
class TraceStatistics:
    """Counters of one trace file."""

    path: str
    open: bool
    events_written: int
    events_dropped: int
    """Events not written because the buffer was full (the disk did not keep up)."""
    flushes: int
    bytes_written: int
    error: str | None
    """The write error that stopped the trace early (the file then ends where it failed)."""


def _finite(obj: Any) -> Any:
    """``obj`` with NaN/inf replaced by None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _dumps(obj: Any) -> str:
    try:
        return json.dumps(obj, allow_nan=False, default=str, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, default=str, separators=(",", ":"))


class TraceWriter:
    """Writes one trace file (see the module docstring). Thread-safe :meth:`emit`.

    :param path: the file (created or truncated by :meth:`open`).
    :param flush_events: wake the writer thread when this many events wait.
    :param max_buffered: most events held in memory; more are dropped and counted.
    :param flush_period_s: the writer thread also writes whatever waits this often.
    :raises ValueError: a bound is not positive.
    """

    def __init__(self, path: str | os.PathLike[str], *, flush_events: int = 1024, max_buffered: int = 1 << 16,
                 flush_period_s: float = 0.25):
        if flush_events < 1 or max_buffered < flush_events or not flush_period_s > 0:
            raise ValueError(f"trace buffer bounds must be positive with max_buffered >= flush_events, got "
                             f"flush_events={flush_events}, max_buffered={max_buffered}, "
                             f"flush_period_s={flush_period_s}")
        self.path = os.fspath(path)
        self._flush_events = flush_events
        self._max = max_buffered
        self._period = flush_period_s
        self._cond = threading.Condition()
        self._buf: list[dict[str, Any]] = []
        self._open = False
        self._stopping = False
        self._file: TextIO | None = None
        self._thread: threading.Thread | None = None
        self._first = True
        self._written = 0
        self._dropped = 0
        self._flushes = 0
        self._bytes = 0
        self._error: str | None = None

    def open(self) -> None:
        """Create the file, write its head and start the writer thread.

        :raises OSError: the file cannot be created (the message names it).
        """
        f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close(), on every exit path)
        head = '{"displayTimeUnit":"ms","traceEvents":[\n'
        f.write(head)
        f.flush()
        with self._cond:
            self._file, self._open, self._stopping, self._first = f, True, False, True
            self._buf = []
            self._written = self._dropped = self._flushes = 0
            self._bytes = len(head)
            self._error = None
        self._thread = threading.Thread(target=self._run, name="hetsched-trace-writer", daemon=True)
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event (any thread; never blocks on the disk). Dropped once closed or full."""
        with self._cond:
            if not self._open:
                return
            if len(self._buf) >= self._max:
                self._dropped += 1
                return
            self._buf.append(event)
            if len(self._buf) == self._flush_events:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and len(self._buf) < self._flush_events:
                    self._cond.wait(self._period)
                batch, self._buf = self._buf, []
                stopping = self._stopping
            self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        """Append ``batch`` (writer thread, or :meth:`close` after it stopped)."""
        f = self._file
        if not batch or f is None or self._error is not None:
            return
        parts = [("" if self._first and i == 0 else ",\n") + _dumps(ev) for i, ev in enumerate(batch)]
        text = "".join(parts)
        try:
            f.write(text)
            f.flush()
        except OSError as exc:
            with self._cond:
                self._error = f"writing {self.path} failed: {exc}"
                self._dropped += len(batch)
            return
        with self._cond:
            self._first = False
            self._written += len(batch)
            self._flushes += 1
            self._bytes += len(text)

    def close(self, other_data: dict[str, Any] | None = None) -> None:
        """Write what waits and the tail (``otherData`` with ``dropped_events``), close the
        file. Idempotent; never raises for a write error (see :attr:`TraceStatistics.error`)."""
        with self._cond:
            if not self._open:
                return
            self._open = False
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            rest, self._buf = self._buf, []
        self._write(rest)
        f, self._file = self._file, None
        if f is None:
            return
        other = {**(other_data or {}), "dropped_events": self._dropped, "events": self._written}
        if self._error is not None:
            other["write_error"] = self._error
        try:
            f.write("\n],\n\"otherData\":" + _dumps(other) + "}\n")
        except OSError as exc:
            self._error = self._error or f"writing {self.path} failed: {exc}"
        finally:
            f.close()

    def statistics(self) -> TraceStatistics:
        with self._cond:
            return TraceStatistics(self.path, self._open, self._written, self._dropped, self._flushes,
                                   self._bytes, self._error)
