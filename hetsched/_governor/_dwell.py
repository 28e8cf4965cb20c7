"""The dwell: which phases of a fast loop may switch clocks, and the writes it holds back.

Pure functions of the phase lengths the engine has measured and of one decision;
:class:`~hetsched._governor._engine.GovernorEngine` applies them when ``dwell_s`` is set
(a Session's per-request phases). See the engine's module docstring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from ._decide import Decision
from ._phase import Phase

__all__ = ["hold_back", "log_decision", "may_switch"]


def may_switch(phase: Phase, expected: Mapping[Phase, float], dwell_s: float | None) -> bool | None:
    """Under a dwell: whether ``phase`` may switch domains (it lasts at least ``dwell_s``, or
    it is the loop's longest working phase, its owner); None without a dwell."""
    if dwell_s is None:
        return None
    length = expected.get(phase)
    if length is not None and length >= dwell_s:
        return True
    working = {p: t for p, t in expected.items() if p is not Phase.IDLE}
    return bool(working) and phase is max(working, key=lambda p: working[p])


def hold_back(decision: Decision, current: Mapping[str, int]) -> Decision:
    """``decision`` of a phase that may not switch, less the writes the dwell holds back.

    Safety over dwell: a cap that needs a clock lower gets it at once.
    """
    capped = decision.capped or not decision.within_cap
    kept = {d: hz for d, hz in decision.writes.items() if capped and hz < current.get(d, hz + 1)}
    if len(kept) == len(decision.writes):
        return decision
    return replace(decision, writes=MappingProxyType(kept))


def log_decision(log: logging.Logger, decision: Decision, before: Mapping[str, int], *, dry_run: bool) -> int:
    """One line per clock change decided (phase, domain, from -> to, why): at INFO in a dry
    run (what it would do), else DEBUG. Returns the lines it stood for."""
    level = logging.INFO if dry_run else logging.DEBUG
    if log.isEnabledFor(level):
        for d, hz in decision.writes.items():
            was = before.get(d)
            log.log(level, "governor: %s%s: %s %s -> %d Hz (%s)", "dry run: " if dry_run else "",
                    decision.phase, d, "?" if was is None else f"{was}", hz, decision.reason)
    return len(decision.writes)
