"""The RKNN backend's toolkit worker processes, shared by the stages on one device worker, and
the contexts a stage builds ahead of first use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["Prebuilt", "ToolkitProcesses"]

T = TypeVar("T")


class ToolkitProcesses:
    """The backend's toolkit worker processes, one per (device, worker index), shared by the
    stages on that worker (one call at a time each; the stages of one worker run one at a time
    anyway) and closed when the last stage using one lets go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, int], list[Any]] = {}  # key -> [process, users]
        # one lock per key, held while its process starts: workers' processes start in
        # parallel (a start imports the toolkit), one worker's only once
        self._starting: dict[tuple[str, int], threading.Lock] = {}

    def acquire(self, device: str, index: int) -> Any:
        """A live process for this worker (started when there is none or it died).

        :raises BackendUnavailableError: no toolkit environment.
        :raises ToolkitWorkerError: the process could not start.
        """
        from .client import ToolkitProcess

        key = (device, index)
        with self._lock:
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:
            with self._lock:
                entry = self._procs.get(key)
                if entry is not None and entry[0].alive:
                    entry[1] += 1
                    return entry[0]
                if entry is not None:
                    # it died (killed, crashed): the stages still holding it get a new one as
                    # their workers renew their contexts; its socket and arena go now (their
                    # release() of it later closes it again: idempotent)
                    del self._procs[key]
            if entry is not None:
                entry[0].close()
            proc = ToolkitProcess(name=device if index == 0 else f"{device} worker {index}")
            proc.start()
            with self._lock:
                self._procs[key] = [proc, 1]
            return proc

    def release(self, proc: Any) -> None:
        with self._lock:
            for key, entry in list(self._procs.items()):
                if entry[0] is proc:
                    entry[1] -= 1
                    if entry[1] > 0:
                        return
                    del self._procs[key]
                    break
        proc.close()


class Prebuilt(Generic[T]):
    """Things built ahead of first use, one background thread per index.

    ``build(index, stop)`` makes one (it may return None once ``stop`` is set: nothing to keep);
    :meth:`take` waits for it; :meth:`close` stops the builds not yet begun, waits for those under
    way and hands whatever nobody took to ``discard``, so no thread and nothing built outlives it.
    """

    def __init__(self, indices: Iterable[int], build: Callable[[int, threading.Event], T | None],
                 discard: Callable[[T], None], *, name: str) -> None:
        self._build = build
        self._discard = discard
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._results: dict[int, tuple[T | None, BaseException | None]] = {}
        self._threads: dict[int, threading.Thread] = {}
        for i in indices:
            # daemon: a stage never closed must not hold the interpreter at exit
            t = threading.Thread(target=self._run, args=(i,), name=f"{name} prebuild {i}", daemon=True)
            self._threads[i] = t
            t.start()

    def _run(self, index: int) -> None:
        item: T | None = None
        error: BaseException | None = None
        try:
            if not self._stop.is_set():
                item = self._build(index, self._stop)
        except BaseException as exc:  # handed to whoever takes it, re-raised there
            error = exc
        with self._lock:
            self._results[index] = (item, error)

    def pending(self, index: int) -> bool:
        """Whether :meth:`take` has something (built or being built) for ``index``."""
        with self._lock:
            return index in self._threads

    def take(self, index: int) -> T | None:
        """What was built for ``index`` (waiting for its build), once; None when nothing is pending
        for it, or the build was stopped.

        :raises BaseException: the build's own error.
        """
        with self._lock:
            thread = self._threads.pop(index, None)
        if thread is None:
            return None
        thread.join()
        with self._lock:
            item, error = self._results.pop(index)
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        """Stop, wait for the builds under way, and discard what nobody took. Idempotent."""
        self._stop.set()
        with self._lock:
            threads, self._threads = self._threads, {}
        for t in threads.values():
            t.join()
        with self._lock:
            left = [item for i, (item, _e) in self._results.items() if i in threads and item is not None]
            for i in threads:
                self._results.pop(i, None)
        for item in left:
            self._discard(item)
