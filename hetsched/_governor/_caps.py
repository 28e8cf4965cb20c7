"""The governor's power caps: the budget, and the thermal cap shared out over phases.

Pure functions of the learned models, the phase ledger and the configuration;
:class:`~hetsched._governor._engine.GovernorEngine` calls them at every decision and
when it starts.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._errors import PowerBudgetError
from ._decide import GovernorConfig
from ._meter import PhaseLedger
from ._model import PhaseModel, choose
from ._phase import Phase

__all__ = ["check_budget", "phase_cap", "tighter", "unconstrained_power"]


def tighter(*caps: float | None) -> float | None:
    """The least of the caps given (None: none is set)."""
    set_caps = [c for c in caps if c is not None]
    return min(set_caps) if set_caps else None


def unconstrained_power(phase: Phase, models: Mapping[Phase, PhaseModel], book: PhaseLedger) -> float | None:
    """What ``phase`` draws uncapped: its tuned point's prediction plus the measured bias,
    else its mean measured power (None: not known yet)."""
    model = models.get(phase)
    if model is not None and model.best is not None:
        return model.predict(model.best).power_w + max(0.0, book.bias.get(phase, 0.0))
    return book.mean_power(phase)


def phase_cap(
    phase: Phase,
    *,
    budget_cap_w: float | None,
    thermal_cap_w: float | None,
    models: Mapping[Phase, PhaseModel],
    book: PhaseLedger,
) -> float | None:
    """The cap for ``phase``'s decision.

    The budget is a hard cap on every phase. The thermal cap is on *mean* power (a
    zone's time constant is seconds to minutes, phases are milliseconds), so it is
    shared out in proportion to what each phase draws unconstrained: the hungry
    phases give up the most watts instead of every phase being cut to the same level.
    """
    thermal = thermal_cap_w
    if thermal is not None:
        mine = unconstrained_power(phase, models, book)
        weights = [
            (pw, book.expected[p])
            for p in book.expected
            if (pw := unconstrained_power(p, models, book)) is not None and book.expected[p] > 0
        ]
        total_t = sum(t for _, t in weights)
        if mine is not None and total_t > 0:
            mean = sum(pw * t for pw, t in weights) / total_t
            thermal = None if mean <= thermal else mine * thermal / mean
    return tighter(budget_cap_w, thermal)


def check_budget(models: Mapping[Phase, PhaseModel], config: GovernorConfig) -> None:
    """Check that every profiled phase can meet the power budget somewhere.

    :raises PowerBudgetError: a phase's lowest known operating point is predicted over
        ``config.budget_cap_w``.
    """
    cap = config.budget_cap_w
    if cap is None:
        return
    for phase, model in models.items():
        ch = choose(model, slowdown=config.slowdown, power_cap_w=cap)
        if not ch.within_power:
            raise PowerBudgetError(
                f"power budget {config.power_budget_w} W cannot be met in phase {phase}: "
                f"the lowest operating point the profile knows is predicted at {ch.predicted.power_w:.2f} W"
            )
