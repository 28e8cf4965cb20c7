"""The loop as a whole: which slow domains its longest phase holds, and how its slowdown is shared.

:func:`allocate_loop` spends the loop's slowdown where it saves the most: a per-phase bound
(every phase within ``slowdown`` of its own top-clock time) keeps the loop within it too,
but a compute-bound phase pays dearly for each percent a memory-bound phase gives away
almost free. With a price on a second of the loop, every phase takes the point with the
least ``energy + price x time`` (what equal marginal savings per second lost means), and
the price is the lowest that keeps the loop within its bound.

Pure functions of what the engine has measured so far (each phase's fastest run at the top
clocks, the loop owner's model); :class:`~hetsched._governor._engine.GovernorEngine` calls
them when it starts tuning a phase and at every decision.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ._decide import GovernorConfig, switchable
from ._model import Choice, PhaseModel, choose
from ._phase import Phase
from ._points import DomainSpec

__all__ = ["allocate_loop", "held_domains", "loop_slowdown", "slowdown_share"]


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


def allocate_loop(
    models: Mapping[Phase, PhaseModel],
    slowdown: float,
    *,
    weights: Mapping[Phase, float] | None = None,
    fixed: Mapping[Phase, Mapping[str, int]] | None = None,
    iterations: int = 40,
) -> dict[Phase, Choice]:
    """Per-phase points minimising the loop's predicted energy with its time within the bound.

    The bound is ``(1 + slowdown)`` x the loop's time at the top clocks: each model's
    ``reference_s`` (its performance run; the fastest it saw where none), weighted by
    ``weights`` (occurrences per loop, default 1). The price of a second is found by
    bisection (``iterations`` steps); at price 0 every phase takes its least-energy point
    regardless of time, at a high price its fastest. ``fixed``: per phase, domains held
    (as in :func:`choose`).

    :raises ValueError: a weight that is not positive.
    """
    w = {p: (weights or {}).get(p, 1.0) for p in models}
    bad = [p for p, v in w.items() if not v > 0]
    if bad:
        raise ValueError(f"allocate_loop: weights must be positive, got {[(p.value, w[p]) for p in bad]}")
    ref = sum(w[p] * m.slowdown_reference_s for p, m in models.items())
    bound = ref * (1.0 + slowdown)

    def at(price: float) -> tuple[dict[Phase, Choice], float]:
        picks = {
            p: choose(m, slowdown=slowdown, fixed=(fixed or {}).get(p), objective="price", price_j_per_s=price)
            for p, m in models.items()
        }
        return picks, sum(w[p] * c.predicted.seconds for p, c in picks.items())

    picks, t = at(0.0)
    if t <= bound:
        return picks
    # The loop's energy per second at the top clocks bounds the useful price from above
    # (paying more for a second than the whole board draws buys nothing); double past it
    # if the fastest points still miss.
    hi = max(sum(w[p] * m.at_center.energy_j for p, m in models.items()) / ref, 1e-9)
    for _ in range(60):
        fast, t_hi = at(hi)
        if t_hi <= bound:
            break
        hi *= 2.0
    else:
        return fast
    lo = 0.0
    best = fast
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        cand, t_mid = at(mid)
        if t_mid <= bound:
            hi, best = mid, cand
        else:
            lo = mid
    return best
