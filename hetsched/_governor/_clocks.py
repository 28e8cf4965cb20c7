"""Applying the governor's writes through a port, and finding the domains that do not follow.

:class:`ClockWriter` writes each target through the :class:`~hetsched._governor._ports.ClockPort`,
reads back what the domain achieved and, once a domain has repeatedly stayed where it was
after a write (another agent such as nvpmodel owns it, or a tree nothing keeps live),
reports it as frequency-locked so the governor leaves it alone. It also keeps the books of
the writes per domain (what the run summary reports as writes per domain per second).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ._decide import GovernorConfig
from ._points import DomainSpec
from ._ports import ClockPort

__all__ = ["ClockWriter"]

log = logging.getLogger("hetsched.governor")

_NO_FOLLOW_LIMIT = 2


class ClockWriter:
    """What the governor believes each domain runs at, and the writes that move them."""

    def __init__(self, port: ClockPort, domains: Mapping[str, DomainSpec], config: GovernorConfig) -> None:
        self.port = port
        self.domains = domains
        self.config = config
        self.current: dict[str, int] = {}
        """The target each domain was last given (what it runs at once the write took effect)."""
        self.locked: set[str] = set()
        self.writes = 0
        """Frequency writes issued (none while pretending)."""
        self.writes_by_domain: dict[str, int] = {}
        """The same, per domain."""
        self.last_write_s: dict[str, float] = {}
        """Port time of each domain's latest write (or pretended write)."""
        self._seen: dict[str, int] = {}
        """What each domain last read back as (the board's word, not the governor's belief)."""
        self._no_follow: dict[str, int] = {}
        self._unverified: dict[str, tuple[int, int | None, float]] = {}

    def read_all(self) -> None:
        """Read every domain's clock from the port (at start)."""
        for name in self.domains:
            hz = self.port.read(name)
            if hz is not None:
                self.current[name] = hz
                self._seen[name] = hz

    def apply(self, writes: Mapping[str, int], *, pretend: bool = False) -> None:
        """Write every target; with ``pretend`` (dry run, ungoverned) only record it.

        :raises UnsupportedFrequencyError: a target is not in its domain's table.
        """
        if not writes:
            return
        now = self.port.now()
        if pretend:
            # Pretend the clocks moved, so the log shows what a real run would do next.
            for name, hz in writes.items():
                self.domains[name].check(hz)
                self.current[name] = hz
                self.last_write_s[name] = now
            return
        for name, hz in writes.items():
            self.domains[name].check(hz)
            self.port.write(name, hz)
            self.writes += 1
            self.writes_by_domain[name] = self.writes_by_domain.get(name, 0) + 1
            self.last_write_s[name] = now
            # What it showed before this write: the board's reading, not the last target
            # (a target that never took effect must not make the next one look followed).
            shown = self._seen.get(name)
            achieved = self.port.read(name)
            self.current[name] = hz
            if achieved is not None:
                self._seen[name] = achieved
            if achieved is None:
                self._unverified.pop(name, None)
            elif achieved == hz:
                # Followed at once when it was a real change; asking for the value it already
                # shows says nothing either way (an earlier unfollowed write is superseded).
                # A pending earlier target is superseded either way: a driver that applies only
                # the latest write (a live twin's poll) shows this one, which is no lock.
                if shown is not None and shown != hz:
                    self._no_follow[name] = 0
                self._unverified.pop(name, None)
            else:
                # Not there yet: judge it once the grace period has passed (a live twin or a
                # slow driver applies it later; blocking here would stall the caller). A newer
                # target while the domain still shows what it showed at the first unfollowed
                # write keeps that write's start: restarting the wait at every write (one per
                # phase, many a second) would never let a dead domain be judged.
                prev = self._unverified.get(name)
                since = prev[2] if prev is not None and prev[1] == achieved else now
                self._unverified[name] = (hz, achieved, since)

    def verify(self) -> list[str]:
        """Domains written earlier that had not followed: did they, by now? Returns the newly locked ones."""
        now = self.port.now()
        newly_locked = []
        for name, (hz, before, since) in list(self._unverified.items()):
            grace = max(self.config.lock_grace_s, 20.0 * self.domains[name].transition_latency_s)
            achieved = self.port.read(name)
            if achieved is not None:
                self._seen[name] = achieved
            if achieved is not None and achieved != hz and achieved == before and now - since < grace:
                continue  # not applied yet: give the driver its time
            del self._unverified[name]
            if achieved is None or achieved != before:
                # It moved (to the target, or short of it under a thermal cap): the domain
                # follows. The belief stays the target: re-writing it would not move a capped
                # clock, only add writes.
                self._no_follow[name] = 0
                continue
            self.current[name] = achieved
            self._no_follow[name] = self._no_follow.get(name, 0) + 1
            if self._no_follow[name] >= _NO_FOLLOW_LIMIT and name not in self.locked:
                self.locked.add(name)
                newly_locked.append(name)
                log.warning(
                    "governor: frequency lock on %s: wrote %d Hz, it stays at %d Hz "
                    "(another agent such as nvpmodel owns it, or nothing applies writes); leaving it alone",
                    name, hz, achieved,
                )
        return newly_locked
