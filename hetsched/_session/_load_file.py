"""A runtime's per-session load, published for ``hetsched top``: ``<root>/run/hetsched/runtime-<pid>.json``.

A :class:`~hetsched.Runtime` made with ``publish_load=True`` writes, every
:data:`PUBLISH_PERIOD_S` and once more as it closes (then removes it), one small JSON file in the
root's run directory, the directory the governor's state file lives in, through the same contained
walk (:class:`hetsched._governor._state_walk.RunDir`: no link followed, nothing opened or written
outside the root, written atomically)::

    {"format": 1, "kind": "runtime", "pid": 4242, "time_s": 12.5,
     "sessions": [{"name": "det", "priority": 1, "busy_share": {"npu": 0.42}, "share": 0.61,
                   "requests": 300, "completed": 298, "slo_met": 290, "slo_missed": 8}]}

``busy_share`` is the session's :class:`~hetsched.policies.Reservation` (per device, the share of
the runtime's time its stages kept the device busy); ``share`` its part of all sessions' busy
time. A file that cannot be written (no permission on ``/run``, a link on the way) stops the
publishing and is noted in the runtime's statistics; it never fails the runtime.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMAT", "PUBLISH_PERIOD_S", "LoadPublisher", "PublishedSession", "payload", "read_published"]

FORMAT = 1
PUBLISH_PERIOD_S = 1.0
"""Seconds between two writes of a runtime's load file."""
_NAME = re.compile(r"runtime-(\d+)\.json")


@dataclass(frozen=True)
class PublishedSession:
    """One session of a published runtime (what ``top`` shows)."""

    runtime_pid: int
    name: str
    priority: int | None
    busy_share: Mapping[str, float]
    share: float
    requests: int
    completed: int


class LoadPublisher:
    """Writes one runtime's load file under ``root`` (blocking; one thread at a time)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = root
        self.name = f"runtime-{os.getpid()}.json"
        self.note: str | None = None
        self.writes = 0
        self._dir: Any = None
        self._lock = threading.Lock()  # the runtime's task and a caller's publish_load() may overlap

    def publish(self, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` (with ``format``, ``kind`` and ``pid``); a failure stops publishing."""
        with self._lock:
            self._publish(payload)

    def _publish(self, payload: Mapping[str, Any]) -> None:
        if self.note is not None:
            return
        try:
            if self._dir is None:
                from .._governor._state_walk import RunDir
                from .._platform._fs import SysfsRoot

                self._dir = RunDir(SysfsRoot(self.root))
            self._dir.write(self.name, {"format": FORMAT, "kind": "runtime", "pid": os.getpid(), **payload})
            self.writes += 1
        except (OSError, ValueError) as exc:  # SysfsError, PathOutsideRootError are OSErrors
            self.note = f"the runtime's load file could not be written under {os.fspath(self.root)}: {exc}"

    def withdraw(self) -> None:
        """Remove the file and the directories its first write made, if empty (never raises)."""
        with self._lock:
            d = self._dir
            if d is None or not self.writes:
                return
            try:
                d.remove(self.name)
                d.tidy()
            except OSError:
                pass


def read_published(fs: Any, alive: Any) -> tuple[PublishedSession, ...]:
    """The sessions of every runtime that publishes its load under ``fs`` (a ``SysfsRoot``) and whose
    pid ``alive(pid)`` says runs; a file that cannot be read or parsed is skipped."""
    from .._governor._state_walk import RUN_DIR, RunDir

    try:
        names = sorted(n for n in fs.listdir(RUN_DIR) if _NAME.fullmatch(n))
        run = RunDir(fs) if names else None
    except (OSError, ValueError):
        return ()
    out: list[PublishedSession] = []
    for name in names:
        m = _NAME.fullmatch(name)
        assert m is not None and run is not None
        pid = int(m.group(1))
        if not alive(pid):
            continue
        try:
            raw = run.read(name)
            doc = json.loads(raw) if raw is not None else None
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("pid") != pid:
            continue
        sessions = doc.get("sessions")
        for s in sessions if isinstance(sessions, list) else []:
            try:
                busy = {str(k): float(v) for k, v in dict(s.get("busy_share", {})).items()}
                prio = s.get("priority")
                out.append(PublishedSession(pid, str(s["name"]), int(prio) if prio is not None else None, busy,
                                            float(s.get("share", 0.0)), int(s.get("requests", 0)),
                                            int(s.get("completed", 0))))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    return tuple(out)


def payload(time_s: float, shares: Sequence[tuple[str, int, Mapping[str, float], float, int, int]]) -> dict[str, Any]:
    """The file's body for the sessions ``(name, priority, busy_share, share, requests, completed)``."""
    return {"time_s": time_s, "sessions": [
        {"name": n, "priority": p, "busy_share": {k: round(v, 4) for k, v in b.items()}, "share": round(sh, 4),
         "requests": r, "completed": c} for n, p, b, sh, r, c in shares]}
