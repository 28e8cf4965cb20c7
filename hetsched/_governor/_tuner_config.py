"""Every constant of the governor's auto-tune, in one validated, frozen place.

:class:`TunerConfig` is what :class:`~._tuner.AxisTuner`, its budget-filling strategy
(:mod:`._tuner_budget`), its measurement book (:mod:`._tuner_book`), its bounds and probes
(:mod:`._tuner_bounds`, :mod:`._tuner_probes`) and the tuning driver (:mod:`._tuning`) read.
Each field says what it trades off; none is justified by one board or one scenario: the
defaults are what the benchmarks (``benchmarks/governor.py``) were measured with, and a
change is judged there.

What the governor's user chooses per run (the slowdown bound, the power budget and its
margins, the tuning effort: :attr:`GovernorConfig.tune_levels
<hetsched._governor._decide.GovernorConfig.tune_levels>`, ``tune_passes``, ``tune_repeats``,
``guarded_probes``) stays in :class:`~hetsched._governor._decide.GovernorConfig`, which carries
a :class:`TunerConfig` as :attr:`~hetsched._governor._decide.GovernorConfig.tuner`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .._errors import GovernorError
from ._model import TIME_TIE

__all__ = ["TunerConfig"]


@dataclass(frozen=True)
class TunerConfig:
    """The auto-tune's constants (see the module docstring).

    :raises GovernorError: a value out of range (the message names it).
    """

    # -- ties: when two measured points count as equal ------------------------------------

    time_tie: float = TIME_TIE
    """Measured times within this fraction of the fastest count as equally fast in the final
    choice under a budget (the least energy among them wins). Larger: lower clocks and energy
    for a little throughput; smaller: chases run-to-run noise."""
    centre_tie: float = 0.03
    """The same while filling a budget, for the next pass's centre when it falls back to a
    measured point. Larger leaves more headroom to sweep up from (a clock that buys a little
    time but spends the budget is not taken); smaller follows the fastest point."""
    energy_tie: float = 0.001
    """Measured energies within this fraction count as equal (then the lower clocks win, so a
    clock that buys nothing is not left high). Larger: lower clocks at a small energy cost."""

    # -- passes ------------------------------------------------------------------------------

    budget_passes: int = 3
    """At least this many passes under a power budget (they stop early once the centre stays):
    filling a budget moves the bottleneck from domain to domain as clocks rise. More: closer to
    the budget's edge, more measurements."""
    extra_passes: int = 4
    """Passes a joint probe that paid may add (each re-centres on it and sweeps again). More:
    follows a joint move further, more measurements."""
    joint_flat: float = 0.01
    """A domain whose own axis shortened the phase by less than this fraction is *flat*: it is
    raised together with the other flat domains in the pass's joint probe. Larger: more joint
    probes on noise; smaller: concurrent domains missed."""
    joint_paid: float = 0.01
    """A joint probe that is faster than both the pass's choice and its centre by more than this
    fraction re-centres the next pass on it. Larger: fewer extra passes, joint gains missed."""

    # -- power bounds under a budget ---------------------------------------------------------

    explore_margin: float = 0.05
    """Under a budget, a point not measured yet runs only if its power bound is this fraction
    under the cap (bounds from neighbours are not tight; a phase's mean hides its peaks).
    Larger: tuning keeps further from the cap and may leave part of the budget unused; smaller:
    more runs cross it."""
    slope_factor: float = 2.0
    """The bound along an axis extrapolates the top two points' power slope times this (power
    grows faster than linearly above the voltage knee). Larger: safer, fewer steps tried."""
    smallest_step_first: bool = True
    """Under a budget, each axis is climbed from the smallest step the table has, so the power
    slope is known before the bigger steps. False: the coarse grid alone (fewer runs)."""

    # -- verification ------------------------------------------------------------------------

    verify_tries: int = 3
    """Times the chosen point may miss the slowdown bound or the cap and be chosen again (the bound
    tightened by the overshoot). More: closer to the bound, more measurements."""
    verify_slack: float = 0.005
    """Extra tightening of the slowdown bound after a miss, beyond the overshoot itself. Larger:
    fewer re-verifications, more time left unspent."""

    # -- effort ------------------------------------------------------------------------------

    spare_passes: int = 2
    """Passes beyond those asked for that the measurement limit leaves room for (joint probes
    and budget passes add passes). More: fewer tunes cut short, a longer worst case."""
    spare_runs: int = 4
    """Measurements beyond the passes that the limit leaves room for (the verifications)."""
    occurrences_per_measurement: int = 3
    """Occurrences of a phase its tuning may take per measurement it is allowed (settle runs and
    runs re-decided under a cap measure nothing): the driver's bound on tuning effort. Larger:
    fewer tunes cut short on a busy board, a longer worst case."""
    tune_after: int = 3
    """Occurrences of a phase before its tuning starts: the first run under the kernel's
    governors, the next ones at the top clocks (what the phase's length is judged on). More:
    a surer phase length, a later start."""

    def __post_init__(self) -> None:
        fractions = ("time_tie", "centre_tie", "energy_tie", "joint_flat", "joint_paid", "explore_margin",
                     "verify_slack")
        counts = ("budget_passes", "extra_passes", "verify_tries", "spare_passes", "spare_runs")
        bad = [n for n in fractions if not 0 <= getattr(self, n) < 0.5]
        bad += [n for n in counts if getattr(self, n) < 0]
        if self.slope_factor < 1:
            bad.append("slope_factor")
        if self.occurrences_per_measurement < 1:
            bad.append("occurrences_per_measurement")
        if self.tune_after < 1:
            bad.append("tune_after")
        if bad:
            raise GovernorError(f"TunerConfig: invalid {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")

    def as_dict(self) -> dict[str, float | int | bool]:
        """The constants by name (for a benchmark's JSON line or a log)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
