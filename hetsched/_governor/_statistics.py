"""What a governor reports about itself: frozen snapshots of its counters and state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._phase import Phase

__all__ = ["GovernorStatistics", "PhaseStatistics"]


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
    clocks: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """The clocks its latest occurrence ran at (domain -> Hz, as the governor set them)."""


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
    writes_by_domain: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Frequency writes per domain (0 in dry-run)."""
    decisions_logged: int = 0
    """Clock changes decided (each logged on ``hetsched.governor``: at INFO in dry-run)."""
    elapsed_s: float = 0.0
    """Port seconds since the governor started (what writes per second are over)."""
    peak_temp_c: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """The hottest each thermal zone read while governed."""
    tuning_cut_short: tuple[Phase, ...] = ()
    """Phases whose auto-tune the effort bound ended: on the best point measured by then
    (tuned) or, with nothing measured, untunable (:meth:`PhaseTuning.propose
    <hetsched._governor._tuning.PhaseTuning.propose>`)."""
    tuning_held: int = 0
    """Occurrences of a phase being tuned left to the thermal guard (a zone near its trip)."""
    guarded_probes_stopped: int = 0
    """Guarded probes (``GovernorConfig.guarded_probes``) stopped at a reading over the budget."""

    def writes_per_domain_per_s(self) -> dict[str, float]:
        """Writes per domain per second of the run so far (empty before any time passed)."""
        if self.elapsed_s <= 0:
            return {}
        return {d: n / self.elapsed_s for d, n in self.writes_by_domain.items()}
