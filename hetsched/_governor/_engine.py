"""The governor's synchronous core loop: observe, decide (pure), apply through a port.

:class:`GovernorEngine` owns the learned state (phase models, durations, power bias,
thermal fits) and turns phase changes and telemetry ticks into writes through a
:class:`~hetsched._governor._ports.ClockPort`. The decisions themselves are made by
the pure :func:`~hetsched._governor._decide.decide`; this module only gathers its
inputs and applies its outputs; the books are kept by :mod:`._meter` (energy, power, time
per phase) and :mod:`._thermal` (the thermal guard), the writes and read-backs by
:mod:`._clocks`. It is what the public
:class:`~hetsched._governor._governor.Governor` drives on a board and what benchmarks
drive on the fast simulation.

Short phases: domains no working phase is long enough to switch are *held* by the longest
working phase, which is then tuned on the whole loop (see :mod:`._tuning`).

Dwell (``dwell_s``, set for a Session's per-request phases). A phase that lasts less than
``dwell_s`` switches no domain: a 30 fps loop that set the clocks for its 5 ms inference and
again for the 28 ms wait would write every domain 60 times a second, each write a transition
the work stalls on and a settle the measurements cannot trust. The loop's longest working
phase (its *owner*, INFER for inference) then sets every domain once for the whole loop, is
the only phase tuned, and is tuned on the loop (its work time; the energy of the whole
loop, the waits included), so the steady state writes only when the decision changes.
Writes that lower a clock under a power or thermal cap are never held back.

Hot board. Auto-tune goes on while the thermal guard holds the board back (started on a
board at its thermal steady state, it always does): each tuning point runs for one
occurrence of its phase, the guard's cap decides the rest, and a re-decision under a cap
that moved keeps the point; only a zone within half the thermal margin of its trip hands
the occurrence to the guard. Tuning effort is bounded (:meth:`PhaseTuning.propose
<hetsched._governor._tuning.PhaseTuning.propose>`): a tune that takes too long ends on the
best point it measured, ``GovernorStatistics.tuning_cut_short`` names those phases.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .._errors import ProfileError, RuntimeStateError
from .._snapshot import Snapshot
from ._caps import check_budget, phase_cap, tighter
from ._clocks import ClockWriter
from ._decide import Decision, DecisionInput, GovernorConfig, decide
from ._dwell import hold_back, log_decision, may_switch
from ._loop import held_domains
from ._meter import PhaseLedger, PowerMeter
from ._model import Measurement, PhaseModel
from ._phase import Phase, as_phase
from ._points import DomainSpec, OperatingPoint
from ._ports import ClockPort
from ._profile import BoardId, GovernorProfile
from ._published import Publisher
from ._statistics import GovernorStatistics, PhaseStatistics
from ._thermal import ThermalGuard
from ._tuner import axis_tuner
from ._tuner_seam import Tuner, TunerFactory
from ._tuning import LoopUnit, PhaseTuning

__all__ = ["GovernorEngine", "GovernorStatistics", "PhaseStatistics"]

log = logging.getLogger("hetsched.governor")

def _profiled_models(profile: GovernorProfile | None, board: BoardId) -> dict[Phase, PhaseModel]:
    """The phase models ``profile`` brings (none without one).

    :raises ProfileError: ``profile`` was made on another board (other domains).
    """
    if profile is None:
        return {}
    if profile.board.domains and dict(profile.board.domains) != dict(board.domains):
        raise ProfileError(
            f"governor profile for workload {profile.workload!r} was made on another board "
            f"(domains {sorted(profile.board.domains)} vs {sorted(board.domains)})"
        )
    return dict(profile.phases)


class GovernorEngine:
    """Synchronous governor core over a :class:`ClockPort` (see the module docstring).

    :raises ProfileError: ``profile`` was made on another board.
    :raises PowerBudgetError: a profiled phase cannot meet the power budget at any point.
    """

    def __init__(
        self,
        port: ClockPort,
        *,
        config: GovernorConfig | None = None,
        profile: GovernorProfile | None = None,
        autotune: bool = True,
        dry_run: bool = False,
        workload: str = "default",
        history: int = 256,
        dwell_s: float | None = None,
        tuner_factory: TunerFactory | None = None,
    ) -> None:
        self.port = port
        self.config = config or GovernorConfig()
        self.domains: dict[str, DomainSpec] = dict(port.domains())
        self.board = BoardId.of(port.soc, self.domains)
        self.workload = workload
        self.autotune = autotune
        self.dry_run = dry_run
        self.ungoverned = False
        self.dwell_s = dwell_s
        """Phases shorter than this switch no domain (see the module docstring); None: off."""
        self._models: dict[Phase, PhaseModel] = _profiled_models(profile, self.board)
        self._successor: dict[Phase, Phase] = {}
        self._book = PhaseLedger()
        self._tuning = PhaseTuning(self._models, self._book, tuner_factory=tuner_factory or axis_tuner,
                                   config=self.config.tuner)
        # A sysfs board's rail energy is the telemetry's trapezoid of the samples taken here,
        # at phase boundaries; a simulation's (or another port's) counter is its own.
        self._meter = PowerMeter(counters=not port.integrates_samples_by_telemetry)
        self._guard = ThermalGuard(self.config)
        self._clocks = ClockWriter(port, self.domains, self.config)
        self._saved: Any = None
        self._published = Publisher(port.state_dir, soc=port.soc)
        self._started = False
        self._restored = False
        # phase in progress
        self._phase: Phase | None = None
        self._phase_t0 = 0.0
        self._phase_e0 = 0.0
        self._phase_point: OperatingPoint | None = None
        self._phase_tuning = False
        self._phase_tuning_point: OperatingPoint | None = None
        self._phase_settling = False
        self._phase_guarded = False
        self._phase_lead: tuple[float, OperatingPoint] | None = None
        """How late the clocks raised for this occurrence landed, and what it ran at until then."""
        self._probes_stopped = 0
        self._phase_dirty = False

        self._last_decision: Decision | None = None
        # counters
        self._switches = 0
        self._decisions = 0
        self._avoided = 0
        self._capped = 0
        self._max_pred: float | None = None
        self._logged = 0
        self._t_start: float | None = None
        self.history: deque[Decision] = deque(maxlen=history)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Save every knob (unless dry-run), read the clocks, take the first sample.

        :raises PowerBudgetError: see the class docstring.
        :raises SysfsPermissionError: the knobs cannot be read (the caller decides on ``strict``).
        """
        if self._started:
            return
        self._check_budget()
        if not self.dry_run and not self.ungoverned:
            self._saved = self.port.save()
        try:
            self._clocks.read_all()
            self._t_start = self.port.now()
            self._published.started(self._saved, dry_run=self.dry_run)
            self._started = True
            self._observe(self.port.sample())
            if self.config.power_budget_w is not None:
                # Under a budget nothing is known to be safe yet but the lowest clocks: take
                # every domain from the kernel governors (which may well run at the top) now.
                self._apply({n: s.min_hz for n, s in self.domains.items()})
        except BaseException:
            # Saved means the root's lock is held and knobs may have moved: put them back and
            # let the lock go now, not when the port is collected.
            self.close()
            raise

    def _check_budget(self) -> None:
        check_budget(self._models, self.config)

    def close(self) -> None:
        """Finish the phase in progress and restore every saved knob (idempotent)."""
        if self._restored:
            return
        if self._phase is not None and self._started:
            self._finish_phase(self.port.now())
            self._phase = None
        self._restored = True
        restored = False
        try:
            if self._saved is not None:
                self.port.restore(self._saved)
                log.info("governor: clocks restored")
            restored = True
        finally:
            self._published.closed(restored=restored)

    def go_ungoverned(self, reason: str) -> None:
        """Stop writing for the rest of the run (permission missing and ``strict=False``)."""
        self.ungoverned = True
        log.warning("governor: running ungoverned: %s", reason)

    # -- observation ----------------------------------------------------------------

    def _observe(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        t = self.port.now()
        power, dt = self._meter.observe(t, snap)
        phase_s = self._book.expected.get(self._phase, 0.0) if self._phase else 0.0
        self._guard.observe(t, snap, power, dt, smooth_w=self._meter.smooth_w, phase_s=phase_s)

    def power_cap(self) -> float | None:
        """The tighter of the budget cap and the thermal guard's (mean-power) cap, now."""
        return tighter(self.config.budget_cap_w, self._guard.cap_w)

    def phase_cap(self, phase: Phase, *, measured: bool = False) -> float | None:
        """The cap for ``phase``'s decision (:func:`~hetsched._governor._caps.phase_cap`);
        ``measured``: for a measured point's power (the budget less the measured margin)."""
        budget = self.config.measured_cap_w if measured else self.config.budget_cap_w
        return phase_cap(
            phase, budget_cap_w=budget, thermal_cap_w=self._guard.cap_w, models=self._models, book=self._book,
        )

    # -- phases ---------------------------------------------------------------------

    def enter(self, phase: Phase | str) -> Decision:
        """The program enters ``phase``: account for the one that ended, decide, apply.

        :raises RuntimeStateError: after :meth:`close` (the clocks are restored; a write now
            would undo that).
        """
        phase = as_phase(phase)
        if self._restored:
            raise RuntimeStateError("the governor has restored the clocks and stopped; it cannot enter a phase")
        if not self._started:
            self.start()
        now = self.port.now()
        self._observe(self.port.sample())
        self._verify()
        if self._phase is not None:
            self._finish_phase(now)
            self._successor[self._phase] = phase
        tuning = self._tuning
        if phase is tuning.loop_owner:
            tuning.finish_loop()
        self._switches += 1
        self._phase = phase
        self._phase_t0 = now
        self._phase_e0 = self._meter.energy_j
        self._phase_dirty = False
        if self.autotune and not self.dry_run:
            tuning.start(phase, domains=self.domains, locked=self._clocks.locked, config=self.config,
                         dwell_s=self.dwell_s)
        tuning_point = None
        if phase in tuning.tuners:
            # Tuned under the guard's pressure too: a board at its thermal steady state is
            # under it for good (PhaseTuning.propose); only a zone near its trip holds it.
            tuning_point = tuning.propose(phase, hold=self._guard.near_trip())
        self._phase_tuning = tuning_point is not None
        self._phase_tuning_point = tuning_point
        tuner = tuning.tuners.get(phase)
        self._phase_guarded = tuning_point is not None and tuner is not None and tuner.guarded(tuning_point)
        before = dict(self._clocks.current)
        decision = self._decide(phase, tuning_point)
        self._phase_point = OperatingPoint.of(dict(self._clocks.current))
        # Raised clocks land a transition latency late: the phase's first moments ran at
        # the old ones (what :func:`settled` takes out of a measurement under a budget).
        raised = [d for d, hz in decision.writes.items() if d in self.domains and d in before and hz > before[d]]
        self._phase_lead = None if not raised else (
            max(self.domains[d].transition_latency_s for d in raised),
            OperatingPoint.of({**self._phase_point.as_dict(), **{d: before[d] for d in raised}}),
        )
        # A slow domain written now reaches its new clock only part-way through the phase
        # (a 5-8 ms Jetson GPU/EMC change in a 10 ms phase): this occurrence measures neither
        # point. The tuner asks for the same point again, which then runs settled.
        # Only domains no other phase touches in between (too slow to switch for this phase
        # when its tuning began) stay put for the repeat; the others are written every time.
        slow = tuning.slow.get(phase, frozenset())
        self._phase_settling = self._phase_tuning and any(d in slow for d in decision.writes)
        if phase is tuning.loop_owner:
            tuning.loop_acc = LoopUnit(tuning_point, self._phase_point, valid=not self._phase_settling,
                                       peak=self.config.power_budget_w is not None)
        self._published.update(now, phase, self._clocks.current, self.locked)
        return decision

    def tick(self) -> Decision | None:
        """A telemetry tick inside a phase: update the thermal guard; re-decide if the cap moved."""
        if not self._started or self._restored:
            return None
        before = self.power_cap()
        self._observe(self.port.sample())
        self._verify()
        self._published.update(self.port.now(), self._phase, self._clocks.current, self.locked)
        budget = self.config.power_budget_w
        power = self._meter.power_w
        if self._phase_guarded and self._phase_tuning and budget is not None and power is not None and power > budget:
            return self._stop_probe(power)
        after = self.power_cap()
        if self._phase is None or before == after:
            return None
        if self._phase_tuning and not self._thermal_pressure():
            return None
        decision = self._decide(self._phase, None)
        if decision.writes:
            self._phase_dirty = True
            self._phase_tuning = False
        return decision

    def _stop_probe(self, power_w: float) -> Decision:
        """A guarded probe read over the budget: the tuner drops it, the phase goes back to the
        centre the probe stepped from (measured, so within the budget) and is not measured."""
        phase = self._phase
        assert phase is not None
        tuner = self._tuning.tuners.get(phase)
        point = self._phase_tuning_point
        if tuner is not None and point is not None:
            tuner.reject(point, power_w)
        log.info("governor: %s: guarded probe %s stopped at %.2f W (budget %s W)", phase, point, power_w,
                 self.config.power_budget_w)
        self._probes_stopped += 1
        self._phase_guarded = False
        self._phase_tuning = False
        self._phase_dirty = True
        return self._decide(phase, tuner.center if tuner is not None else None)

    def _thermal_pressure(self) -> bool:
        return self._guard.pressure(self._meter.max_smooth_w)

    def _held_for(self, phase: Phase) -> frozenset[str]:
        return held_domains(
            phase, self._book.shortest, self.domains, self._clocks.locked, self.config.min_phase_factor
        )

    def _finish_phase(self, now: float) -> None:
        phase = self._phase
        assert phase is not None
        seconds = now - self._phase_t0
        energy = self._meter.energy_j - self._phase_e0
        point = self._phase_point
        self._book.record(phase, seconds, energy, None if point is None else point.as_dict())
        acc = self._tuning.loop_acc
        if acc is not None:
            acc.add(phase, seconds, energy, dirty=self._phase_dirty)
        if seconds <= 0:
            return
        m = Measurement(seconds, energy / seconds)
        point = self._phase_point
        if self._phase_dirty or point is None or phase is self._tuning.loop_owner:
            return
        self._tuning.credit(phase, m, point, tuning=self._phase_tuning, tuning_point=self._phase_tuning_point,
                            settling=self._phase_settling,
                            lead=self._phase_lead if self.config.power_budget_w is not None else None)

    # -- decide and apply -----------------------------------------------------------------

    def _decide(self, phase: Phase, tuning_point: OperatingPoint | None) -> Decision:
        if tuning_point is None and self._phase_tuning and phase is self._phase:
            tuning_point = self._tuning_kept(phase)
        inp = DecisionInput(
            phase=phase,
            domains=MappingProxyType(self.domains),
            current=MappingProxyType(dict(self._clocks.current)),
            config=self.config,
            model=self._models.get(phase),
            # Switching is judged on how short the phase can be (its run at the top clocks),
            # not on a running mean that a slow point inflates: a domain switched only while
            # the phase runs slowly would flip in and out of the phase's control.
            expected_phase_s=self._book.length(phase),
            power_cap_w=self.phase_cap(phase),
            measured_cap_w=self.phase_cap(phase, measured=True),
            power_bias_w=max(0.0, self._book.bias.get(phase, 0.0)),
            power_now_w=self._meter.power_w,
            locked=frozenset(self._clocks.locked),
            tuning_point=tuning_point,
            successor_expected_s=self._book.length(self._successor.get(phase)),
            held=self._held_for(phase),
            # Under a budget an untuned phase would otherwise run at the floor.
            follows_owner=self.config.power_budget_w is not None and self._tuning.loop_owner not in (None, phase)
            and phase not in self._models,
        )
        decision = self._hold_back(decide(inp), tuning_point)
        self._decisions += 1
        if decision.predicted is not None:
            p = decision.predicted.power_w
            self._max_pred = p if self._max_pred is None else max(self._max_pred, p)
        if decision.capped:
            self._capped += 1
        model = inp.model
        if model is not None and tuning_point is None:
            wanted = model.best or model.center
            self._avoided += sum(1 for d, hz in wanted.items() if d in inp.current and inp.current[d] != hz
                                 and d not in decision.writes and d not in self._clocks.locked)
        self.history.append(decision)
        self._last_decision = decision
        self._log(decision, inp.current)
        self._apply(decision.writes)
        return decision

    def _tuning_kept(self, phase: Phase) -> OperatingPoint | None:
        """The tuning point of the occurrence in progress, if a re-decision under the thermal
        cap may keep it (else None: the guard decides, the occurrence measures nothing).

        One occurrence at a tuning point is too short to heat a zone much, and a board at
        its thermal steady state has the cap move at every reading: dropping the point
        whenever it moved would never let an occurrence be measured. So the point stays
        unless a zone is within half the margin of its trip (:meth:`ThermalGuard.near_trip`).
        """
        point = self._phase_tuning_point
        tuner = self._tuning.tuners.get(phase)
        if point is None or tuner is None:
            return None
        return None if self._guard.near_trip() else point

    def _dwelling(self, phase: Phase) -> bool | None:
        return may_switch(phase, self._book.expected, self.dwell_s)

    def _hold_back(self, decision: Decision, tuning_point: OperatingPoint | None) -> Decision:
        if tuning_point is not None or not decision.writes or self._dwelling(decision.phase) is not False:
            return decision
        kept = hold_back(decision, self._clocks.current)
        self._avoided += len(decision.writes) - len(kept.writes)
        return kept

    def _log(self, decision: Decision, before: Mapping[str, int]) -> None:
        self._logged += log_decision(log, decision, before, dry_run=self.dry_run)

    def _apply(self, writes: Mapping[str, int]) -> None:
        self._clocks.apply(writes, pretend=self.dry_run or self.ungoverned)

    def _verify(self) -> None:
        for name in self._clocks.verify():
            self._tuning.drop(name)

    # -- results ----------------------------------------------------------------------

    @property
    def phase(self) -> Phase | None:
        return self._phase

    @property
    def current(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._clocks.current))

    @property
    def locked(self) -> frozenset[str]:
        return frozenset(self._clocks.locked)

    @property
    def tuning_done(self) -> bool:
        """Every phase seen (except IDLE) is tuned or too short to tune."""
        return all(p is Phase.IDLE or p in self._models or p in self._tuning.untunable for p in self._book.expected)

    def models(self) -> Mapping[Phase, PhaseModel]:
        return MappingProxyType(dict(self._models))

    def tuners(self) -> Mapping[Phase, Tuner]:
        """The tunes in progress, by phase (read-only; each seen through the :class:`Tuner` protocol)."""
        return MappingProxyType(dict(self._tuning.tuners))

    def profile(self) -> GovernorProfile:
        """What has been learned so far, for :meth:`GovernorProfile.save`."""
        return GovernorProfile(self.board, self.workload, self.config.slowdown, MappingProxyType(dict(self._models)))

    def statistics(self) -> GovernorStatistics:
        phases = {
            p: self._book.statistics(
                p, tuned=p in self._models, tuning=p in self._tuning.tuners, untunable=p in self._tuning.untunable
            )
            for p in sorted(set(self._book.occurrences) | set(self._models) | set(self._tuning.tuners))
        }
        return GovernorStatistics(
            phase=self._phase,
            phase_switches=self._switches,
            decisions=self._decisions,
            writes=self._clocks.writes,
            writes_avoided=self._avoided,
            tuning_measurements=self._tuning.measurements,
            tuned_phases=tuple(sorted(self._models)),
            locked_domains=tuple(sorted(self._clocks.locked)),
            capped_decisions=self._capped,
            thermal_cap_w=self._guard.cap_w,
            power_cap_w=self.power_cap(),
            thermal_zone=self._guard.zone,
            max_predicted_power_w=self._max_pred,
            energy_j=self._meter.energy_j,
            dry_run=self.dry_run,
            ungoverned=self.ungoverned,
            restored=self._restored,
            phases=MappingProxyType(phases),
            writes_by_domain=MappingProxyType(dict(self._clocks.writes_by_domain)),
            decisions_logged=self._logged,
            elapsed_s=0.0 if self._t_start is None else max(0.0, self.port.now() - self._t_start),
            peak_temp_c=MappingProxyType(dict(self._meter.peak_temp_c)),
            tuning_cut_short=tuple(sorted(self._tuning.cut_short)),
            tuning_held=self._tuning.held,
            guarded_probes_stopped=self._probes_stopped,
        )

