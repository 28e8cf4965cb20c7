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

When a write fails (``ENOSPC``: the disk is full), nothing more is written but the ending: the
file is cut back (``ftruncate``, which needs no space) to the end of the last whole event, then
:meth:`TraceWriter.close` writes the tail there, with ``otherData.write_error`` saying what was
lost, so the file is valid JSON; where the tail does not fit, the fewest whole events from the
end that make room for it are given up (of the last :data:`_KEEP_ENDS`; none when that is not enough). Where even that fails, the file is cut back
to the last whole event, and :attr:`TraceWriter.failure` says at which byte and after how
many events it stops (a cut trace ``hetsched plot`` still reads). Either way
:attr:`TraceWriter.failure` holds a :class:`~hetsched.TraceWriteError` naming the file, which
the session raises when it closes (after every request was answered).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from .._errors import TraceWriteError

__all__ = ["TraceStatistics", "TraceWriter"]

_KEEP_ENDS = 4096
"""How many of the last events' end offsets a writer remembers, to give them up for room for the
tail on a full disk."""


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
    """The write error that stopped the trace early (see :attr:`TraceWriter.failure`)."""


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


def _open_binary(path: str) -> BinaryIO:
    return open(path, "wb", buffering=0)  # closed by close(), on every exit path


class TraceWriter:
    """Writes one trace file (see the module docstring). Thread-safe :meth:`emit`.

    :param path: the file (created or truncated by :meth:`open`).
    :param flush_events: wake the writer thread when this many events wait.
    :param max_buffered: most events held in memory; more are dropped and counted.
    :param flush_period_s: the writer thread also writes whatever waits this often.
    :param opener: opens ``path`` for writing, unbuffered (``write`` may write part and return
        the count, ``truncate``, ``seek``, ``close``; default: the file, unbuffered); injected by
        tests to fail like a full disk.
    :raises ValueError: a bound is not positive.
    """

    def __init__(self, path: str | os.PathLike[str], *, flush_events: int = 1024, max_buffered: int = 1 << 16,
                 flush_period_s: float = 0.25, opener: Callable[[str], BinaryIO] | None = None):
        if flush_events < 1 or max_buffered < flush_events or not flush_period_s > 0:
            raise ValueError(f"trace buffer bounds must be positive with max_buffered >= flush_events, got "
                             f"flush_events={flush_events}, max_buffered={max_buffered}, "
                             f"flush_period_s={flush_period_s}")
        self.path = os.fspath(path)
        self._flush_events = flush_events
        self._max = max_buffered
        self._period = flush_period_s
        self._opener = opener
        self._cond = threading.Condition()
        self._buf: list[dict[str, Any]] = []
        self._open = False
        self._stopping = False
        self._file: BinaryIO | None = None
        self._thread: threading.Thread | None = None
        self._first = True
        self._written = 0
        self._dropped = 0
        self._flushes = 0
        self._bytes = 0
        self._error: str | None = None
        self._cause: OSError | None = None
        self._head = 0
        self._ends: deque[int] = deque(maxlen=_KEEP_ENDS)
        self.failure: TraceWriteError | None = None
        """Set by :meth:`close` when a write failed: the error to raise, naming the file and where
        it ends (None: the file was written whole)."""

    def open(self) -> None:
        """Create the file, write its head and start the writer thread.

        :raises OSError: the file cannot be created (``FileNotFoundError``: no such folder; the
            message names it).
        :raises TraceWriteError: its head cannot be written (a full disk; an ``OSError`` too).
        """
        head = b'{"displayTimeUnit":"ms","traceEvents":[\n'
        f = (self._opener or _open_binary)(self.path)
        try:
            self._write_all(f, head)
        except OSError as exc:
            with contextlib.suppress(OSError):
                f.close()
            raise TraceWriteError(f"cannot write the trace file {self.path!r}: {exc.strerror or exc}",
                                  path=self.path) from exc
        with self._cond:
            self._file, self._open, self._stopping, self._first = f, True, False, True
            self._buf = []
            self._written = self._dropped = self._flushes = 0
            self._bytes = self._head = len(head)
            self._ends.clear()
            self._error = None
            self._cause = None
            self.failure = None
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

    @staticmethod
    def _write_all(f: BinaryIO, data: bytes) -> None:
        """Write all of ``data``; on an error, the bytes written before it are in ``exc.written``."""
        view = memoryview(data)
        done = 0
        while done < len(data):
            try:
                n = f.write(view[done:])
            except OSError as err:
                err.written = done  # type: ignore[attr-defined]
                raise
            if not n:  # a raw file that took nothing: no progress will come
                full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                full.written = done  # type: ignore[attr-defined]
                raise full
            done += n

    def _cut_back(self, f: BinaryIO) -> None:
        """Truncate the file to the end of the last whole event (needs no disk space)."""
        with contextlib.suppress(OSError):
            f.truncate(self._bytes)
            f.seek(self._bytes)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        """Append ``batch`` (writer thread, or :meth:`close` after it stopped); after a failed write,
        the batch is dropped (counted) and the file cut back to the last whole event."""
        f = self._file
        if not batch or f is None:
            return
        if self._error is not None:
            with self._cond:
                self._dropped += len(batch)
            return
        parts = [(("" if self._first and i == 0 else ",\n") + _dumps(ev)).encode() for i, ev in enumerate(batch)]
        data = b"".join(parts)
        try:
            self._write_all(f, data)
        except OSError as exc:
            done = int(getattr(exc, "written", 0))
            whole, end = 0, 0
            for part in parts:  # the events that reached the disk whole stay
                if end + len(part) > done:
                    break
                end += len(part)
                whole += 1
                self._ends.append(self._bytes + end)
            with self._cond:
                self._first = self._first and whole == 0
                self._written += whole
                self._bytes += end
                self._dropped += len(batch) - whole
                self._error = f"writing {self.path} failed: {exc.strerror or exc}"
                self._cause = exc
            self._cut_back(f)
            return
        end = self._bytes
        for part in parts:
            end += len(part)
            self._ends.append(end)
        with self._cond:
            self._first = False
            self._written += len(batch)
            self._flushes += 1
            self._bytes += len(data)

    def close(self, other_data: dict[str, Any] | None = None) -> None:
        """Write what waits and the tail (``otherData`` with ``dropped_events``), close the
        file. Idempotent; never raises: a write error is kept in :attr:`failure` (and
        :attr:`TraceStatistics.error`)."""
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
        complete = False
        try:
            complete = self._write_tail(f, other_data or {})
        finally:
            try:
                f.close()
            except OSError as exc:  # a file system that reports a lost write only at close
                complete = False
                if self._error is None:
                    self._error = f"closing {self.path} failed: {exc.strerror or exc}"
                    self._cause = exc
        if self._error is not None:
            self.failure = self._failure(complete)

    def _write_tail(self, f: BinaryIO, other_data: dict[str, Any]) -> bool:
        """Write the tail at the end of the last whole event; on a full disk, give up whole events
        from the end (cutting the file back frees their space) until it fits. True: written."""
        while True:
            other = {**other_data, "dropped_events": self._dropped, "events": self._written}
            if self._error is not None:
                other["write_error"] = (f"{self._error}; the trace ends after {self._written} whole events, "
                                        f"{self._dropped} events were lost")
            tail = ("\n],\n\"otherData\":" + _dumps(other) + "}\n").encode()
            try:
                self._write_all(f, tail)
            except OSError as exc:
                if self._error is None:
                    self._error = f"writing {self.path} failed: {exc.strerror or exc}"
                    self._cause = exc
                # cutting back to an earlier event end E frees (bytes - E); with the w bytes the
                # tail got, it fits when E <= bytes + w - len(tail). Give up the fewest events that
                # make that room, and none when no remembered event end is early enough.
                limit = self._bytes + int(getattr(exc, "written", 0)) - len(tail)
                ends = list(self._ends)
                give_up = 0
                for j in range(1, len(ends) + 1):
                    if j < len(ends):
                        e = ends[-j - 1]
                    elif self._written == len(ends):
                        e = self._head
                    else:
                        break  # the end before the oldest remembered event is not known
                    if e <= limit:
                        give_up = j
                        break
                if not give_up:
                    self._cut_back(f)
                    return False
                for _ in range(give_up):
                    self._ends.pop()
                with self._cond:
                    self._bytes = self._ends[-1] if self._ends else self._head
                    self._written -= give_up
                    self._dropped += give_up
                self._cut_back(f)
                continue
            self._bytes += len(tail)
            return True

    def _failure(self, complete: bool) -> TraceWriteError:
        if complete:
            where = (f"the file was ended as valid JSON after {self._written} whole events; {self._dropped} "
                     "events are lost")
        else:
            where = (f"the file stops after {self._written} whole events, at byte {self._bytes}, without its "
                     f"closing ']}}' (a cut trace, which 'hetsched plot' reads to there); {self._dropped} events "
                     "are lost")
        err = TraceWriteError(f"trace file {self.path!r}: {self._error}; {where}", path=self.path,
                              events_written=self._written, size=self._bytes, complete=complete)
        err.__cause__ = self._cause
        return err

    def statistics(self) -> TraceStatistics:
        with self._cond:
            return TraceStatistics(self.path, self._open, self._written, self._dropped, self._flushes,
                                   self._bytes, self._error)
