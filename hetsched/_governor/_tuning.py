"""The governor's auto-tune of phases: which phase next, over which domains, on what unit.

Short phases. Whether a domain is switched for a phase is judged on the phase's shortest
run (at the top clocks), against the domain's transition latency (``min_phase_factor``).
Domains no working phase is long enough to switch (a Jetson GPU or EMC in a 33 ms camera
frame) are *held*: the longest working phase sets them once for the whole loop, and its
auto-tune then measures the *loop* (that phase and every working phase until it starts
again, plus the energy of any IDLE between, :attr:`PhaseModel.unit` ``"loop"``, summed by
:class:`LoopUnit`), since the short phases run at the clocks it leaves. Under a power budget
too: a 2 ms preprocess that cannot switch its CPU runs at the CPU clock the 10 ms inference
left, and judged on its own phase the inference would leave the CPU at its floor (it does
not need it). The budget caps every phase's power, not the loop's mean, so there the
loop's power is that of its hungriest phase (:attr:`LoopUnit.peak`). A tuning point that
writes a domain too slow for the phase gets a settle run (the occurrence is not measured,
the point is repeated).

:func:`plan_tuning` is a pure function of what the engine has seen so far;
:class:`PhaseTuning` keeps the tuners it starts, and hands them what the engine measured.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from ._decide import GovernorConfig, switchable
from ._dwell import may_switch
from ._loop import held_domains, loop_slowdown, slowdown_share
from ._meter import PhaseLedger
from ._model import Measurement, PhaseModel
from ._phase import Phase
from ._points import DomainSpec, OperatingPoint
from ._tuner import axis_tuner
from ._tuner_budget import lead_in_floor, settled
from ._tuner_config import TunerConfig
from ._tuner_seam import Tuner, TunerFactory, TunerSettings

__all__ = ["LoopUnit", "PhaseTuning", "TunePlan", "plan_tuning"]

log = logging.getLogger("hetsched.governor")


@dataclass(frozen=True)
class TunePlan:
    """Tune a phase over ``tune`` (empty: the phase cannot be tuned, mark it so)."""

    tune: tuple[str, ...]
    slow: frozenset[str] = frozenset()
    """The domains in ``tune`` too slow to switch for the phase (its tuning points settle)."""
    owns_loop: bool = False
    """The phase becomes the loop owner: it is tuned on the whole loop."""


def plan_tuning(
    phase: Phase,
    *,
    tuned: Collection[Phase],
    tuning: Collection[Phase],
    untunable: Collection[Phase],
    book: PhaseLedger,
    domains: Mapping[str, DomainSpec],
    locked: Collection[str],
    config: GovernorConfig,
    dwell_s: float | None,
    loop_owner: Phase | None,
) -> TunePlan | None:
    """Whether to start tuning ``phase`` now (None: not now).

    One phase at a time, the longest untuned one first (shorter phases inherit the
    domains they cannot switch from it), once it has run :attr:`TunerConfig.tune_after
    <._tuner_config.TunerConfig.tune_after>` times (``config.tuner``).
    """
    if (
        phase is Phase.IDLE
        or phase in tuned
        or phase in tuning
        or phase in untunable
        or phase not in book.expected
        or book.occurrences.get(phase, 0) < config.tuner.tune_after
    ):
        return None
    if tuning:
        return None  # one phase at a time: the others' clocks must be settled while it is measured
    dwelling = may_switch(phase, book.expected, dwell_s)
    if dwelling is not None and not dwelling:
        # Too short to switch anything for: it runs at the clocks the loop's owner sets.
        return TunePlan(())
    # Longest phases first: shorter ones inherit the domains they cannot switch from them.
    waiting = [p for p in book.expected if p is not Phase.IDLE and p not in tuned and p not in untunable]
    if max(waiting, key=lambda p: book.expected[p]) is not phase:
        return None
    expected = book.shortest.get(phase, book.expected[phase])
    held = held_domains(phase, book.shortest, domains, locked, config.min_phase_factor)
    tune = tuple(
        name
        for name, spec in domains.items()
        if name not in locked and (name in held or switchable(spec, expected, config.min_phase_factor))
    )
    if not tune:
        return TunePlan(())
    # Under a dwell the owner sets the clocks the shorter phases run at, as for held domains.
    owns = bool(dwelling) and any(
        may_switch(p, book.expected, dwell_s) is False for p in book.expected if p is not phase
    )
    # A working phase too short to switch any domain runs at the clocks this one leaves (a
    # 1 ms postprocess on the CPU clock inference left at its floor, under a budget).
    shares = any(
        not any(switchable(spec, t, config.min_phase_factor) for n, spec in domains.items() if n not in locked)
        for p, t in book.shortest.items() if p not in (phase, Phase.IDLE)
    )
    owns_loop = bool(held or owns or shares) and loop_owner is None
    slow = frozenset(d for d in tune if not switchable(domains[d], expected, config.min_phase_factor))
    return TunePlan(tune, slow, owns_loop)


@dataclass
class LoopUnit:
    """One occurrence of the loop being summed up into one unit of the owner's work."""

    tuning_point: OperatingPoint | None
    """The point the owner's tuner asked for (None: not tuning)."""
    point: OperatingPoint | None
    """The clocks the owner set."""
    valid: bool
    """False once anything in the loop ran at other clocks (a settle, a re-decision)."""
    peak: bool = False
    """The unit's power is its hungriest working phase's mean power (under a power budget,
    which caps each phase), not the loop's energy over its work time."""
    seconds: float = 0.0
    energy_j: float = 0.0
    peak_w: float = 0.0

    def add(self, phase: Phase, seconds: float, energy_j: float, *, dirty: bool) -> None:
        """A phase of the loop ended (``dirty``: it was re-decided while it ran)."""
        # Idle time is not work (the bound is on work time), its energy is the loop's.
        if phase is not Phase.IDLE:
            self.seconds += seconds
            if seconds > 0:
                self.peak_w = max(self.peak_w, energy_j / seconds)
        self.energy_j += energy_j
        if dirty:
            self.valid = False

    def measurement(self) -> Measurement | None:
        """The loop as one unit of work (None: not a valid one)."""
        if not self.valid or self.seconds <= 0 or self.point is None:
            return None
        return Measurement(self.seconds, self.peak_w if self.peak else self.energy_j / self.seconds)


class PhaseTuning:
    """The engine's tuners, the phases too short to tune, and the loop owner's unit of work.

    ``models`` and ``book`` are the engine's own: a phase whose tuning is done gets its
    model in ``models``; a tuned phase's measurements update its power bias in ``book``.
    """

    def __init__(self, models: dict[Phase, PhaseModel], book: PhaseLedger, *,
                 tuner_factory: TunerFactory = axis_tuner, config: TunerConfig | None = None) -> None:
        self._config = config or TunerConfig()
        """The driver's effort bound (:attr:`TunerConfig.occurrences_per_measurement`); the
        tuners get ``GovernorConfig.tuner`` at :meth:`start`."""
        self._models = models
        self._book = book
        self._make_tuner = tuner_factory
        self.tuners: dict[Phase, Tuner] = {}
        self.slow: dict[Phase, frozenset[str]] = {}
        """Per phase being tuned, the domains too slow to switch for it (see :class:`TunePlan`)."""
        self.untunable: set[Phase] = set()
        self.loop_owner: Phase | None = next((p for p, m in models.items() if m.unit == "loop"), None)
        """The phase that is tuned on the whole loop (see :attr:`PhaseModel.unit`)."""
        self.loop_acc: LoopUnit | None = None
        self.measurements = 0
        """Tuning measurements handed to a tuner so far."""
        self.cut_short: set[Phase] = set()
        """Phases whose tuning the effort bound ended (on the best point measured by then, or
        untunable with nothing measured): see :meth:`propose`."""
        self.held = 0
        """Occurrences of a phase being tuned that the thermal guard decided instead (a zone
        near its trip): see :meth:`propose`."""
        self._occurrences: dict[Phase, int] = {}

    def start(
        self,
        phase: Phase,
        *,
        domains: Mapping[str, DomainSpec],
        locked: Collection[str],
        config: GovernorConfig,
        dwell_s: float | None,
    ) -> None:
        """Start tuning ``phase`` if :func:`plan_tuning` says so (or mark it untunable)."""
        plan = plan_tuning(
            phase, tuned=self._models, tuning=self.tuners, untunable=self.untunable, book=self._book,
            domains=domains, locked=locked, config=config, dwell_s=dwell_s, loop_owner=self.loop_owner,
        )
        if plan is None:
            return
        if not plan.tune:
            self.untunable.add(phase)
            return
        if plan.owns_loop:
            self.loop_owner = phase
        self.slow[phase] = plan.slow
        self._occurrences[phase] = 0
        self.tuners[phase] = self._make_tuner(domains, plan.tune, TunerSettings(
            slowdown=self.slowdown_for(phase, config),
            power_cap_w=config.budget_cap_w,
            measured_cap_w=config.measured_cap_w,
            levels=config.tune_levels,
            passes=config.tune_passes,
            repeats=config.tune_repeats,
            guarded=config.guarded_probes,
            config=config.tuner,
        ))

    def slowdown_for(self, phase: Phase, config: GovernorConfig) -> float:
        """The slowdown bound ``phase`` is tuned to (:func:`~hetsched._governor._loop.slowdown_share`)."""
        owner = self.loop_owner
        return slowdown_share(
            phase, loop_slowdown(config, self._book.shortest), owner=owner,
            owner_model=self._models.get(owner) if owner is not None else None,
            shortest=self._book.shortest, settled=set(self._models) | self.untunable,
        )

    def propose(self, phase: Phase, *, hold: bool = False) -> OperatingPoint | None:
        """The point ``phase``'s tuner asks for (None: not tuning now; a tuner that is done
        leaves its model in ``models``).

        Hot board. Tuning goes on while the thermal guard holds the board back (on a board
        at its thermal steady state it does so for good): a tuning point runs for one
        occurrence of the phase, too short to heat a zone much, and the guard's cap still
        decides every other phase, and every decision once the phase is tuned. Only with
        ``hold`` (a zone within half the thermal margin of its trip,
        :meth:`~hetsched._governor._thermal.ThermalGuard.near_trip`) is the occurrence
        left to the guard: not a tuning one, counted in :attr:`held`.

        Effort bound. Every occurrence counts, whether it measured anything or not (held,
        a settle run, a run re-decided under a cap); past
        :attr:`TunerConfig.occurrences_per_measurement
        <._tuner_config.TunerConfig.occurrences_per_measurement>` times the tuner's
        :attr:`~hetsched._governor._tuner_seam.Tuner.measurement_limit`, the tuning ends on
        the best point measured (:meth:`Tuner.finish
        <hetsched._governor._tuner_seam.Tuner.finish>`), or, with nothing measured to build
        on, the phase is marked untunable. Either way it is in :attr:`cut_short`. A tuner
        also ends by itself at its measurement limit.
        """
        tuner = self.tuners.get(phase)
        if tuner is None:
            return None
        n = self._occurrences.get(phase, 0) + 1
        self._occurrences[phase] = n
        if n > self._config.occurrences_per_measurement * tuner.measurement_limit:
            self.cut_short.add(phase)
            if not tuner.finish():
                log.warning("governor: %s: tuning measured nothing in %d occurrences: left untuned", phase, n - 1)
                del self.tuners[phase]
                self.untunable.add(phase)
                return None
        elif hold:
            self.held += 1
            return None
        point = tuner.propose()
        if point is None:
            model = tuner.model()
            if model is not None:
                if phase is self.loop_owner:
                    model = replace(model, unit="loop")
                self._models[phase] = model
                if tuner.cut_short:
                    self.cut_short.add(phase)
                log.info("governor: %s tuned%s: %s", phase, " (effort bound)" if tuner.cut_short else "", model.best)
            del self.tuners[phase]
        return point

    def finish_loop(self) -> None:
        """The loop owner starts again: the loop since its last start is one unit of work."""
        acc, self.loop_acc = self.loop_acc, None
        owner = self.loop_owner
        if acc is None or owner is None:
            return
        m = acc.measurement()
        if m is None or acc.point is None:
            return
        tuner = self.tuners.get(owner)
        if tuner is not None:
            if acc.tuning_point is not None:
                tuner.record(acc.tuning_point, m)
                self.measurements += 1
            return
        model = self._models.get(owner)
        if model is not None:
            self._book.update_bias(owner, m.power_w - model.predict(acc.point).power_w)

    def credit(
        self,
        phase: Phase,
        m: Measurement,
        point: OperatingPoint,
        *,
        tuning: bool,
        tuning_point: OperatingPoint | None,
        settling: bool,
        lead: tuple[float, OperatingPoint] | None = None,
    ) -> None:
        """One occurrence of ``phase`` ran at ``point``: to its tuner (``tuning``: it ran at
        ``tuning_point``; ``settling``: a settle run, not measured), else to its power bias.

        ``lead`` (under a budget): how late the clocks it raised landed, and the clocks it ran
        at until then; its power then counts as the bound on what it settled at
        (:func:`~._tuner_budget.settled`, :func:`~._tuner_budget.lead_in_floor`).
        """
        tuner = self.tuners.get(phase)
        if tuning and tuner is not None:
            if settling:
                return
            if tuning_point is not None:
                if lead is not None:
                    m = settled(m, lead[0], lead_in_floor(tuner.measured(), lead[1]))
                tuner.record(tuning_point, m)
            self.measurements += 1
            return
        model = self._models.get(phase)
        if model is not None:
            if lead is not None:
                m = settled(m, lead[0], lead_in_floor(model.measured_points(), lead[1]))
            self._book.update_bias(phase, m.power_w - model.predict(point).power_w)

    def drop(self, domain: str) -> None:
        """``domain`` got locked: tuning sweeps that include it would never converge, so
        they start again without it."""
        for p in [p for p, t in self.tuners.items() if domain in t.domains]:
            del self.tuners[p]
