"""Post-placement consolidation: fold small islands of units into the device around them.

Greedy list schedulers (HEFT, PowerThermalWeighted) decide one unit at a time: a unit can
land on a CPU cluster because the NPU was momentarily busy with a sibling branch, and the
cost of that choice (a stage boundary: one more launch of the NPU when the data comes back,
a cache sync on each hand-off) is only paid by the *successors*, after the decision. The
result ping-pongs between devices. :func:`consolidate` repairs that after the fact: it moves
a connected group of units sitting on one device next to units on another device onto that
device whenever every unit of the group can run there and the estimated schedule gets
shorter, repeated to a fixed point. Like the policies, it is a pure function of the problem.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._problem import Placement, PlacementProblem, Unit

__all__ = ["consolidate", "makespan"]

# Above this many (component x unit) evaluations per sweep the exact schedule is re-run too
# often to keep planning fast on very long graphs; the local estimate (the group's own time
# plus its boundary transfers) then decides instead.
_GLOBAL_EVAL_BUDGET = 400_000
_REL_EPS = 1e-9


def makespan(problem: PlacementProblem, assignment: Mapping[int, str]) -> float:
    """Finish time of the last unit when units run in the problem's topological order, each
    device one unit at a time, every unit starting once its inputs arrived (transfers priced
    by ``problem.links``, which include the launch of the receiving device's stage)."""
    cost = problem.cost
    free: dict[str, float] = {}
    finish: dict[int, float] = {}
    end = 0.0
    for u in problem.units:
        dev = assignment[u.id]
        start = free.get(dev, 0.0)
        for p in u.preds:
            t = finish[p] + problem.transfer_seconds(p, u.id, assignment[p], dev)
            if t > start:
                start = t
        f = start + cost[(u.id, dev)]
        finish[u.id] = f
        free[dev] = f
        if f > end:
            end = f
    return end


def _components(problem: PlacementProblem, assignment: Mapping[int, str]) -> list[list[int]]:
    """Connected groups of units on one device (edges of the unit graph), smallest first."""
    parent = {u.id: u.id for u in problem.units}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u in problem.units:
        for s in u.succs:
            if assignment[s] == assignment[u.id]:
                a, b = find(u.id), find(s)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for u in problem.units:
        groups.setdefault(find(u.id), []).append(u.id)
    return sorted(groups.values(), key=lambda g: (len(g), g[0]))


def _local_cost(problem: PlacementProblem, units: Mapping[int, Unit], members: set[int],
                assignment: Mapping[int, str], dev: str) -> float:
    """The group's time on ``dev`` plus the transfers across its boundary (critical-path view)."""
    total = 0.0
    for uid in members:
        total += problem.cost[(uid, dev)]
        u = units[uid]
        for p in u.preds:
            if p not in members:
                total += problem.transfer_seconds(p, uid, assignment[p], dev)
        for s in u.succs:
            if s not in members:
                total += problem.transfer_seconds(uid, s, dev, assignment[s])
    return total


def consolidate(problem: PlacementProblem, placement: Placement, *, max_sweeps: int = 16) -> Placement:
    """``placement`` with islands folded into a neighbouring device where that is estimated faster.

    A group is a connected set of units on one device; its targets are the devices of the
    units just before and after it that can run all of it. A move is kept only when the
    schedule estimate (:func:`makespan`, or on very long graphs the group's local time
    with its boundary transfers) strictly improves, so a placement that is already
    consolidated comes back unchanged. The scores of the original decisions are kept.
    """
    assignment = dict(placement.assignment)
    if len(problem.devices) < 2 or not problem.units:
        return placement
    units = {u.id: u for u in problem.units}
    changed = False
    for _ in range(max_sweeps):
        comps = _components(problem, assignment)
        exact = len(comps) * len(problem.units) <= _GLOBAL_EVAL_BUDGET
        best_total = makespan(problem, assignment) if exact else 0.0
        moved = False
        for comp in comps:
            members = set(comp)
            here = assignment[comp[0]]
            targets: dict[str, None] = {}
            for uid in comp:
                u = units[uid]
                for n in (*u.preds, *u.succs):
                    if n not in members and assignment[n] != here:
                        targets[assignment[n]] = None
            for dev in targets:
                if any(dev not in units[uid].candidates for uid in comp):
                    continue
                if exact:
                    trial = dict(assignment)
                    for uid in comp:
                        trial[uid] = dev
                    total = makespan(problem, trial)
                    if total < best_total * (1 - _REL_EPS):
                        assignment, best_total, moved = trial, total, True
                        break
                else:
                    old = _local_cost(problem, units, members, assignment, here)
                    if _local_cost(problem, units, members, assignment, dev) < old * (1 - _REL_EPS):
                        for uid in comp:
                            assignment[uid] = dev
                        moved = True
                        break
        if not moved:
            break
        changed = True
    if not changed:
        return placement
    return Placement(assignment, placement.policy, placement.scores)
