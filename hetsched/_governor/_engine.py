"""The governor's synchronous core loop: observe, decide (pure), apply through a port.

:class:`GovernorEngine` owns the learned state (phase models, durations, power bias,
thermal fits) and turns phase changes and telemetry ticks into writes through a
:class:`~hetsched._governor._ports.ClockPort`. The decisions themselves are made by
the pure :func:`~hetsched._governor._decide.decide`; this module only gathers its
inputs, applies its outputs, reads back and keeps the books. It is what the public
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
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from .._errors import PowerBudgetError, ProfileError, RuntimeStateError
from .._snapshot import Snapshot
from ._decide import Decision, DecisionInput, GovernorConfig, decide, switchable
from ._model import Measurement, PhaseModel, choose
from ._phase import Phase, as_phase
from ._points import DomainSpec, OperatingPoint
from ._ports import ClockPort
from ._profile import BoardId, GovernorProfile
from ._thermal import RCFit, ZoneWindow, zone_power_cap
from ._tuner import AxisTuner

__all__ = ["GovernorEngine", "GovernorStatistics", "PhaseStatistics"]

log = logging.getLogger("hetsched.governor")

_EWMA_DURATION = 0.3
_EWMA_BIAS = 0.2
_NO_FOLLOW_LIMIT = 2
_REACTIVE_BAND_C = 1.0
_POWER_SMOOTH_S = 1.0
_TUNE_AFTER = 3
"""Occurrences of a phase before its tuning starts: the first run under the kernel's
governors, the next ones at the top clocks (what the phase's length is judged on)."""


@dataclass(frozen=True)
class PhaseStatistics:
    occurrences: int
    total_s: float
    energy_j: float
    expected_s: float | None
    tuned: bool
    tuning: bool
    untunable: bool
    """Too short for any domain's transition latency: nothing to tune."""
    power_bias_w: float


@dataclass(frozen=True)
class GovernorStatistics:
    """Counters and state of a governor (frozen snapshot)."""

    phase: Phase | None
    phase_switches: int
    decisions: int
    writes: int
    """Frequency writes issued (0 in dry-run)."""
    writes_avoided: int
    """Domain changes not made because the phase was too short for the domain's latency."""
    tuning_measurements: int
    tuned_phases: tuple[Phase, ...]
    locked_domains: tuple[str, ...]
    """Domains whose clock did not follow writes (frequency lock): reported and left alone."""
    capped_decisions: int
    """Decisions where the power budget or the thermal guard lowered the clocks."""
    thermal_cap_w: float | None
    power_cap_w: float | None
    thermal_zone: str | None
    """The zone that sets the thermal cap, if any."""
    max_predicted_power_w: float | None
    energy_j: float
    """Energy integrated from telemetry since start."""
    dry_run: bool
    ungoverned: bool
    """True when permission was missing and the run went on without writing (``strict=False``)."""
    restored: bool
    phases: Mapping[Phase, PhaseStatistics]


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
    ) -> None:
        self.port = port
        self.config = config or GovernorConfig()
        self.domains: dict[str, DomainSpec] = dict(port.domains())
        self.board = BoardId.of(port.soc, self.domains)
        self.workload = workload
        self.autotune = autotune
        self.dry_run = dry_run
        self.ungoverned = False
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
        self._expected: dict[Phase, float] = {}
        self._shortest: dict[Phase, float] = {}
        """The fastest each phase has run (at the top clocks, once it ran there): what decides
        which domains a phase is long enough to switch when tuning, so a slow start under the
        kernel governors (or a slow tuning point) does not make a slow domain look switchable."""
        self._successor: dict[Phase, Phase] = {}
        self._bias: dict[Phase, float] = {}
        self._occ: dict[Phase, int] = {}
        self._phase_time: dict[Phase, float] = {}
        self._phase_energy: dict[Phase, float] = {}
        self._current: dict[str, int] = {}
        self._locked: set[str] = set()
        self._no_follow: dict[str, int] = {}
        self._unverified: dict[str, tuple[int, int | None, float]] = {}
        self._saved: Any = None
        self._started = False
        self._restored = False
        # thermal
        self._fits: dict[str, RCFit] = {}
        self._windows: dict[str, ZoneWindow] = {}
        self._limits: dict[str, float] = {}
        self._slopes: dict[str, float] = {}
        self._thermal_cap: float | None = None
        self._thermal_zone: str | None = None
        # energy integration
        self._energy = 0.0
        self._total_rail: str | None = None
        self._last_counter: float | None = None
        self._last_t: float | None = None
        self._last_p: float | None = None
        self._smooth_p: float | None = None
        self._max_power_seen = 0.0
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
        self._writes = 0
        self._avoided = 0
        self._tune_meas = 0
        self._capped = 0
        self._max_pred: float | None = None
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
        for name in self.domains:
            hz = self.port.read(name)
            if hz is not None:
                self._current[name] = hz
        self._started = True
        self._observe(self.port.sample())
        if self.config.power_budget_w is not None:
            # Under a budget nothing is known to be safe yet but the lowest clocks: take
            # every domain from the kernel governors (which may well run at the top) now.
            self._apply({n: s.min_hz for n, s in self.domains.items() if self._current.get(n) != s.min_hz})

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
        if self._saved is not None:
            self.port.restore(self._saved)
            log.info("governor: clocks restored")

    def go_ungoverned(self, reason: str) -> None:
        """Stop writing for the rest of the run (permission missing and ``strict=False``)."""
        self.ungoverned = True
        log.warning("governor: running ungoverned: %s", reason)

    # -- observation ----------------------------------------------------------------

    def _observe(self, snap: Snapshot | None) -> None:
        if snap is None:
            return
        t = self.port.now()
        power = snap.total_power_w
        if power is None:
            vals = [r.power_w for r in snap.rails.values() if r.power_w is not None]
            power = sum(vals) if vals else None
        counter = self._energy_counter(snap, power)
        dt = t - self._last_t if self._last_t is not None else 0.0
        if counter is not None:
            # The board's own energy counter (or the telemetry's integral of the input
            # rail at its own rate) is better than integrating our sparser samples, and
            # its rate is the mean power since the last sample: samples taken at phase
            # boundaries would otherwise see mostly the instants between phases.
            if self._last_counter is not None and counter >= self._last_counter:
                self._energy += counter - self._last_counter
                if dt > 0:
                    power = (counter - self._last_counter) / dt
            self._last_counter = counter
        if power is not None:
            if counter is None and self._last_t is not None and self._last_p is not None and dt > 0:
                self._energy += 0.5 * (power + self._last_p) * dt
            if self._smooth_p is None or self._last_t is None:
                self._smooth_p = power
            else:
                a = min(1.0, max(0.0, dt) / _POWER_SMOOTH_S)
                self._smooth_p += a * (power - self._smooth_p)
            self._last_t, self._last_p = t, power
            self._max_power_seen = max(self._max_power_seen, self._smooth_p)
        for name, zone in snap.zones.items():
            if zone.passive_trip_c is None or zone.temp_c is None:
                continue
            self._limits[name] = zone.passive_trip_c - self.config.thermal_margin_c
            if power is None:
                continue
            if name not in self._fits:
                self._fits[name] = RCFit.from_prior()
            self._fits[name] = self._fits[name].with_ambient_ceiling(zone.temp_c)
            win = self._windows.get(name, ZoneWindow()).add(t, zone.temp_c, power, dt)
            if win.span_s >= self.config.thermal_window_s:
                summary = win.summary()
                if summary is not None:
                    self._fits[name] = self._fits[name].update(*summary)
                    self._slopes[name] = summary[0]
                win = ZoneWindow()
            self._windows[name] = win
        self._update_thermal_cap(snap, power)

    def _energy_counter(self, snap: Snapshot, power: float | None) -> float | None:
        """Cumulative energy of the board-input rail, if the snapshot carries one."""
        if self._total_rail is None:
            rails = [r for r in snap.rails.values() if r.energy_j is not None and r.power_w is not None]
            if not rails:
                return None
            top = max(rails, key=lambda r: r.power_w or 0.0)
            # The input rail carries every other rail: it is the largest, and near the total.
            if power is not None and (top.power_w or 0.0) < 0.8 * power:
                return None
            self._total_rail = top.name
        rail = snap.rails.get(self._total_rail)
        return None if rail is None else rail.energy_j

    def _update_thermal_cap(self, snap: Snapshot, power: float | None) -> None:
        temps = {n: z.temp_c for n, z in snap.zones.items() if z.temp_c is not None}
        horizon = max(self.config.thermal_horizon_s, self._expected.get(self._phase, 0.0) if self._phase else 0.0)
        cap, zone = zone_power_cap(
            self._fits, temps, self._limits, horizon_s=horizon, power_now_w=self._smooth_p,
            reactive_band_c=_REACTIVE_BAND_C, slopes=self._slopes,
        )
        old = self._thermal_cap
        if cap is None or cap >= 1e6:
            # Far from every trip: release the cap only with hysteresis (see below).
            cap = math.inf
        if old is None:
            self._thermal_cap = None if math.isinf(cap) else cap
        elif cap < old:
            self._thermal_cap = cap
        elif cap > old * (1.0 + self.config.cap_hysteresis):
            self._thermal_cap = None if math.isinf(cap) else cap
        self._thermal_zone = zone if self._thermal_cap is not None else None

    def power_cap(self) -> float | None:
        """The tighter of the budget cap and the thermal guard's (mean-power) cap, now."""
        caps = [c for c in (self.config.budget_cap_w, self._thermal_cap) if c is not None]
        return min(caps) if caps else None

    def _unconstrained_power(self, phase: Phase) -> float | None:
        model = self._models.get(phase)
        if model is not None and model.best is not None:
            return model.predict(model.best).power_w + max(0.0, self._bias.get(phase, 0.0))
        t = self._phase_time.get(phase, 0.0)
        return self._phase_energy.get(phase, 0.0) / t if t > 0 else None

    def phase_cap(self, phase: Phase) -> float | None:
        """The cap for ``phase``'s decision.

        The budget is a hard cap on every phase. The thermal cap is on *mean* power (a
        zone's time constant is seconds to minutes, phases are milliseconds), so it is
        shared out in proportion to what each phase draws unconstrained: the hungry
        phases give up the most watts instead of every phase being cut to the same level.
        """
        thermal = self._thermal_cap
        if thermal is not None:
            mine = self._unconstrained_power(phase)
            weights = [
                (pw, self._expected[p])
                for p in self._expected
                if (pw := self._unconstrained_power(p)) is not None and self._expected[p] > 0
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
        self._phase_e0 = self._energy
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
        self._phase_point = OperatingPoint.of(dict(self._current))
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
            err = m.power_w - model.predict(point).power_w
            b = self._bias.get(owner)
            self._bias[owner] = err if b is None else b + _EWMA_BIAS * (err - b)

    def tick(self) -> Decision | None:
        """A telemetry tick inside a phase: update the thermal guard; re-decide if the cap moved."""
        if not self._started or self._restored:
            return None
        before = self.power_cap()
        self._observe(self.port.sample())
        self._verify()
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
        return self._thermal_cap is not None and self._thermal_cap < self._max_power_seen

    def _maybe_start_tuner(self, phase: Phase) -> None:
        if (
            not self.autotune
            or self.dry_run
            or phase is Phase.IDLE
            or phase in self._models
            or phase in self._tuners
            or phase in self._untunable
            or phase not in self._expected
            or self._occ.get(phase, 0) < _TUNE_AFTER
        ):
            return
        if self._tuners:
            return  # one phase at a time: the others' clocks must be settled while it is measured
        # Longest phases first: shorter ones inherit the domains they cannot switch from them.
        waiting = [
            p for p in self._expected
            if p is not Phase.IDLE and p not in self._models and p not in self._untunable
        ]
        if max(waiting, key=lambda p: self._expected[p]) is not phase:
            return
        expected = self._shortest.get(phase, self._expected[phase])
        held = self._held_for(phase)
        tune = [
            name
            for name, spec in self.domains.items()
            if name not in self._locked and (name in held or switchable(spec, expected, self.config.min_phase_factor))
        ]
        if not tune:
            self._untunable.add(phase)
            return
        cfg = self.config
        if held and cfg.power_budget_w is None and self._loop_owner is None:
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
        """The slowdown the loop as a whole may take: ``config.slowdown``, or with
        ``config.loop_deadline_s`` what the deadline leaves over the loop's working phases
        at the top clocks (each phase's fastest run), whichever is more."""
        cfg = self.config
        if cfg.loop_deadline_s is None:
            return cfg.slowdown
        loop_s = sum(t for p, t in self._shortest.items() if p is not Phase.IDLE)
        if loop_s <= 0:
            return cfg.slowdown
        return max(cfg.slowdown, cfg.loop_deadline_s / loop_s - 1.0)

    def _slowdown_for(self, phase: Phase) -> float:
        """The slowdown bound ``phase`` is tuned to.

        The loop owner's tuning measured the other working phases of the loop as they ran
        then (untuned, at their top clocks) and spent the loop's bound on its own clocks;
        phases tuned after it share what it left of the loop's bound, in proportion to their
        length, so the loop as a whole stays within :meth:`_loop_slowdown` (``config.slowdown``,
        or the loop deadline). Without a loop owner every phase gets the loop's bound.
        """
        base = self._loop_slowdown()
        owner = self._loop_owner
        model = self._models.get(owner) if owner is not None else None
        if (
            owner is None or phase is owner or model is None or model.unit != "loop"
            or model.best_measured is None or model.reference_s is None
        ):
            return base
        spare_s = model.reference_s * (1.0 + base) - model.best_measured.seconds
        waiting = [
            p for p in self._shortest
            if p not in (Phase.IDLE, owner) and p not in self._models and p not in self._untunable
        ]
        span = sum(self._shortest[p] for p in waiting)
        if span <= 0 or spare_s <= 0:
            return 0.0
        return min(base, spare_s / span)

    def _length(self, phase: Phase | None) -> float | None:
        """The length switching decisions assume for ``phase`` (see :attr:`_shortest`)."""
        if phase is None:
            return None
        return self._shortest.get(phase, self._expected.get(phase))

    def _held_for(self, phase: Phase) -> frozenset[str]:
        """The slow domains ``phase`` sets for the whole loop (see :attr:`DecisionInput.held`).

        Those are the unlocked domains no working phase seen so far lasts long enough to
        switch; the longest working phase owns them (it weighs most in the loop's time and
        energy, and is tuned first). Empty for every other phase and for IDLE.
        """
        working = {p: t for p, t in self._shortest.items() if p is not Phase.IDLE}
        if phase is Phase.IDLE or phase not in working or max(working, key=lambda p: working[p]) is not phase:
            return frozenset()
        factor = self.config.min_phase_factor
        return frozenset(
            name
            for name, spec in self.domains.items()
            if name not in self._locked and not any(switchable(spec, t, factor) for t in working.values())
        )

    def _finish_phase(self, now: float) -> None:
        phase = self._phase
        assert phase is not None
        seconds = now - self._phase_t0
        energy = self._energy - self._phase_e0
        self._occ[phase] = self._occ.get(phase, 0) + 1
        self._phase_time[phase] = self._phase_time.get(phase, 0.0) + seconds
        self._phase_energy[phase] = self._phase_energy.get(phase, 0.0) + energy
        prev = self._expected.get(phase)
        self._expected[phase] = seconds if prev is None else prev + _EWMA_DURATION * (seconds - prev)
        if seconds > 0:
            self._shortest[phase] = min(seconds, self._shortest.get(phase, math.inf))
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
            pred = model.predict(point)
            err = m.power_w - pred.power_w
            b = self._bias.get(phase)
            self._bias[phase] = err if b is None else b + _EWMA_BIAS * (err - b)

    # -- decide and apply -----------------------------------------------------------------

    def _decide(self, phase: Phase, tuning_point: OperatingPoint | None) -> Decision:
        inp = DecisionInput(
            phase=phase,
            domains=MappingProxyType(self.domains),
            current=MappingProxyType(dict(self._current)),
            config=self.config,
            model=self._models.get(phase),
            # Switching is judged on how short the phase can be (its run at the top clocks),
            # not on a running mean that a slow point inflates: a domain switched only while
            # the phase runs slowly would flip in and out of the phase's control.
            expected_phase_s=self._length(phase),
            power_cap_w=self.phase_cap(phase),
            power_bias_w=max(0.0, self._bias.get(phase, 0.0)),
            power_now_w=self._last_p,
            locked=frozenset(self._locked),
            tuning_point=tuning_point,
            successor_expected_s=self._length(self._successor.get(phase)),
            held=self._held_for(phase),
        )
        decision = decide(inp)
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
                                 and d not in decision.writes and d not in self._locked)
        self.history.append(decision)
        self._last_decision = decision
        if decision.writes:
            log.debug("governor: %s -> %s (%s)", phase, dict(decision.writes), decision.reason)
        self._apply(decision.writes)
        return decision

    def _apply(self, writes: Mapping[str, int]) -> None:
        if not writes:
            return
        if self.dry_run or self.ungoverned:
            # Pretend the clocks moved, so the log shows what a real run would do next.
            self._current.update(writes)
            return
        for name, hz in writes.items():
            before = self._current.get(name)
            self.domains[name].check(hz)
            self.port.write(name, hz)
            self._writes += 1
            achieved = self.port.read(name)
            self._current[name] = hz
            if achieved is None:
                self._unverified.pop(name, None)
            elif achieved == hz:
                # Followed at once when it was a real change; asking for the value it already
                # shows says nothing either way (an earlier unfollowed write is superseded).
                if before is not None and before != hz:
                    self._no_follow[name] = 0
                self._unverified.pop(name, None)
            else:
                # Not there yet: judge it once the grace period has passed (a live twin or a
                # slow driver applies it later; blocking here would stall the caller). A newer
                # target supersedes an older one and restarts the wait.
                self._unverified[name] = (hz, achieved, self.port.now())

    def _verify(self) -> None:
        """Domains written earlier that had not followed: did they, by now?"""
        now = self.port.now()
        for name, (hz, before, since) in list(self._unverified.items()):
            grace = max(self.config.lock_grace_s, 20.0 * self.domains[name].transition_latency_s)
            achieved = self.port.read(name)
            if achieved is not None and achieved != hz and achieved == before and now - since < grace:
                continue  # not applied yet: give the driver its time
            del self._unverified[name]
            if achieved is None or achieved == hz:
                self._no_follow[name] = 0
                continue
            self._current[name] = achieved
            if achieved == before:
                self._no_follow[name] = self._no_follow.get(name, 0) + 1
                if self._no_follow[name] >= _NO_FOLLOW_LIMIT and name not in self._locked:
                    self._locked.add(name)
                    # Tuning sweeps that include it would never converge: start them again without it.
                    for p in [p for p, t in self._tuners.items() if name in t.domains]:
                        del self._tuners[p]
                    log.warning(
                        "governor: frequency lock on %s: wrote %d Hz, it stays at %d Hz "
                        "(another agent such as nvpmodel owns it); leaving it alone",
                        name, hz, achieved,
                    )

    # -- results ----------------------------------------------------------------------

    @property
    def phase(self) -> Phase | None:
        return self._phase

    @property
    def current(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._current))

    @property
    def locked(self) -> frozenset[str]:
        return frozenset(self._locked)

    @property
    def tuning_done(self) -> bool:
        """Every phase seen (except IDLE) is tuned or too short to tune."""
        return all(p is Phase.IDLE or p in self._models or p in self._untunable for p in self._expected)

    def models(self) -> Mapping[Phase, PhaseModel]:
        return MappingProxyType(dict(self._models))

    def profile(self) -> GovernorProfile:
        """What has been learned so far, for :meth:`GovernorProfile.save`."""
        return GovernorProfile(self.board, self.workload, self.config.slowdown, MappingProxyType(dict(self._models)))

    def statistics(self) -> GovernorStatistics:
        phases = {
            p: PhaseStatistics(
                occurrences=self._occ.get(p, 0),
                total_s=self._phase_time.get(p, 0.0),
                energy_j=self._phase_energy.get(p, 0.0),
                expected_s=self._expected.get(p),
                tuned=p in self._models,
                tuning=p in self._tuners,
                untunable=p in self._untunable,
                power_bias_w=self._bias.get(p, 0.0),
            )
            for p in sorted(set(self._occ) | set(self._models) | set(self._tuners))
        }
        return GovernorStatistics(
            phase=self._phase,
            phase_switches=self._switches,
            decisions=self._decisions,
            writes=self._writes,
            writes_avoided=self._avoided,
            tuning_measurements=self._tune_meas,
            tuned_phases=tuple(sorted(self._models)),
            locked_domains=tuple(sorted(self._locked)),
            capped_decisions=self._capped,
            thermal_cap_w=self._thermal_cap,
            power_cap_w=self.power_cap(),
            thermal_zone=self._thermal_zone,
            max_predicted_power_w=self._max_pred,
            energy_j=self._energy,
            dry_run=self.dry_run,
            ungoverned=self.ungoverned,
            restored=self._restored,
            phases=MappingProxyType(phases),
        )

