"""The RKNN backend's toolkit worker processes, shared by the stages on one device worker."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ToolkitProcesses"]


class ToolkitProcesses:
    """The backend's toolkit worker processes, one per (device, worker index), shared by the
    stages on that worker (one call at a time each; the stages of one worker run one at a time
    anyway) and closed when the last stage using one lets go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, int], list[Any]] = {}  # key -> [process, users]

    def acquire(self, device: str, index: int) -> Any:
        """A live process for this worker (started when there is none or it died).

        :raises BackendUnavailableError: no toolkit environment.
        :raises ToolkitWorkerError: the process could not start.
        """
        from .client import ToolkitProcess

        with self._lock:
            entry = self._procs.get((device, index))
            if entry is not None and entry[0].alive:
                entry[1] += 1
                return entry[0]
            proc = ToolkitProcess(name=device if index == 0 else f"{device} worker {index}")
            proc.start()
            self._procs[(device, index)] = [proc, 1]
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
