"""Built-in placement policies: PowerThermalWeighted, HEFT, Pinned, RandomPolicy."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping

from hetsched._errors import PlacementError

from ._consolidate import consolidate, makespan
from ._problem import Placement, PlacementProblem, Unit

__all__ = ["HEFT", "W_ENERGY_S_PER_J", "Pinned", "PowerThermalWeighted", "RandomPolicy"]

W_ENERGY_S_PER_J = 0.01
"""Default weight of the energy term, in seconds per joule: a unit may finish this much later
on a device for each joule it saves there. Any positive weight breaks a tie between equally
fast devices toward the one that spends less. A device ``k`` times faster than another keeps
the unit unless it draws more than ``(k - 1) / w_energy`` watts above ``k`` times the slower
one's power (50 W at ``k = 1.5`` with this default: beyond what an edge SoC's devices differ
by), so the default does not trade a clear speed win for energy; raise it to do so."""


def _check_weight(w: float) -> float:
    """:raises PlacementError: ``w`` is not a number in [0, 1]."""
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
        raise PlacementError(f"lower_priority_weight must be a number in [0, 1], got {w!r}")
    return float(w)


def _joint(problem: PlacementProblem, lower_priority_weight: float,
           place: Callable[[PlacementProblem], Placement]) -> Placement:
    """Place ``problem`` jointly with the sessions already on the board, and for its SLO.

    The other sessions' reservations are priced into the costs (:meth:`PlacementProblem.contended`:
    a device they keep busy ahead of this model stretches its units by ``1 / (1 - share)``), so a
    second model goes where the first leaves room. With ``problem.slo_s`` set and the placement's
    estimated latency (:func:`makespan` on the priced costs) above it, the model is placed again
    on latency alone (HEFT without an energy term: its deadline comes before energy and
    headroom), and that placement is kept when it is faster. Every unit's terms gain
    ``contention`` (the factor its device's cost was stretched by).
    """
    priced = problem.contended(lower_priority_weight=lower_priority_weight)
    placement = place(priced)
    if problem.slo_s is not None:
        est = makespan(priced, placement.assignment)
        if est > problem.slo_s:
            fast = HEFT(w_energy=0.0)._place(priced)
            if makespan(priced, fast.assignment) < est:
                placement = Placement(fast.assignment, f"{placement.policy}+slo", fast.scores)
    if problem.reservations:
        factor = problem.contention_factors(lower_priority_weight=lower_priority_weight)
        scores = {u: {d: {**t, "contention": factor.get(d, 1.0)} for d, t in by_dev.items()}
                  for u, by_dev in placement.scores.items()}
        placement = Placement(placement.assignment, placement.policy, scores)
    return placement


def _clamp01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def _check_w_energy(w_energy: float) -> float:
    """:raises PlacementError: ``w_energy`` is not a finite number >= 0."""
    if isinstance(w_energy, bool) or not isinstance(w_energy, (int, float)) or not (
        math.isfinite(w_energy) and w_energy >= 0
    ):
        raise PlacementError(f"w_energy must be a finite number of seconds per joule >= 0, got {w_energy!r}")
    return float(w_energy)


class PowerThermalWeighted:
    """Score devices by headroom and divide expected latency by the score.

    ``score = w_util*(1-util) + w_temp*temp_headroom + w_power*power_headroom``
    (defaults 0.4 / 0.3 / 0.3, from seeds-digest.md §B). Units are taken in
    topological order; each goes to the device minimising its *effective finish time*::

        ready = max(device free, inputs arrived (incl. transfers))
        effective = ready + latency / max(score, min_score) ** sharpness
                    + w_energy * (energy_j - least energy_j among the unit's candidates)

    so a fast cool device beats a slow cool one, a hot or busy device is used only
    when it is much faster, and among equally fast devices the one spending less energy
    wins (``PlacementProblem.energy``; a device whose energy is unknown gets no energy
    term). Every candidate's terms are kept in ``Placement.scores`` (``energy_j`` where
    known, ``energy_s`` = the weighted excess).
    """

    def __init__(self, w_util: float = 0.4, w_temp: float = 0.3, w_power: float = 0.3, *,
                 w_energy: float = W_ENERGY_S_PER_J, min_score: float = 0.05, sharpness: float = 1.0,
                 consolidate: bool = True, lower_priority_weight: float = 0.0):
        """:param w_energy: seconds of finish time one joule is worth (:data:`W_ENERGY_S_PER_J`);
            0 ignores energy.
        :param consolidate: after placing, fold islands of units into the device around them
            where the schedule estimate improves (:func:`hetsched.policies.consolidate`).
        :param lower_priority_weight: how much of a less urgent session's reservation counts
            against a device (:meth:`PlacementProblem.reserved_share`; 0: a priority scheduler
            serves this model first).
        :raises PlacementError: a negative weight, all headroom weights zero, a bad ``w_energy``
            or ``lower_priority_weight``.
        """
        self.lower_priority_weight = _check_weight(lower_priority_weight)
        if min(w_util, w_temp, w_power) < 0 or w_util + w_temp + w_power <= 0:
            raise PlacementError("PowerThermalWeighted weights w_util/w_temp/w_power must be non-negative "
                                 f"and not all zero, got {w_util!r}/{w_temp!r}/{w_power!r}")
        self.w_energy = _check_w_energy(w_energy)
        total = w_util + w_temp + w_power
        self.w_util, self.w_temp, self.w_power = w_util / total, w_temp / total, w_power / total
        self.min_score = min_score
        self.sharpness = sharpness
        self.consolidate = consolidate

    def score(self, util: float, temp_headroom: float, power_headroom: float) -> float:
        return (self.w_util * (1.0 - _clamp01(util)) + self.w_temp * _clamp01(temp_headroom)
                + self.w_power * _clamp01(power_headroom))

    def place(self, problem: PlacementProblem) -> Placement:
        """Place jointly with the reservations and for the SLO (see :func:`_joint`)."""
        return _joint(problem, self.lower_priority_weight, self._place)

    def _place(self, problem: PlacementProblem) -> Placement:
        scores_by_dev = {
            name: self.score(st.utilisation, st.temp_headroom, st.power_headroom)
            for name, st in problem.devices.items()
        }
        free_at: dict[str, float] = {d: 0.0 for d in problem.devices}
        finish: dict[int, float] = {}
        assignment: dict[int, str] = {}
        terms: dict[int, dict[str, dict[str, float]]] = {}
        cost = problem.cost
        for unit in problem.units:
            best_dev, best_eft, best_finish = "", float("inf"), 0.0
            unit_terms: dict[str, dict[str, float]] = {}
            excess = problem.energy_excess_j(unit) if problem.energy else {}
            for dev in unit.candidates:
                st = problem.devices[dev]
                s = max(scores_by_dev[dev], self.min_score)
                lat = cost[(unit.id, dev)]
                arrive = 0.0
                for p in unit.preds:
                    t = finish[p] + problem.transfer_seconds(p, unit.id, assignment[p], dev)
                    if t > arrive:
                        arrive = t
                start = max(free_at[dev], arrive)
                energy_s = self.w_energy * excess.get(dev, 0.0)
                eff = start + lat / (s ** self.sharpness) + energy_s
                unit_terms[dev] = {
                    "latency_s": lat, "start_s": start, "util": st.utilisation,
                    "temp_headroom": st.temp_headroom, "power_headroom": st.power_headroom,
                    "score": s, "energy_s": energy_s, "effective_s": eff,
                }
                if dev in excess:
                    unit_terms[dev]["energy_j"] = problem.energy[(unit.id, dev)]
                if eff < best_eft:
                    best_dev, best_eft, best_finish = dev, eff, start + lat
            assignment[unit.id] = best_dev
            finish[unit.id] = best_finish
            free_at[best_dev] = best_finish
            terms[unit.id] = unit_terms
        placement = Placement(assignment, "power-thermal", terms)
        return consolidate(problem, placement) if self.consolidate else placement


class HEFT:
    """Heterogeneous Earliest Finish Time (Topcuoglu et al. 2002), plus an energy term.

    Rank units by upward rank (average cost + max over successors of average transfer +
    their rank), then assign in decreasing rank to the device with the earliest finish
    time, inserting into idle gaps of a device's timeline. The device is chosen by
    ``eft + w_energy * (energy_j - least energy_j among the unit's candidates)``, so among
    devices finishing together the one spending less energy wins (unknown energy: no
    term); the schedule itself keeps the true finish times.
    """

    def __init__(self, insertion: bool = True, *, gap_window: int | None = 64, consolidate: bool = True,
                 w_energy: float = W_ENERGY_S_PER_J, lower_priority_weight: float = 0.0):
        """:param insertion: insert into idle gaps of a device's timeline (classic HEFT).
        :param gap_window: examine at most this many gaps after a unit's ready time (None =
            all). Exact insertion HEFT is quadratic on long graphs, where timelines fill with
            tiny gaps that can never hold a unit; the window keeps planning linear.
        :param consolidate: after placing, fold islands of units into the device around them
            where the schedule estimate improves (:func:`hetsched.policies.consolidate`).
        :param w_energy: seconds of finish time one joule is worth (:data:`W_ENERGY_S_PER_J`);
            0 gives classic latency-only HEFT.
        :param lower_priority_weight: how much of a less urgent session's reservation counts
            against a device (:meth:`PlacementProblem.reserved_share`).
        :raises PlacementError: ``w_energy`` is not a finite number >= 0, or a bad
            ``lower_priority_weight``.
        """
        self.w_energy = _check_w_energy(w_energy)
        self.lower_priority_weight = _check_weight(lower_priority_weight)
        self.consolidate = consolidate
        self.insertion = insertion
        self.gap_window = gap_window

    def place(self, problem: PlacementProblem) -> Placement:
        """Place jointly with the reservations and for the SLO (see :func:`_joint`)."""
        return _joint(problem, self.lower_priority_weight, self._place)

    def _place(self, problem: PlacementProblem) -> Placement:
        units = {u.id: u for u in problem.units}
        cost = problem.cost
        avg: dict[int, float] = {
            u.id: sum(cost[(u.id, d)] for d in u.candidates) / len(u.candidates) for u in problem.units
        }
        devs = list(problem.devices)

        # The mean transfer over every ordered device pair (a missing link is free). Link.seconds is
        # linear in the bytes, so the mean is the mean latency plus the bytes times the mean seconds
        # per byte: two sums once, not one pass over the pairs per edge.
        pair_links = [problem.links.get((a, b)) for a in devs for b in devs if a != b]
        n_pairs = len(pair_links)
        mean_latency = sum(link.latency_s for link in pair_links if link is not None) / n_pairs if n_pairs else 0.0
        mean_spb = sum(link.seconds_per_byte for link in pair_links if link is not None) / n_pairs if n_pairs else 0.0
        edges = problem.edges
        links = problem.links

        def avg_comm(u: int, v: int) -> float:
            if n_pairs == 0:
                return 0.0
            return mean_latency + edges.get((u, v), 0.0) * mean_spb

        has_links = bool(problem.links)
        rank: dict[int, float] = {}
        for u in reversed(problem.units):
            best = 0.0
            for s in u.succs:
                c = (avg_comm(u.id, s) if has_links else 0.0) + rank[s]
                if c > best:
                    best = c
            rank[u.id] = avg[u.id] + best
        # Decreasing rank is a topological order (rank(u) > rank(succ) when costs > 0);
        # ties are broken by topological position to keep that property with zero costs.
        position = {u.id: i for i, u in enumerate(problem.units)}
        order = sorted(units, key=lambda i: (-rank[i], position[i]))
        # Per device: busy intervals sorted by start, and their ends (also sorted, as the
        # intervals never overlap) so the gap search can bisect instead of scanning from 0.
        timeline: dict[str, list[tuple[float, float]]] = {d: [] for d in devs}
        ends: dict[str, list[float]] = {d: [] for d in devs}
        # Per device: the idle gaps of positive length between busy intervals, sorted and
        # disjoint, plus where the last interval ends. A unit of positive duration can only
        # start in one of those gaps or at the tail, so searching them (from the first gap
        # ending after ``ready``) skips the back-to-back intervals the plain scan walks.
        gap_starts: dict[str, list[float]] = {d: [] for d in devs}
        gap_ends: dict[str, list[float]] = {d: [] for d in devs}
        tail: dict[str, float] = {d: 0.0 for d in devs}
        finish: dict[int, float] = {}
        assignment: dict[int, str] = {}
        terms: dict[int, dict[str, dict[str, float]]] = {}
        for uid in order:
            u = units[uid]
            best_dev, best_key, best_eft, best_start = "", float("inf"), 0.0, 0.0
            ut: dict[str, dict[str, float]] = {}
            excess = problem.energy_excess_j(u) if problem.energy else {}
            for dev in u.candidates:
                ready = 0.0
                for p in u.preds:
                    if p not in finish:  # zero-cost ties: fall back to topological safety
                        raise PlacementError(f"HEFT: unit {uid} ranked before its predecessor {p}")
                    src = assignment[p]
                    t = finish[p]
                    if src != dev:  # problem.transfer_seconds, inlined (the hot loop of long graphs)
                        link = links.get((src, dev))
                        if link is not None:
                            t += link.latency_s + edges.get((p, uid), 0.0) * link.seconds_per_byte
                    if t > ready:
                        ready = t
                dur = cost[(uid, dev)]
                if self.insertion and dur > 0.0:
                    start = _gap_slot(gap_starts[dev], gap_ends[dev], tail[dev], ready, dur, self.gap_window)
                else:
                    start = self._slot(timeline[dev], ready, dur, ends[dev])
                eft = start + dur
                energy_s = self.w_energy * excess.get(dev, 0.0)
                ut[dev] = {"latency_s": dur, "ready_s": ready, "start_s": start, "eft_s": eft, "rank": rank[uid],
                           "energy_s": energy_s, "score_s": eft + energy_s}
                if dev in excess:
                    ut[dev]["energy_j"] = problem.energy[(uid, dev)]
                if eft + energy_s < best_key:
                    best_dev, best_key, best_eft, best_start = dev, eft + energy_s, eft, start
            assignment[uid] = best_dev
            finish[uid] = best_eft
            tl = timeline[best_dev]
            if self.insertion:
                pos = bisect.bisect_right(tl, (best_start, best_eft))
                tl.insert(pos, (best_start, best_eft))
                ends[best_dev].insert(pos, best_eft)
                tail[best_dev] = _occupy(gap_starts[best_dev], gap_ends[best_dev], tail[best_dev],
                                         best_start, best_eft)
            else:
                tl.append((best_start, best_eft))
            terms[uid] = ut
        placement = Placement(assignment, "heft", terms)
        return consolidate(problem, placement) if self.consolidate else placement

    def _slot(self, tl: list[tuple[float, float]], ready: float, dur: float,
              ends: list[float] | None = None) -> float:
        """Earliest start >= ``ready`` of a ``dur``-long slot in the device timeline ``tl``.

        ``ends`` (the intervals' ends, sorted) lets the search skip every interval that
        ends by ``ready``: none of them can hold a slot starting at or after ``ready``
        (except a zero-length one exactly at ``ready``, which gives the same answer). That
        keeps HEFT near-linear on long graphs instead of quadratic.
        """
        if not tl:
            return ready
        if not self.insertion:
            return max(ready, tl[-1][1])
        if ends is None:
            ends = [e for _, e in tl]
        i = bisect.bisect_right(ends, ready)
        prev_end = ends[i - 1] if i else 0.0
        for k in range(i, len(tl)):
            s, e = tl[k]
            start = max(ready, prev_end)
            if start + dur <= s:
                return start
            prev_end = max(prev_end, e)
        return max(ready, prev_end)


def _gap_slot(gs: list[float], ge: list[float], tail: float, ready: float, dur: float,
              window: int | None = None) -> float:
    """Earliest start >= ``ready`` of a ``dur`` > 0 slot: same answer as ``HEFT._slot``
    when ``window`` is None (else only the first ``window`` candidate gaps are tried).

    Gaps ending by ``ready`` cannot hold it; the first later gap where it fits wins,
    else it goes after the last interval.
    """
    first = bisect.bisect_right(ge, ready)
    last = len(gs) if window is None else min(len(gs), first + window)
    for j in range(first, last):
        start = gs[j] if gs[j] > ready else ready
        if start + dur <= ge[j]:
            return start
    return tail if tail > ready else ready


def _occupy(gs: list[float], ge: list[float], tail: float, start: float, end: float) -> float:
    """Mark [start, end] busy in the gap lists; returns the new tail."""
    if start >= tail:
        if start > tail:
            gs.append(tail)
            ge.append(start)
        return end if end > tail else tail
    j = bisect.bisect_right(gs, start) - 1
    if j < 0 or start > ge[j]:
        return tail  # a zero-length interval between back-to-back ones: no gap changes
    g0, g1 = gs[j], ge[j]
    pieces = [(a, b) for a, b in ((g0, start), (end, g1)) if b > a]
    gs[j : j + 1] = [a for a, _ in pieces]
    ge[j : j + 1] = [b for _, b in pieces]
    return tail


class Pinned:
    """Place by a user mapping, or everything on one device.

    ``Pinned("cpu:0")`` puts every unit on ``cpu:0``. ``Pinned({"conv1": "cpu:1"},
    default="cpu:0")`` maps node names (a unit goes where its first mapped node says) and
    sends the rest to ``default``. A callable ``f(unit) -> device`` is accepted too.

    :raises PlacementError: a unit has no mapping and no default, or the device cannot run it.
    """

    def __init__(self, mapping: str | Mapping[str, str] | Callable[[Unit], str], *, default: str | None = None):
        self.mapping = mapping
        self.default = default

    def place(self, problem: PlacementProblem) -> Placement:
        assignment: dict[int, str] = {}
        for u in problem.units:
            if isinstance(self.mapping, str):
                dev: str | None = self.mapping
            elif callable(self.mapping) and not isinstance(self.mapping, Mapping):
                dev = self.mapping(u)
            else:
                dev = next((self.mapping[n] for n in u.nodes if n in self.mapping), self.default)
            if dev is None:
                raise PlacementError(
                    f"Pinned: unit {u.id} (nodes {list(u.nodes[:3])}) has no mapping and no default device"
                )
            assignment[u.id] = dev
        return Placement(assignment, "pinned")


class RandomPolicy:
    """Each unit on a uniformly random capable device, reproducible by ``seed``."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def place(self, problem: PlacementProblem) -> Placement:
        rng = random.Random(self.seed)
        return Placement({u.id: rng.choice(sorted(u.candidates)) for u in problem.units}, "random")
