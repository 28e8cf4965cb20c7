"""The loop as a whole: which slow domains its longest phase holds, and how its slowdown is shared.

Pure functions of what the engine has measured so far (each phase's fastest run at the top
clocks, the loop owner's model); :class:`~hetsched._governor._engine.GovernorEngine` calls
them when it starts tuning a phase and at every decision.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ._decide import GovernorConfig, switchable
from ._model import PhaseModel
from ._phase import Phase
from ._points import DomainSpec

__all__ = ["held_domains", "loop_slowdown", "slowdown_share"]


def loop_slowdown(config: GovernorConfig, shortest: Mapping[Phase, float]) -> float:
    """The slowdown the loop as a whole may take: ``config.slowdown``, or with
    ``config.loop_deadline_s`` what the deadline leaves over the loop's working phases
    at the top clocks (each phase's fastest run, ``shortest``), whichever is more."""
    if config.loop_deadline_s is None:
        return config.slowdown
    loop_s = sum(t for p, t in shortest.items() if p is not Phase.IDLE)
    if loop_s <= 0:
        return config.slowdown
    return max(config.slowdown, config.loop_deadline_s / loop_s - 1.0)


def slowdown_share(
    phase: Phase,
    base: float,
    *,
    owner: Phase | None,
    owner_model: PhaseModel | None,
    shortest: Mapping[Phase, float],
    settled: Collection[Phase],
) -> float:
    """The slowdown bound ``phase`` is tuned to, out of the loop's bound ``base``.

    The loop owner's tuning measured the other working phases of the loop as they ran
    then (untuned, at their top clocks) and spent the loop's bound on its own clocks;
    phases tuned after it share what it left of the loop's bound, in proportion to their
    length (``shortest``), so the loop as a whole stays within ``base``. Without a loop
    owner every phase gets ``base``. ``settled``: the phases tuned or too short to tune.
    """
    model = owner_model
    if (
        owner is None or phase is owner or model is None or model.unit != "loop"
        or model.best_measured is None or model.reference_s is None
    ):
        return base
    spare_s = model.reference_s * (1.0 + base) - model.best_measured.seconds
    waiting = [p for p in shortest if p not in (Phase.IDLE, owner) and p not in settled]
    span = sum(shortest[p] for p in waiting)
    if span <= 0 or spare_s <= 0:
        return 0.0
    return min(base, spare_s / span)


def held_domains(
    phase: Phase,
    shortest: Mapping[Phase, float],
    domains: Mapping[str, DomainSpec],
    locked: Collection[str],
    factor: float,
) -> frozenset[str]:
    """The slow domains ``phase`` sets for the whole loop (see :attr:`DecisionInput.held`).

    Those are the unlocked domains no working phase seen so far lasts long enough to
    switch (``factor``: ``config.min_phase_factor``); the longest working phase owns them
    (it weighs most in the loop's time and energy, and is tuned first). Empty for every
    other phase and for IDLE.
    """
    working = {p: t for p, t in shortest.items() if p is not Phase.IDLE}
    if phase is Phase.IDLE or phase not in working or max(working, key=lambda p: working[p]) is not phase:
        return frozenset()
    return frozenset(
        name
        for name, spec in domains.items()
        if name not in locked and not any(switchable(spec, t, factor) for t in working.values())
    )
