"""A board whose phases' time and power come from a table or a function: the tuner's test bench.

:class:`TableBoard` answers "what does one unit of this phase cost at this operating
point" (a :class:`~hetsched._governor._model.Measurement`) from a function the test
chooses, so a tuner can be scored against the board's exhaustive optimum, which the tuner
never sees. :func:`coupled_phase` builds such functions with the structure of real phases
(domains working concurrently or serially, dynamic energy spread over the phase's time,
static power and leakage by clock); :meth:`TableBoard.exhaustive` is the ground truth.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hetsched._errors import GovernorError
from hetsched._governor._model import Measurement
from hetsched._governor._points import DomainSpec, OperatingPoint
from hetsched._governor._tuner_seam import Tuner

__all__ = ["Optimum", "PhaseFunction", "TableBoard", "coupled_phase", "loop_measure", "tune_on"]

PhaseFunction = Callable[[Mapping[str, int]], tuple[float, float]]
"""Clocks (domain -> Hz) -> (seconds, watts) of one unit of work."""


def coupled_phase(
    work_s: Mapping[str, float],
    dyn_w: Mapping[str, float],
    *,
    ref_hz: Mapping[str, int],
    overlap: float = 1.0,
    fixed_s: float = 0.0,
    static_w: float = 1.0,
    leak_w: Mapping[str, float] | None = None,
    stall_share: float = 0.0,
    exponent: float = 2.0,
) -> PhaseFunction:
    """A phase whose domains are coupled the way a SoC's are.

    Domain ``d`` is busy ``work_s[d] * ref_hz[d] / f_d`` seconds; the phase takes
    ``fixed_s + overlap * max(busy) + (1 - overlap) * sum(busy)``. Its dynamic energy is
    ``dyn_w[d] * busy_d * (f_d / ref_hz[d]) ** exponent`` (voltage rising with the clock),
    so a domain that waits on another draws it over a longer phase: its power falls when
    the *other* domain's clock is lowered. While it waits it draws ``stall_share`` of its
    busy power. Static power: ``static_w`` plus ``leak_w[d] * (f_d / ref_hz[d])``.

    :raises GovernorError: a domain in ``work_s`` without ``ref_hz``/``dyn_w``, or an
        ``overlap`` or ``stall_share`` outside [0, 1].
    """
    if not 0.0 <= overlap <= 1.0 or not 0.0 <= stall_share <= 1.0:
        raise GovernorError(f"coupled_phase: overlap={overlap!r} and stall_share={stall_share!r} must be in [0, 1]")
    missing = [d for d in work_s if d not in ref_hz or d not in dyn_w]
    if missing:
        raise GovernorError(f"coupled_phase: no ref_hz/dyn_w for {missing}")
    leak = dict(leak_w or {})

    def phase(f: Mapping[str, int]) -> tuple[float, float]:
        busy = {d: w * ref_hz[d] / f[d] for d, w in work_s.items()}
        t = fixed_s + overlap * max(busy.values(), default=0.0) + (1 - overlap) * sum(busy.values())
        energy = static_w * t
        for d, b in busy.items():
            scale = (f[d] / ref_hz[d]) ** exponent
            energy += dyn_w[d] * scale * (b + stall_share * max(t - b, 0.0))
        for d, k in leak.items():
            if d in f and d in ref_hz:
                energy += k * (f[d] / ref_hz[d]) * t
        return t, energy / t

    return phase


@dataclass(frozen=True)
class Optimum:
    """The exhaustive answer for one phase."""

    point: OperatingPoint
    measurement: Measurement
    reference: Measurement
    """The top clocks (every domain at its maximum): the slowdown reference."""


class TableBoard:
    """Phases given as functions of the clocks (see the module docstring).

    :raises GovernorError: no domains, or a phase with no function.
    """

    def __init__(self, domains: Mapping[str, DomainSpec], phases: Mapping[str, PhaseFunction]) -> None:
        if not domains:
            raise GovernorError("TableBoard needs at least one domain")
        if not phases:
            raise GovernorError("TableBoard needs at least one phase")
        self.specs = dict(domains)
        self.phases = dict(phases)
        self.runs = 0
        """Units of work measured so far (what tuning cost)."""

    def domains(self) -> Mapping[str, DomainSpec]:
        return self.specs

    def top(self) -> OperatingPoint:
        return OperatingPoint.of({d: s.max_hz for d, s in self.specs.items()})

    def measure(self, phase: str, point: OperatingPoint) -> Measurement:
        """One unit of ``phase`` at ``point`` (domains it lacks at their top clock).

        :raises GovernorError: an unknown phase.
        """
        fn = self.phases.get(phase)
        if fn is None:
            raise GovernorError(f"TableBoard: unknown phase {phase!r}; phases: {sorted(self.phases)}")
        clocks = {**self.top().as_dict(), **point.as_dict()}
        self.runs += 1
        t, p = fn(clocks)
        return Measurement(t, p)

    def exhaustive(
        self, phase: str, *, slowdown: float | None = None, power_cap_w: float | None = None
    ) -> Optimum:
        """The exhaustive best point of ``phase`` (every combination, not counted in ``runs``).

        With ``slowdown``: the least energy within ``(1 + slowdown)`` of the top clocks'
        time (and under ``power_cap_w`` if given); without it, the fastest under
        ``power_cap_w`` (ties: the least energy).

        :raises GovernorError: nothing meets the bounds.
        """
        fn = self.phases[phase]
        ref_t, ref_p = fn(self.top().as_dict())
        best: tuple[tuple[float, float], OperatingPoint, Measurement] | None = None
        names = list(self.specs)
        for combo in itertools.product(*[self.specs[d].available_hz for d in names]):
            f = dict(zip(names, combo, strict=True))
            t, p = fn(f)
            if power_cap_w is not None and p > power_cap_w:
                continue
            if slowdown is not None and t > ref_t * (1 + slowdown) * (1 + 1e-12):
                continue
            key = (t * p, t) if slowdown is not None else (t, t * p)
            if best is None or key < best[0]:
                best = (key, OperatingPoint.of(f), Measurement(t, p))
        if best is None:
            raise GovernorError(f"TableBoard: no point of {phase!r} meets slowdown={slowdown} cap={power_cap_w}")
        return Optimum(best[1], best[2], Measurement(ref_t, ref_p))


def tune_on(board: TableBoard, phase: str, tuner: Tuner, *, limit: int = 2000) -> int:
    """Drive ``tuner`` (a :class:`~hetsched.lowlevel.Tuner`, e.g. an ``AxisTuner``) on ``phase`` until
    done; returns the runs.

    :raises GovernorError: the tuner has not finished after ``limit`` runs.
    """
    n = 0
    while (pt := tuner.propose()) is not None:
        tuner.record(pt, board.measure(phase, pt))
        n += 1
        if n >= limit:
            raise GovernorError(f"tuner not done after {limit} runs of {phase!r}")
    return n


def loop_measure(board: TableBoard, schedule: Mapping[str, OperatingPoint], phases: Sequence[str]) -> Measurement:
    """One loop (each of ``phases`` once) at ``schedule``'s per-phase points, not counted in ``runs``."""
    t = e = 0.0
    for ph in phases:
        clocks = {**board.top().as_dict(), **schedule[ph].as_dict()}
        pt, pp = board.phases[ph](clocks)
        t += pt
        e += pt * pp
    return Measurement(t, e / t)
