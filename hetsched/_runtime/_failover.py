"""Failover: counting device failures, quarantining a failing device, re-submitting its requests.

A stage whose backend raises fails on a *device*. What happens to its request::

    backend raises in run()           (not a broken contract, not a hook, not cancellation)
      streak[device] += 1             (any successful run on the device resets it)
      the request started over ``after`` times already: it fails with the backend's
          StageExecutionError
      streak reaches ``after`` on a device neither quarantined nor known irreplaceable:
          quarantine it (once): ask the session for a plan without it (``request_replan``)
      the request starts over, from its feeds, once nothing of it runs any more: while a plan
          without a quarantined device is coming it waits for it, parked; else it starts over
          now, on the current plan (a transient failure, such as a killed toolkit process whose
          worker builds a new one, costs one more run, not the request)

Only a plan that leaves out every quarantined device releases the parked requests (a plan made
before the quarantine, by a re-plan already under way, does not: the session re-plans it without
the device instead of installing it, and should one slip in anyway, it releases nobody and the
quarantine's own re-plan follows). When no plan can do without the device (``failed``), it stays
in use: its parked requests start over on it, and later failures on it start their requests over
too, ``after`` times at most each; a device failing for good still fails every request, each
after ``after`` runs, and nothing waits for a plan that cannot come.

A request starts over from its original feeds once nothing of it runs any more (its other
stages finish and are dropped); buffers it held go back to the pools first. Requests whose
values cross memory domains (transfers driven by the event loop) are not re-submitted: they
fail as before. Everything here is thread-safe: worker threads report, the session installs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["Failover", "FailoverStatistics"]


@dataclass(frozen=True)
class FailoverStatistics:
    """A snapshot of a session's failover."""

    failures: Mapping[str, int]
    """Stage runs that failed in the backend, per device."""
    resubmitted: int
    """Requests started over after a device failure (each start counted)."""
    quarantined: tuple[str, ...]
    """Devices taken out of the plan after repeated failures."""
    unreplaceable: tuple[str, ...]
    """Devices that failed repeatedly but that no plan could do without."""
    parked: int
    """Requests waiting now for the plan without a quarantined device."""


class Failover:
    """Device failure bookkeeping of one scheduler (see the module docstring).

    :param after: consecutive failures on one device that quarantine it (>= 1).
    :param request_replan: ``request_replan(device, reason)``, called once per quarantine from
        the thread that saw the failure; must not block (the session posts it to its loop).
    """

    def __init__(self, after: int, request_replan: Callable[[str, str], None]):
        if after < 1:
            raise ValueError(f"failover after must be >= 1, got {after}")
        self.after = after
        self._request_replan = request_replan
        self._lock = threading.Lock()
        self.streak: dict[str, int] = {}
        """Consecutive failures per device (read unlocked on the hot path: a hint)."""
        self._failures: dict[str, int] = {}
        self._pending: set[str] = set()
        """Quarantined devices whose plan is not installed yet."""
        self._quarantined: list[str] = []
        self._unreplaceable: set[str] = set()
        self._parked: list[Any] = []
        self._errors: dict[int, BaseException] = {}
        self.resubmitted = 0

    # -- worker threads ---------------------------------------------------------------------

    def on_success(self, device: str) -> None:
        with self._lock:
            self.streak.pop(device, None)

    def on_failure(self, req: Any, device: str, error: BaseException) -> bool:
        """A backend failed a stage of ``req`` on ``device``: True if ``req`` is to start over
        (the caller parks it), False if it fails with ``error``."""
        reason = None
        with self._lock:
            self._failures[device] = self._failures.get(device, 0) + 1
            streak = self.streak[device] = self.streak.get(device, 0) + 1
            if req.retries >= self.after:
                return False
            if (streak >= self.after and device not in self._pending and device not in self._quarantined
                    and device not in self._unreplaceable):
                self._pending.add(device)
                self._quarantined.append(device)
                reason = f"device {device!r} failed {streak} stage runs in a row: {error}"
            self._errors[id(req)] = error
        if reason is not None:
            self._request_replan(device, reason)
        return True

    def take(self, req: Any) -> bool:
        """``req`` (parked, nothing of it running) may start over now: True; False: it waits for
        the plan that drops a quarantined device (returned by :meth:`installed` or :meth:`failed`)."""
        with self._lock:
            if self._pending:
                self._parked.append(req)
                return False
            self._errors.pop(id(req), None)
            self.resubmitted += 1
            return True

    # -- the session ------------------------------------------------------------------------

    def installed(self, devices: Collection[str]) -> list[Any]:
        """A new plan running stages on ``devices`` is in place: the parked requests, to start
        over on it, if it leaves out every quarantined device; else none (a plan made before a
        quarantine: they wait for the re-plan that quarantine asked for, see :meth:`settled`)."""
        with self._lock:
            if any(d in devices for d in self._quarantined):
                return []
            self._pending.clear()
            parked, self._parked = self._parked, []
            for req in parked:
                self._errors.pop(id(req), None)
            self.resubmitted += len(parked)
        return parked

    def failed(self, device: str) -> tuple[list[tuple[Any, BaseException]], list[Any]]:
        """No plan can do without ``device``: keep it. The parked requests: those to fail (with
        the error each saw: they started over ``after`` times already) and those to start over
        on the current plan (which still uses the device; its worker renews a dead context).
        Later failures on it start their requests over, ``after`` times at most each."""
        with self._lock:
            self._pending.discard(device)
            if device in self._quarantined:
                self._quarantined.remove(device)
            self._unreplaceable.add(device)
            if self._pending:
                return [], []  # another quarantine's plan is still coming: they wait for that one
            parked, self._parked = self._parked, []
            fail: list[tuple[Any, BaseException]] = []
            again: list[Any] = []
            for req in parked:
                err = self._errors.pop(id(req), None)
                if req.retries >= self.after:
                    fail.append((req, err if err is not None else RuntimeError(f"device {device!r} failed")))
                else:
                    again.append(req)
            self.resubmitted += len(again)
            return fail, again

    def settled(self, device: str) -> bool:
        """Whether a plan without quarantined ``device`` is in place already (or none is to
        come): the re-plan its quarantine asked for has nothing left to do."""
        with self._lock:
            return device not in self._pending

    def drain(self) -> list[tuple[Any, BaseException | None]]:
        """Every parked request (the session is closing)."""
        with self._lock:
            parked, self._parked = self._parked, []
            return [(req, self._errors.pop(id(req), None)) for req in parked]

    @property
    def quarantined(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._quarantined)

    def statistics(self) -> FailoverStatistics:
        with self._lock:
            return FailoverStatistics(
                failures=MappingProxyType(dict(self._failures)), resubmitted=self.resubmitted,
                quarantined=tuple(self._quarantined), unreplaceable=tuple(sorted(self._unreplaceable)),
                parked=len(self._parked),
            )
