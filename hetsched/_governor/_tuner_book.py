"""The auto-tuner's measurement book: every sample it took, in order, drift-corrected.

The board warms while it is tuned (leakage, hence power, grows with temperature), so a
sweep measured in order would make the points measured later look dearer. The tuner
measures its centre again after each axis; the drift that shows, chained across passes,
is removed from every measurement (:meth:`SampleBook.corrected`) before points are
compared. The comparison itself (:func:`best_measured`) is a pure function of the
corrected measurements.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ._model import TIME_TIE, Measurement, Objective
from ._points import DomainSpec, OperatingPoint

__all__ = ["SampleBook", "best_measured", "least_energy"]

class SampleBook:
    """Every sample an :class:`~hetsched._governor._tuner.AxisTuner` recorded, with when it ran."""

    def __init__(self) -> None:
        self.samples: dict[OperatingPoint, list[Measurement]] = {}
        self.seq_of: dict[OperatingPoint, list[int]] = {}
        """When (in measurement order) each sample of each point was taken."""
        self.count = 0
        """Samples recorded so far (the next one's sequence number)."""
        self.pass_log: list[tuple[int, OperatingPoint]] = []
        """(first measurement, centre) of every pass so far."""

    def begin_pass(self, center: OperatingPoint) -> None:
        """A pass starts at ``center``: its drift segment begins with the next sample."""
        self.pass_log.append((self.count, center))

    def add(self, point: OperatingPoint, measurement: Measurement) -> None:
        """One sample at ``point``, taken now."""
        self.seq_of.setdefault(point, []).append(self.count)
        self.count += 1
        self.samples.setdefault(point, []).append(measurement)

    def drift(self, seq: float) -> tuple[float, float]:
        """How far the board has drifted (seconds, watts of a unit) by measurement ``seq``.

        Each pass's centre, measured again after every axis, gives the drift within the
        pass; passes are chained at their boundaries, the last pass's drift extrapolated at
        its final slope to the next pass's first centre sample (the board keeps warming
        while the new centre is set up).
        """
        off_t = off_p = 0.0
        segments = []
        for k, (start, centre) in enumerate(self.pass_log):
            end = self.pass_log[k + 1][0] if k + 1 < len(self.pass_log) else self.count
            log = [(q, m) for q, m in zip(self.seq_of.get(centre, ()), self.samples.get(centre, ()), strict=True)
                   if start <= q < end]
            if log:
                segments.append(log)
        for k, log in enumerate(segments):
            base = log[0][1]

            def rel(q: float, log: list[tuple[int, Measurement]] = log, base: Measurement = base) -> tuple[float, float]:
                if q <= log[0][0]:
                    m = log[0][1]
                elif q >= log[-1][0]:
                    m = log[-1][1]
                else:
                    m = log[-1][1]
                    for (q0, m0), (q1, m1) in itertools.pairwise(log):
                        if q0 <= q <= q1:
                            w = (q - q0) / (q1 - q0) if q1 > q0 else 0.0
                            m = Measurement(m0.seconds + w * (m1.seconds - m0.seconds), m0.power_w + w * (m1.power_w - m0.power_w))
                            break
                return m.seconds - base.seconds, m.power_w - base.power_w

            nxt = segments[k + 1][0][0] if k + 1 < len(segments) else None
            if nxt is None or seq < nxt:
                dt, dp = rel(seq)
                return off_t + dt, off_p + dp
            dt, dp = rel(log[-1][0])
            if len(log) >= 2:
                (q0, m0), (q1, m1) = log[-2], log[-1]
                gap = (nxt - q1) / max(q1 - q0, 1)
                dt += gap * (m1.seconds - m0.seconds)
                dp += gap * (m1.power_w - m0.power_w)
            off_t, off_p = off_t + dt, off_p + dp
        return off_t, off_p

    def corrected(self, point: OperatingPoint) -> Measurement | None:
        """``point``'s samples, each moved by the drift between when it ran and now (None: none)."""
        pairs = list(zip(self.seq_of.get(point, ()), self.samples.get(point, ()), strict=True))
        if not pairs:
            return None
        # Power only: warming changes leakage, not how long the work takes (a time that
        # changes is the clocks', or a phase boundary's, and correcting it would move every
        # point by what one centre run happened to show).
        _, now_p = self.drift(self.count - 1)
        dt = dp = 0.0
        for q, m in pairs:
            dt += m.seconds
            dp += m.power_w - self.drift(q)[1]
        n = len(pairs)
        return Measurement(max(dt / n, 1e-12), max(dp / n + now_p, 0.0))

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        """Every point measured so far, drift-corrected to now."""
        out = []
        for p in self.samples:
            m = self.corrected(p)
            if m is not None:
                out.append((p, m))
        return out


def best_measured(
    measured: list[tuple[OperatingPoint, Measurement]],
    *,
    ref: float,
    slowdown: float,
    cap: float | None,
    objective: Objective,
    specs: Mapping[str, DomainSpec],
    tie: float = TIME_TIE,
    energy_tie: float = 0.001,
) -> tuple[OperatingPoint | None, Measurement | None]:
    """The best of ``measured`` under the cap (None, None: none fits it).

    ``"time"``: the fastest, the least energy among those within ``tie`` of it (energies
    within ``energy_tie`` go to the lower clocks, :func:`least_energy`).
    ``"energy"``: the least energy within the slowdown bound against ``ref``; if none is
    within it, the fastest.
    """
    bound = ref * (1 + slowdown)
    in_cap = [(p, m) for p, m in measured if cap is None or m.power_w <= cap]
    if not in_cap:
        return None, None
    if objective == "time":
        fastest = min(m.seconds for _, m in in_cap)
        near = [(p, m) for p, m in in_cap if m.seconds <= fastest * (1 + tie)]
        return least_energy(near, specs, energy_tie)
    ok = [(p, m) for p, m in in_cap if m.seconds <= bound]
    if ok:
        return least_energy(ok, specs, energy_tie)
    return min(in_cap, key=lambda pm: pm[1].seconds)


def least_energy(
    pts: list[tuple[OperatingPoint, Measurement]], specs: Mapping[str, DomainSpec], energy_tie: float = 0.001
) -> tuple[OperatingPoint, Measurement]:
    """The least energy; energies within ``energy_tie`` of it (:attr:`TunerConfig.energy_tie
    <._tuner_config.TunerConfig.energy_tie>`, run-to-run noise) go to the lower clocks, so a
    clock that buys nothing (an idle GPU's in a CPU phase) is not left high."""
    e_min = min(m.energy_j for _, m in pts)
    near = [(p, m) for p, m in pts if m.energy_j <= e_min * (1 + energy_tie)]

    def height(pm: tuple[OperatingPoint, Measurement]) -> float:
        return sum(specs[d].index(hz) / max(len(specs[d].available_hz) - 1, 1)
                   for d, hz in pm[0].items() if d in specs)

    return min(near, key=lambda pm: (height(pm), pm[1].energy_j))
