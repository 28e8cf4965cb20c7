"""The runtime's clock, injected (as trio injects its clock into ``trio.run``).

The scheduler reads two clocks: ``monotonic()`` for admission times (aging keys) and the
deadline of a coalesced wake-up, ``perf_counter()`` for stage timings and hook timestamps.
A :class:`Session` takes one ``clock=``; tests pass a :class:`VirtualClock` they advance by
hand, so what depends on elapsed time (a deferral deadline, aging) is decided by the test
and not by how busy the machine is.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """Seconds on two clocks; both are read from any thread (device workers included)."""

    def monotonic(self) -> float:
        """A clock that never goes back (admission times, deadlines)."""
        ...

    def perf_counter(self) -> float:
        """The finest clock there is (stage timings, hook timestamps)."""
        ...


class SystemClock:
    """The process's clocks: ``time.monotonic`` and ``time.perf_counter`` themselves.

    The methods *are* the builtins (not wrappers), so a scheduler that binds
    ``clock.monotonic`` once calls exactly what it called before the clock was injected.
    """

    monotonic = staticmethod(time.monotonic)
    perf_counter = staticmethod(time.perf_counter)

    def __repr__(self) -> str:
        return "SystemClock()"


class VirtualClock:
    """A clock that moves only when :meth:`advance` is called (tests).

    Both readings are the same virtual time. Thread-safe: a test advances it from the event
    loop while device workers read it.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def perf_counter(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward; returns the new time.

        :raises ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds!r} s)")
        with self._lock:
            self._now += seconds
            return self._now

    def __repr__(self) -> str:
        return f"VirtualClock({self._now!r})"
