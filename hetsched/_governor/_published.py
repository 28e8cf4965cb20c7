"""The engine's publisher: what a running governor does now, and what it saved, into its port's state directory.

A port that has a state directory (its ``state_dir`` capability, see
:class:`~hetsched._governor._ports.ClockPort`: a board's
:class:`~hetsched._governor._state_dir.StateDir`, ``<root>/run/hetsched``) gets two files written
through it (the directory, its files and their readers are described there):

* ``governor-saved.json`` once at start, after the knobs were saved (:meth:`Publisher.started`);
* ``governor-state.json``: the current phase, per-domain targets, locked domains, pid;
  rewritten when the phase or a target changes, at most every ``min_interval_s`` of the
  governor's clock (phases change per request; ``hetsched top`` refreshes about once a
  second), flushed on the next tick.

At close the port's restore (or :meth:`Publisher.closed`, for a run that saved nothing) closes
the state directory: the state file goes, the saved file once the knobs are back, then the lock.
Publishing never makes the governor fail: an error is logged once and publishing stops. A
port without a state directory (a simulation, a port of your own) publishes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from ._state_dir import FORMAT, StateDir, encode_knobs
from ._state_walk import SAVED_FILE, STATE_FILE

__all__ = ["Publisher"]

log = logging.getLogger("hetsched.governor")


class Publisher:
    """What the engine calls (see the module docstring); one without a state directory does nothing.

    :param state_dir: the port's state directory, or None (nothing is published).
    :param min_interval_s: least time, on the governor's clock (the ``now`` of :meth:`update`),
        between two writes of the state file; the files themselves carry wall time.
    """

    def __init__(self, state_dir: StateDir | None, *, soc: str | None = None, min_interval_s: float = 0.1) -> None:
        self._dir = state_dir
        self._state_dir = state_dir
        self._soc = soc
        self._min_interval_s = min_interval_s
        self._started_unix = time.time()
        self._last: tuple[Any, ...] | None = None
        self._pending: dict[str, Any] | None = None
        self._last_t: float | None = None
        self._dry_run = False
        self.writes = 0

    @property
    def enabled(self) -> bool:
        return self._dir is not None

    def _publish(self, name: str, payload: Mapping[str, Any]) -> None:
        d = self._dir
        if d is None:
            return
        try:
            d.publish(name, payload)
            self.writes += 1
        except OSError as exc:
            log.warning("governor: cannot publish %s under %s (stopped publishing): %s", name, d.path, exc)
            self._dir = None

    def started(self, saved: Any, *, dry_run: bool) -> None:
        """After the knobs were saved (``saved`` None in a dry run: nothing to restore)."""
        self._dry_run = dry_run
        d = self._dir
        if d is None:
            return
        if saved is None:
            if d.probe().held:
                # A dry run beside a governing one: the state file is the owner's, not overwritten
                # (and removed at close) by a run that changes nothing.
                log.info("governor: another governor owns the clocks under %s: this run publishes nothing", d.fs.root)
                self._dir = None
                return
            left = d.read()
            if left.saved is not None and not d.saved_owner_alive(left.saved)[0]:
                log.warning("governor: a hetsched governor that is gone (pid %s) left clocks changed under %s; "
                            "this run does not restore them (`hetsched restore --root %s` does)",
                            left.pid("saved"), d.fs.root, d.fs.root)
        knobs = encode_knobs(saved)
        if knobs is not None:
            self._publish(SAVED_FILE, {"format": FORMAT, "pid": os.getpid(), "soc": self._soc,
                                       "started_unix": self._started_unix, "knobs": knobs})

    def update(self, now: float, phase: str | None, targets: Mapping[str, int], locked: frozenset[str]) -> None:
        """The phase or the clocks may have changed: publish now, or at the next :meth:`flush`."""
        key = (phase, tuple(sorted(targets.items())), tuple(sorted(locked)))
        if key == self._last or self._dir is None:
            return
        self._last = key
        self._pending = {"format": FORMAT, "pid": os.getpid(), "soc": self._soc, "phase": phase,
                         "targets": dict(sorted(targets.items())), "locked": sorted(locked),
                         "dry_run": self._dry_run, "started_unix": self._started_unix}
        self.flush(now)

    def flush(self, now: float) -> None:
        """Write what :meth:`update` left pending once ``min_interval_s`` has passed."""
        if self._pending is None:
            return
        if self._last_t is not None and now - self._last_t < self._min_interval_s:
            return
        payload, self._pending = self._pending, None
        payload["updated_unix"] = time.time()
        self._last_t = now
        self._publish(STATE_FILE, payload)

    def closed(self, *, restored: bool) -> None:
        """Close the state directory (:meth:`StateDir.close`): the state file goes; the saved knobs
        only when ``restored``; then the lock (idempotent: the port's restore closes it first)."""
        self._pending = None
        self._dir = None
        if self._state_dir is not None:
            self._state_dir.close(restored=restored)
