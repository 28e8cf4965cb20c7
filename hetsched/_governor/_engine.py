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

Short phases. Whether a domain is switched for a phase is judged on the phase's shortest
run (at the top clocks), against the domain's transition latency (``min_phase_factor``).
Domains no working phase is long enough to switch (a Jetson GPU or EMC in a 33 ms camera
frame) are *held*: the longest working phase sets them once for the whole loop, and its
auto-tune then measures the *loop* (that phase and every working phase until it starts
again, plus the energy of any IDLE between, :attr:`PhaseModel.unit` ``"loop"``), since
the short phases run at the clocks it leaves. A tuning point that writes a domain too slow
for the phase gets a settle run (the occurrence is not measured, the point is repeated).

Dwell (``dwell_s``, set for a Session's per-request phases). A phase that lasts less than
``dwell_s`` switches no domain: a 30 fps loop that set the clocks for its 5 ms inference and
again for the 28 ms wait would write every domain 60 times a second, each write a transition
the work stalls on and a settle the measurements cannot trust. The loop's longest working
phase (its *owner*, INFER for inference) then sets every domain once for the whole loop, is
the only phase tuned, and is tuned on the loop (its work time; the energy of the whole
loop, the waits included), so the steady state writes only when the decision changes.
Writes that lower a clock under a power or thermal cap are never held back.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from .._errors import PowerBudgetError, ProfileError, RuntimeStateError
from .._snapshot import Snapshot
from ._clocks import ClockWriter
from ._decide import Decision, DecisionInput, GovernorConfig, decide, switchable
from ._dwell import hold_back, log_decision, may_switch
from ._loop import held_domains, loop_slowdown, slowdown_share
from ._meter import PhaseLedger, PowerMeter
from ._model import Measurement, PhaseModel, choose
from ._phase import Phase, as_phase
from ._points import DomainSpec, OperatingPoint
from ._ports import ClockPort
from ._profile import BoardId, GovernorProfile
from ._published import Publisher
from ._statistics import GovernorStatistics, PhaseStatistics
from ._thermal import ThermalGuard
from ._tuner import AxisTuner

__all__ = ["GovernorEngine", "GovernorStatistics", "PhaseStatistics"]

log = logging.getLogger("hetsched.governor")

_TUNE_AFTER = 3
"""Occurrences of a phase before its tuning starts: the first run under the kernel's
governors, the next ones at the top clocks (what the phase's length is judged on)."""


def _samples_integrated_by_telemetry(port: ClockPort) -> bool:
    from ._sysfs import SysfsPort

    return isinstance(port, SysfsPort)


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
        self._models: dict[Phase, PhaseModel] = {}
        if profile is not None:
            if profile.board.domains and dict(profile.board.domains) != dict(self.board.domains):
                raise ProfileError(
                    f"governor profile for workload {profile.workload!r} was made on another board "
                    f"(domains {sorted(profile.board.domains)} vs {sorted(self.board.domains)})"
                )
            self._models.update(profile.phases)
        self._tuners: dict[Phase, AxisTuner] = {}
        self._tuner_slow: dict[Phase, frozenset[str]] = {}
        self._untunable: set[Phase] = set()
        self._successor: dict[Phase, Phase] = {}
        self._book = PhaseLedger()
        # A sysfs board's rail energy is the telemetry's trapezoid of the samples taken here,
        # at phase boundaries; a simulation's (or another port's) counter is its own.
        self._meter = PowerMeter(counters=not _samples_integrated_by_telemetry(port))
        self._guard = ThermalGuard(self.config)
        self._clocks = ClockWriter(port, self.domains, self.config)
        self._saved: Any = None
        self._published = Publisher.for_port(port)
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
        self._phase_dirty = False
        # loop-unit tuning (see PhaseModel.unit): the phase that owns the loop, and the
        # occurrence being accumulated: [work seconds, energy, tuning point, point, valid].
        self._loop_owner: Phase | None = next((p for p, m in self._models.items() if m.unit == "loop"), None)
        self._loop_acc: list[Any] | None = None

        self._last_decision: Decision | None = None
        # counters
        self._switches = 0
        self._decisions = 0
        self._avoided = 0
        self._tune_meas = 0
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
        self._clocks.read_all()
        self._t_start = self.port.now()
        self._published.started(self._saved, dry_run=self.dry_run)
        self._started = True
        self._observe(self.port.sample())
        if self.config.power_budget_w is not None:
            # Under a budget nothing is known to be safe yet but the lowest clocks: take
            # every domain from the kernel governors (which may well run at the top) now.
            self._apply({n: s.min_hz for n, s in self.domains.items()})

    def _check_budget(self) -> None:
        cap = self.config.budget_cap_w
        if cap is None:
            return
        for phase, model in self._models.items():
            ch = choose(model, slowdown=self.config.slowdown, power_cap_w=cap)
            if not ch.within_power:
                raise PowerBudgetError(
                    f"power budget {self.config.power_budget_w} W cannot be met in phase {phase}: "
                    f"the lowest operating point the profile knows is predicted at {ch.predicted.power_w:.2f} W"
                )

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
        caps = [c for c in (self.config.budget_cap_w, self._guard.cap_w) if c is not None]
        return min(caps) if caps else None

    def _unconstrained_power(self, phase: Phase) -> float | None:
        model = self._models.get(phase)
        if model is not None and model.best is not None:
            return model.predict(model.best).power_w + max(0.0, self._book.bias.get(phase, 0.0))
        return self._book.mean_power(phase)

    def phase_cap(self, phase: Phase) -> float | None:
        """The cap for ``phase``'s decision.

        The budget is a hard cap on every phase. The thermal cap is on *mean* power (a
        zone's time constant is seconds to minutes, phases are milliseconds), so it is
        shared out in proportion to what each phase draws unconstrained: the hungry
        phases give up the most watts instead of every phase being cut to the same level.
        """
        thermal = self._guard.cap_w
        if thermal is not None:
            mine = self._unconstrained_power(phase)
            weights = [
                (pw, self._book.expected[p])
                for p in self._book.expected
                if (pw := self._unconstrained_power(p)) is not None and self._book.expected[p] > 0
            ]
            total_t = sum(t for _, t in weights)
            if mine is not None and total_t > 0:
                mean = sum(pw * t for pw, t in weights) / total_t
                thermal = None if mean <= thermal else mine * thermal / mean
        caps = [c for c in (self.config.budget_cap_w, thermal) if c is not None]
        return min(caps) if caps else None

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
        if phase is self._loop_owner:
            self._finish_loop()
        self._switches += 1
        self._phase = phase
        self._phase_t0 = now
        self._phase_e0 = self._meter.energy_j
        self._phase_dirty = False
        self._maybe_start_tuner(phase)
        tuning_point = None
        tuner = self._tuners.get(phase)
        if tuner is not None and not self._thermal_pressure():
            tuning_point = tuner.propose()
            if tuning_point is None:
                model = tuner.model()
                if model is not None:
                    if phase is self._loop_owner:
                        model = replace(model, unit="loop")
                    self._models[phase] = model
                    log.info("governor: %s tuned: %s", phase, model.best)
                del self._tuners[phase]
        self._phase_tuning = tuning_point is not None
        self._phase_tuning_point = tuning_point
        decision = self._decide(phase, tuning_point)
        self._phase_point = OperatingPoint.of(dict(self._clocks.current))
        # A slow domain written now reaches its new clock only part-way through the phase
        # (a 5-8 ms Jetson GPU/EMC change in a 10 ms phase): this occurrence measures neither
        # point. The tuner asks for the same point again, which then runs settled.
        # Only domains no other phase touches in between (too slow to switch for this phase
        # when its tuning began) stay put for the repeat; the others are written every time.
        slow = self._tuner_slow.get(phase, frozenset())
        self._phase_settling = self._phase_tuning and any(d in slow for d in decision.writes)
        if phase is self._loop_owner:
            valid = not self._phase_settling
            self._loop_acc = [0.0, 0.0, tuning_point, self._phase_point, valid]
        self._published.update(now, phase, self._clocks.current, self.locked)
        return decision

    def _finish_loop(self) -> None:
        """The loop owner starts again: the loop since its last start is one unit of work."""
        acc, self._loop_acc = self._loop_acc, None
        owner = self._loop_owner
        if acc is None or owner is None:
            return
        seconds, energy, tuning_point, point, valid = acc
        if not valid or seconds <= 0 or point is None:
            return
        m = Measurement(seconds, energy / seconds)
        tuner = self._tuners.get(owner)
        if tuner is not None:
            if tuning_point is not None:
                tuner.record(tuning_point, m)
                self._tune_meas += 1
            return
        model = self._models.get(owner)
        if model is not None:
            self._book.update_bias(owner, m.power_w - model.predict(point).power_w)

    def tick(self) -> Decision | None:
        """A telemetry tick inside a phase: update the thermal guard; re-decide if the cap moved."""
        if not self._started or self._restored:
            return None
        before = self.power_cap()
        self._observe(self.port.sample())
        self._verify()
        self._published.update(self.port.now(), self._phase, self._clocks.current, self.locked)
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

    def _thermal_pressure(self) -> bool:
        return self._guard.pressure(self._meter.max_smooth_w)

    def _maybe_start_tuner(self, phase: Phase) -> None:
        if (
            not self.autotune
            or self.dry_run
            or phase is Phase.IDLE
            or phase in self._models
            or phase in self._tuners
            or phase in self._untunable
            or phase not in self._book.expected
            or self._book.occurrences.get(phase, 0) < _TUNE_AFTER
        ):
            return
        if self._tuners:
            return  # one phase at a time: the others' clocks must be settled while it is measured
        dwelling = self._dwelling(phase)
        if dwelling is not None and not dwelling:
            # Too short to switch anything for: it runs at the clocks the loop's owner sets.
            self._untunable.add(phase)
            return
        # Longest phases first: shorter ones inherit the domains they cannot switch from them.
        waiting = [
            p for p in self._book.expected
            if p is not Phase.IDLE and p not in self._models and p not in self._untunable
        ]
        if max(waiting, key=lambda p: self._book.expected[p]) is not phase:
            return
        expected = self._book.shortest.get(phase, self._book.expected[phase])
        held = self._held_for(phase)
        tune = [
            name
            for name, spec in self.domains.items()
            if name not in self._clocks.locked and (name in held or switchable(spec, expected, self.config.min_phase_factor))
        ]
        if not tune:
            self._untunable.add(phase)
            return
        cfg = self.config
        # Under a dwell the owner sets the clocks the shorter phases run at, as for held domains.
        owns = bool(dwelling) and any(
            self._dwelling(p) is False for p in self._book.expected if p is not phase
        )
        if (held or owns) and cfg.power_budget_w is None and self._loop_owner is None:
            # It sets clocks the rest of the loop runs at: judge them by the whole loop. (Not
            # under a budget: that is a cap on instantaneous power, not on the loop's mean.)
            self._loop_owner = phase
        self._tuner_slow[phase] = frozenset(
            d for d in tune if not switchable(self.domains[d], expected, cfg.min_phase_factor)
        )
        self._tuners[phase] = AxisTuner(
            self.domains,
            tune,
            slowdown=self._slowdown_for(phase),
            power_cap_w=cfg.budget_cap_w,
            levels=cfg.tune_levels,
            passes=cfg.tune_passes,
            repeats=cfg.tune_repeats,
        )

    def _loop_slowdown(self) -> float:
        return loop_slowdown(self.config, self._book.shortest)

    def _slowdown_for(self, phase: Phase) -> float:
        owner = self._loop_owner
        return slowdown_share(
            phase, self._loop_slowdown(), owner=owner,
            owner_model=self._models.get(owner) if owner is not None else None,
            shortest=self._book.shortest, settled=set(self._models) | self._untunable,
        )

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
        acc = self._loop_acc
        if acc is not None:
            # Idle time is not work (the bound is on work time), its energy is the loop's.
            if phase is not Phase.IDLE:
                acc[0] += seconds
            acc[1] += energy
            if self._phase_dirty:
                acc[4] = False
        if seconds <= 0:
            return
        m = Measurement(seconds, energy / seconds)
        point = self._phase_point
        if self._phase_dirty or point is None or phase is self._loop_owner:
            return
        tuner = self._tuners.get(phase)
        if self._phase_tuning and tuner is not None:
            if self._phase_settling:
                return
            if self._phase_tuning_point is not None:
                tuner.record(self._phase_tuning_point, m)
            self._tune_meas += 1
            return
        model = self._models.get(phase)
        if model is not None:
            self._book.update_bias(phase, m.power_w - model.predict(point).power_w)

    # -- decide and apply -----------------------------------------------------------------

    def _decide(self, phase: Phase, tuning_point: OperatingPoint | None) -> Decision:
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
            power_bias_w=max(0.0, self._book.bias.get(phase, 0.0)),
            power_now_w=self._meter.power_w,
            locked=frozenset(self._clocks.locked),
            tuning_point=tuning_point,
            successor_expected_s=self._book.length(self._successor.get(phase)),
            held=self._held_for(phase),
        )
        decision = self._hold_back(decide(inp), tuning_point)
        self._decisions += 1
        if decision.predicted is not None:
            p = decision.predicted.power_w
            self._max_pred = p if self._max_pred is None else max(self._max_pred, p)
        if "cap" in decision.reason:
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
            # Tuning sweeps that include it would never converge: start them again without it.
            for p in [p for p, t in self._tuners.items() if name in t.domains]:
                del self._tuners[p]

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
        return all(p is Phase.IDLE or p in self._models or p in self._untunable for p in self._book.expected)

    def models(self) -> Mapping[Phase, PhaseModel]:
        return MappingProxyType(dict(self._models))

    def profile(self) -> GovernorProfile:
        """What has been learned so far, for :meth:`GovernorProfile.save`."""
        return GovernorProfile(self.board, self.workload, self.config.slowdown, MappingProxyType(dict(self._models)))

    def statistics(self) -> GovernorStatistics:
        phases = {
            p: self._book.statistics(
                p, tuned=p in self._models, tuning=p in self._tuners, untunable=p in self._untunable
            )
            for p in sorted(set(self._book.occurrences) | set(self._models) | set(self._tuners))
        }
        return GovernorStatistics(
            phase=self._phase,
            phase_switches=self._switches,
            decisions=self._decisions,
            writes=self._clocks.writes,
            writes_avoided=self._avoided,
            tuning_measurements=self._tune_meas,
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
        )

