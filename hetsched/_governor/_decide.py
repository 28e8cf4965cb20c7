"""The governor's decision: a pure function from what it knows to the clocks to write."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .._errors import GovernorError
from ._model import Measurement, Objective, PhaseModel, choose
from ._phase import Phase
from ._points import DomainSpec, OperatingPoint
from ._tuner_config import TunerConfig

__all__ = ["Decision", "DecisionInput", "GovernorConfig", "Reason", "decide", "switchable"]

IDLE_SWITCH_SHARE = 0.5
"""Without a budget, IDLE lowers a domain only if switching it back (one transition latency at
the idle clock, at the start of the next phase) costs the next phase at most this share of the
slowdown bound of its own length. Larger: more idle energy saved, more of the bound spent on
the switch back; smaller: idle clocks left higher."""


@dataclass(frozen=True)
class GovernorConfig:
    """How the governor trades speed, power and heat.

    :raises GovernorError: a value out of range (the message names it).
    """

    slowdown: float = 0.05
    """Allowed time per unit of work over the performance point's, as a fraction (0.05 = 5 %)."""
    power_budget_w: float | None = None
    """Hard cap on predicted total power (sum of rails / board input), or None."""
    loop_deadline_s: float | None = None
    """Frame-paced work (a camera's inference loop): the longest one loop's working phases
    (one PREPROCESS, INFER, POSTPROCESS each; idle excluded) may take. Auto-tune then spends
    up to this instead of ``slowdown`` (never less than ``slowdown``): the least energy that
    still meets the frame. Keep headroom for jitter (e.g. 0.85 x the frame period). None:
    ``slowdown`` alone (and for training loops, whose length is not a deadline)."""
    power_margin: float = 0.04
    """Fraction of the budget kept free for prediction error: what a point not measured (a
    model's prediction) must stay under is the budget less this."""
    measured_margin: float = 0.005
    """Fraction of the budget kept free above a point's *measured* settled power (the power
    sensor's noise): a point auto-tune ran, its power bounded after its clocks switched, may
    use the budget up to this. The board's drift since (it warms, leakage rises) is what the
    measured bias adds at every decision, so a warmer board drops the point rather than this
    margin hiding it. Larger: points that settle near the budget are dropped (throughput
    left unused); smaller: sensor noise may carry a point over the budget."""
    thermal_margin_c: float = 2.0
    """Keep every zone this far below its (lowest) passive trip."""
    critical_margin_c: float = 15.0
    """Keep a zone this far below its (lowest) critical trip: the limit of a zone that has no
    passive trip (an RK3588 ``bigcore0-thermal``: one critical trip at 115 C), and a ceiling on
    any zone's limit (a passive trip set above the critical one). A zone past the limit caps the
    board's power, and so its clocks, at every tick until it cools; 15 C leaves the kernel's
    hard shutdown at the critical trip well clear of the guard's overshoot."""
    thermal_horizon_s: float = 2.0
    """How far ahead the thermal model looks (at least the expected phase length)."""
    thermal_window_s: float = 1.0
    """Telemetry span per thermal-fit update."""
    min_phase_factor: float = 4.0
    """A domain is switched for a phase only if the phase lasts >= this x its transition latency
    (the reference: Jetson GPU/EMC changes of 5-8 ms pay off for phases of roughly 10-50 ms)."""
    cap_hysteresis: float = 0.05
    """A thermal cap that loosens must rise by this fraction before clocks go back up."""
    tune_levels: int = 6
    """Frequencies per domain in the first (coarse) auto-tune pass. More: a finer first sweep,
    more measurements."""
    tune_passes: int = 2
    """Auto-tune passes (each re-centred on the last one's choice, on a finer grid); under a
    budget at least :attr:`TunerConfig.budget_passes`."""
    tune_repeats: int = 2
    """Runs of each candidate point averaged during auto-tune. More: less noise, slower tuning."""
    guarded_probes: bool = True
    """Under a power budget, auto-tune fills the budget with the strategy of
    :mod:`hetsched._governor._tuner_budget`: it tries a step up that the tuner's bounds refuse
    (they extrapolate the axis's slope) but whose *physical* bound (the phase's dynamic power
    drawn as much faster as the clock ratio allows) fits the budget less ``measured_margin``,
    which on a sparse clock table can be a large step in throughput. The probe is watched:
    dropped, and the clocks put back, at the first telemetry reading over the budget, and not
    run again if its run measured over it. The physical bound leaves out the stepped domain's
    own voltage rise, so a probe can still cross the budget by a few percent, for one unit of
    work (``benchmarks/governor.py`` counts these as ``tuning_cap_violations``). False: only
    points whose slope bound is inside the margin run; the budget is then never crossed while
    tuning, and tuning may leave part of it unused."""
    tuner: TunerConfig = field(default_factory=TunerConfig)
    """The auto-tune's own constants (ties, passes, bounds, verification, effort)."""
    lock_grace_s: float = 0.5
    """How long a written clock may take to show before it counts as not followed (also at
    least 20x the domain's transition latency). A driver, or a live twin in another process,
    applies writes some time later; judging sooner flags healthy domains as locked."""

    def __post_init__(self) -> None:
        checks = {
            "slowdown": self.slowdown >= 0,
            "power_budget_w": self.power_budget_w is None or self.power_budget_w > 0,
            "loop_deadline_s": self.loop_deadline_s is None or self.loop_deadline_s > 0,
            "power_margin": 0 <= self.power_margin < 0.5,
            "measured_margin": 0 <= self.measured_margin < 0.5,
            "thermal_margin_c": self.thermal_margin_c >= 0,
            "critical_margin_c": self.critical_margin_c >= 0,
            "thermal_horizon_s": self.thermal_horizon_s > 0,
            "thermal_window_s": self.thermal_window_s > 0,
            "min_phase_factor": self.min_phase_factor >= 0,
            "cap_hysteresis": 0 <= self.cap_hysteresis < 1,
            "tune_levels": self.tune_levels >= 2,
            "tune_passes": self.tune_passes >= 1,
            "tune_repeats": self.tune_repeats >= 1,
            "lock_grace_s": self.lock_grace_s >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise GovernorError(f"GovernorConfig: invalid {', '.join(f'{n}={getattr(self, n)!r}' for n in bad)}")

    @property
    def budget_cap_w(self) -> float | None:
        """The budget less the margin: what predicted power must stay under."""
        return None if self.power_budget_w is None else self.power_budget_w * (1.0 - self.power_margin)

    @property
    def measured_cap_w(self) -> float | None:
        """The budget less :attr:`measured_margin`: what a measured point's settled power must stay under."""
        return None if self.power_budget_w is None else self.power_budget_w * (1.0 - self.measured_margin)


@dataclass(frozen=True)
class DecisionInput:
    """Everything :func:`decide` looks at, as plain data."""

    phase: Phase
    domains: Mapping[str, DomainSpec]
    current: Mapping[str, int]
    """The frequency each domain is at now (as last written or read back)."""
    config: GovernorConfig
    model: PhaseModel | None = None
    expected_phase_s: float | None = None
    """How long this phase usually lasts (None: not seen yet)."""
    power_cap_w: float | None = None
    """The tighter of the budget cap and the thermal cap."""
    measured_cap_w: float | None = None
    """The same for the tuned point's *measured* power (:attr:`GovernorConfig.measured_cap_w`
    for the budget); None: ``power_cap_w``."""
    power_bias_w: float = 0.0
    """How much the model has been seen to under-predict this phase's power."""
    power_now_w: float | None = None
    locked: frozenset[str] = frozenset()
    """Domains whose clock does not follow writes: never touched."""
    tuning_point: OperatingPoint | None = None
    """Auto-tune wants this point measured now."""
    successor_expected_s: float | None = None
    """How long the phase that usually follows this one lasts (None: unknown)."""
    held: frozenset[str] = frozenset()
    """Slow domains no phase of the loop lasts long enough to switch (Jetson EMC and GPU in a
    33 ms camera frame): set once for the whole loop by the phase that owns them (the longest),
    as if the loop were one phase. Free for this decision although the phase is short."""
    follows_owner: bool = False
    """An untuned working phase of a loop whose owner phase is tuned on the whole loop (see
    :mod:`hetsched._governor._tuning`): it runs at the clocks the owner left, so that what
    the owner measures (and chose) is what the loop runs at."""


class Reason(enum.Enum):
    """Why :func:`decide` chose its point. Code acts on the member (and on
    :attr:`Decision.capped`), never on the text, which is for people (logs, ``top``)."""

    TUNING = "tuning"
    """Auto-tune wants this point measured now."""
    OWNER_CLOCKS = "untuned: the loop owner's clocks"
    IDLE_LOWEST = "idle: lowest clocks"
    BUDGET_LOWEST = "untuned under a power budget: lowest clocks"
    OVER_CAP_STEP_DOWN = "untuned, over the power cap: one step down"
    TOP_CLOCKS = "untuned: top clocks"
    TUNED_POINT = "tuned point"
    FASTEST_IN_BUDGET = "fastest within the power budget"
    LEAST_ENERGY = "least energy within bounds"
    CAP_OVER_HYSTERESIS = "power cap: switching domains hysteresis would have kept"
    """Safety over hysteresis: every unlocked domain freed to get under the cap."""


@dataclass(frozen=True)
class Decision:
    """What to write (only what changes) and why."""

    phase: Phase
    target: OperatingPoint
    writes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    predicted: Measurement | None = None
    why: Reason = Reason.TUNED_POINT
    within_cap: bool = True
    capped: bool = False
    """A power cap (budget or thermal) moved the choice: a write that lowers a clock for it is
    never held back (safety over dwell and hysteresis)."""
    cap_w: float | None = None
    """The cap that moved it, for the text."""

    @property
    def reason(self) -> str:
        """The reason in words (for people: code reads :attr:`why` and :attr:`capped`)."""
        return self.why.value if self.cap_w is None else f"power cap {self.cap_w:.2f} W: {self.why.value}"


def switchable(domain: DomainSpec, expected_phase_s: float | None, factor: float) -> bool:
    """Whether a phase of ``expected_phase_s`` is long enough to be worth switching ``domain`` for."""
    if expected_phase_s is None:
        return False
    return expected_phase_s >= factor * domain.transition_latency_s


def _writes(target: OperatingPoint, current: Mapping[str, int], locked: frozenset[str]) -> Mapping[str, int]:
    return MappingProxyType({d: hz for d, hz in target.items() if d not in locked and current.get(d) != hz})


def decide(inp: DecisionInput) -> Decision:
    """Choose the clocks for ``inp.phase``.

    * auto-tune asked for a point: that point (it is being measured);
    * an untuned phase that follows the loop's owner (``inp.follows_owner``): nothing written;
    * IDLE (and, under a power budget, a phase not tuned yet): every domain worth
      switching to its lowest clock; for IDLE without a budget only those the next phase
      switches back within half the slowdown bound of its own length (one transition
      latency at the idle clock);
    * a tuned phase: the tuned point if its predicted power fits the cap, else the
      least-energy point that fits (jointly over domains, :func:`choose`); domains not
      worth switching for a phase this short stay where they are unless the cap cannot
      be met otherwise;
    * an untuned phase: the top clocks on the domains worth switching, unless the power
      now is over the cap, then every domain steps down one level.

    ``inp.held`` domains count as worth switching (the loop's owner phase sets them).

    Locked domains are never written. Pure: no I/O.
    """
    free = {
        name: spec
        for name, spec in inp.domains.items()
        if name not in inp.locked
        and (name in inp.held or switchable(spec, inp.expected_phase_s, inp.config.min_phase_factor))
    }
    if inp.tuning_point is not None:
        target = OperatingPoint.of({d: hz for d, hz in inp.tuning_point.items() if d not in inp.locked})
        return Decision(inp.phase, target, _writes(target, inp.current, inp.locked), None, Reason.TUNING)
    if inp.model is None and inp.follows_owner and inp.phase is not Phase.IDLE:
        target = OperatingPoint.of(dict(inp.current))
        return Decision(inp.phase, target, MappingProxyType({}), None, Reason.OWNER_CLOCKS)
    if inp.model is None and (inp.phase is Phase.IDLE or inp.config.power_budget_w is not None):
        return _lowest_clocks(inp, free)
    if inp.model is None:
        return _untuned(inp, free)
    return _tuned(inp, inp.model, free)


def _lowest_clocks(inp: DecisionInput, free: Mapping[str, DomainSpec]) -> Decision:
    """IDLE, or an untuned phase under a budget: the lowest clocks (see :func:`decide`)."""
    cfg = inp.config
    current, locked = inp.current, inp.locked
    # Idle: nothing runs, so the lowest clocks cost nothing, but only for domains the
    # next phase can switch back up in time (else idle would slow the next request).
    # Under a budget, an untuned phase has no power prediction yet: lowest is safe.
    lower = free
    if cfg.power_budget_w is not None and inp.expected_phase_s is None:
        # Nothing is known yet, not even the phase's length: every domain to the floor.
        lower = {n: s for n, s in inp.domains.items() if n not in locked}
    if inp.phase is Phase.IDLE and cfg.power_budget_w is None:
        lower = _idle_lowerable(free, inp.successor_expected_s, cfg)
    target = OperatingPoint.of({**{d: hz for d, hz in current.items() if d not in lower},
                                **{d: spec.min_hz for d, spec in lower.items()}})
    reason = Reason.IDLE_LOWEST if inp.phase is Phase.IDLE else Reason.BUDGET_LOWEST
    writes = _writes(target, current, locked)
    if cfg.power_budget_w is not None and inp.phase is not Phase.IDLE:
        # Written even where the clock already reads lowest: a domain still under its
        # kernel governor (idle, hence at its lowest when the governor started) is
        # raised by that governor as soon as work arrives, past the budget.
        writes = MappingProxyType({d: spec.min_hz for d, spec in lower.items()})
    return Decision(inp.phase, target, writes, None, reason)


def _idle_lowerable(free: Mapping[str, DomainSpec], successor_s: float | None,
                    cfg: GovernorConfig) -> dict[str, DomainSpec]:
    """The domains IDLE may lower without a budget: the next phase starts on the idle clock and
    runs one transition latency before its own takes effect, allowed only where that costs it
    at most :data:`IDLE_SWITCH_SHARE` of the slowdown bound."""
    return {
        d: spec for d, spec in free.items()
        if switchable(spec, successor_s, cfg.min_phase_factor)
        and successor_s is not None
        and spec.transition_latency_s <= IDLE_SWITCH_SHARE * cfg.slowdown * successor_s
    }


def _untuned(inp: DecisionInput, free: Mapping[str, DomainSpec]) -> Decision:
    """An untuned phase without a budget: the top clocks on the domains worth switching, or
    every domain one step down while the power now is over the cap."""
    cap, current, locked = inp.power_cap_w, inp.current, inp.locked
    over = cap is not None and inp.power_now_w is not None and inp.power_now_w > cap
    freqs = dict(current)
    if not over:
        # No model yet: run it fast (nothing is known to be safe to lower), as
        # the performance governor would, on the domains worth switching.
        freqs.update({d: spec.max_hz for d, spec in free.items()})
    else:
        for name, spec in inp.domains.items():
            if name in locked or name not in current:
                continue
            step = spec.lower(current[name])
            if step is not None:
                freqs[name] = step
    target = OperatingPoint.of(freqs)
    reason = Reason.OVER_CAP_STEP_DOWN if over else Reason.TOP_CLOCKS
    return Decision(inp.phase, target, _writes(target, current, locked), None, reason, not over, capped=over)


def _tuned(inp: DecisionInput, model: PhaseModel, free: Mapping[str, DomainSpec]) -> Decision:
    """A tuned phase: its tuned point if it fits the cap, else the best point that does."""
    cfg = inp.config
    current, locked = inp.current, inp.locked
    if cfg.power_budget_w is not None:
        # Filling a budget runs at its edge: predict from the point tuning measured.
        model = model.anchored()
    fixed = {d: current[d] for d in model.center if d not in free and d in current}
    best = model.best
    if cfg.power_budget_w is not None and best is not None:
        # Under a budget a slow domain left above the tuned point by the phase before (the EMC
        # at its top after a backward pass, in a 27 ms data phase) is lowered all the same: a
        # write that lowers a clock under a cap is never held back, and keeping it would
        # leave the model to trade the phase's other clocks for it on cross terms it barely
        # knows (both CPU clusters of a data loader to their floor).
        fixed = {d: hz for d, hz in fixed.items() if best.get(d) is None or hz <= best[d]}
    if best is not None:
        # The tuned point, with any domain too slow to switch for this phase left where it
        # is (the model's cross terms are weakest far from its axes: keep what was measured).
        best = OperatingPoint.of({d: fixed.get(d, hz) for d, hz in best.items()})
        pred = _tuned_point_fits(inp, model, best)
        if pred is not None:
            target = _merge(current, best, locked)
            return Decision(inp.phase, target, _writes(target, current, locked), pred, Reason.TUNED_POINT)
    return _within_cap(inp, model, best, fixed)


def _tuned_point_fits(inp: DecisionInput, model: PhaseModel, best: OperatingPoint) -> Measurement | None:
    """The tuned point's predicted measurement if it fits its cap (None: it does not). The point
    tuning measured may use the budget up to the measured margin; any other, under a budget,
    is judged by the higher of the model's two power terms."""
    cap = inp.power_cap_w
    point_cap = cap
    if best == model.best and model.best_measured is not None:
        pred = model.predict(best)
        pred = Measurement(pred.seconds, max(pred.power_w, model.best_measured.power_w))
        # Measured, not predicted: it may use the budget up to the measured margin.
        point_cap = inp.measured_cap_w if inp.measured_cap_w is not None else cap
    else:
        # Not the point that was measured: under a budget, the higher of the model's
        # two power terms (a fixed clock's power is spread over a shorter phase).
        pred = model.predict(best, conservative=inp.config.power_budget_w is not None)
    if point_cap is None or pred.power_w + inp.power_bias_w <= point_cap:
        return pred
    return None


def _within_cap(inp: DecisionInput, model: PhaseModel, best: OperatingPoint | None,
                fixed: Mapping[str, int]) -> Decision:
    """The best point within the cap, jointly over the free domains (:func:`choose`): under a
    budget the fastest (a budget is a constraint to fill), else the least energy (a thermal cap
    alone only bounds it). If it cannot fit with the slow domains held, every unlocked domain is
    freed (safety over hysteresis)."""
    cfg = inp.config
    cap, current, locked = inp.power_cap_w, inp.current, inp.locked
    objective: Objective = "time" if cfg.power_budget_w is not None else "energy"
    ch = choose(model, slowdown=cfg.slowdown, power_cap_w=cap, fixed=fixed, power_bias_w=inp.power_bias_w,
                objective=objective)
    reason = Reason.FASTEST_IN_BUDGET if objective == "time" else Reason.LEAST_ENERGY
    capped = False
    if not ch.within_power and fixed:
        # Safety over hysteresis: free every unlocked domain before giving up on the cap.
        fixed = {d: current[d] for d in model.center if d in locked and d in current}
        ch = choose(model, slowdown=cfg.slowdown, power_cap_w=cap, fixed=fixed, power_bias_w=inp.power_bias_w,
                    objective=objective)
        reason, capped = Reason.CAP_OVER_HYSTERESIS, True
    cap_w = None
    if cap is not None and not math.isinf(cap) and best is not None and ch.point != best:
        capped, cap_w = True, cap
    target = _merge(current, ch.point, locked)
    return Decision(inp.phase, target, _writes(target, current, locked), ch.predicted, reason, ch.within_power,
                    capped=capped, cap_w=cap_w)


def _merge(current: Mapping[str, int], point: OperatingPoint, locked: frozenset[str]) -> OperatingPoint:
    freqs = dict(current)
    freqs.update({d: hz for d, hz in point.items() if d not in locked})
    return OperatingPoint.of(freqs)
