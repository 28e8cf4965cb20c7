"""Few, big stages: after placement, a group of units must pay for its stage boundary.

A placement policy decides unit by unit; a group of units left on one device between units of
another (a 1-node Conv on a DLA core, a Div on a CPU cluster between two DLA runs, leading
Slice nodes spread over three devices) becomes a stage of its own, and every such stage costs
a launch on its device, a dispatch, and its tensors' hand-offs on each side. :func:`coarsen`
takes each connected group of units on one device (smallest first) and moves it whole to the
device that can run all of it and makes the chain of stage calls cheapest: the group's
compute there plus the boundaries it then has (one launch of the receiving device per device
handing data over, a dispatch each, the bytes over the link), against the same where it is.
Sweeps repeat until nothing moves (at most ``BoundaryCosts.fold_sweeps``). Each sweep is
linear in units and edges, times the devices a group can move to. Where one device runs every
unit at least as fast as any other (:func:`dominant_device`: e.g. the cluster of all CPU cores
beside its single cores), everything goes there at once: no placement can beat it.

The objective is the serial time of one request (stage calls and hand-offs, as a pipelined
session pays them per request); it gives up the parallelism of branches split over devices,
which the policy's list schedule counted on, only when the boundaries cost more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetsched.policies import PlacementProblem

__all__ = ["coarsen", "dominant_device"]

_REL_EPS = 1e-9


def _groups(problem: PlacementProblem, assignment: Mapping[int, str], pos: Mapping[int, int] | None = None,
            ) -> list[tuple[float, list[int]]]:
    """Connected groups of units on one device with their compute there, cheapest first (ties: by
    first unit). ``pos``: each unit id's position in ``problem.units`` (computed when not given)."""
    units = problem.units
    if pos is None:
        pos = {u.id: i for i, u in enumerate(units)}
    parent = list(range(len(units)))  # union-find over positions: list indexing, no dict per lookup
    for i, u in enumerate(units):
        here = assignment[u.id]
        for s in u.succs:
            if assignment[s] == here:
                a = i
                while parent[a] != a:
                    parent[a] = parent[parent[a]]
                    a = parent[a]
                b = pos[s]
                while parent[b] != b:
                    parent[b] = parent[parent[b]]
                    b = parent[b]
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        r = i
        while parent[r] != r:
            r = parent[r]
        groups.setdefault(r, []).append(u.id)
    cost = problem.cost
    out = []
    for g in groups.values():
        here = assignment[g[0]]
        out.append((sum(cost[(uid, here)] for uid in g), g))
    out.sort(key=lambda cg: (cg[0], cg[1][0]))
    return out


def dominant_device(problem: PlacementProblem, weight: Mapping[str, float] | None = None) -> str | None:
    """The device that runs every unit at least as fast (weighted) as any of its candidates, if
    one does: all units there is then the optimum of :func:`coarsen`'s objective (the serial time
    of a request: weighted compute plus hand-offs, which it has none of), since no placement can
    spend less than each unit's least weighted compute. ``None`` where no device does (ties:
    the least total, then the first in ``problem.devices``). Linear in units times devices, and
    it stops at the first units that rule out every device.
    """
    cost = problem.cost
    w = {d: 1.0 if weight is None else weight.get(d, 1.0) for d in problem.devices}
    alive = [d for d in problem.devices if all(d in u.candidates for u in problem.units)]
    totals = dict.fromkeys(alive, 0.0)
    inf = float("inf")
    for u in problem.units:
        if not alive:
            return None
        uid = u.id
        least = inf
        for e in u.candidates:
            c = w[e] * cost[(uid, e)]
            if c < least:
                least = c
        bound = least * (1 + _REL_EPS)
        kept = alive
        for d in alive:
            c = w[d] * cost[(uid, d)]
            if c > bound:
                kept = [x for x in kept if x != d]
            else:
                totals[d] += c
        alive = kept
    return min(alive, key=lambda d: totals[d]) if alive else None


def coarsen(problem: PlacementProblem, assignment: Mapping[int, str], launch: Mapping[str, float],
            *, weight: Mapping[str, float] | None = None, max_sweeps: int = 8,
            ) -> tuple[dict[int, str], dict[int, str]]:
    """``assignment`` with every group that does not pay for its boundary moved, and per moved
    unit the device it left (``{unit: device}``).

    :param launch: per device name, the fixed seconds of one stage call there
        (``BoundaryCosts.launch``); ``problem.links`` give the per-byte price of each device pair
        and their latency (which includes that launch: it is taken out and counted once per
        device handing data over, not once per tensor).
    :param weight: per device, the factor the policy weighs compute time there by (a hot or
        busy device's ``1 / score`` for PowerThermalWeighted; default 1): a group never moves
        onto a device the policy avoided for its state unless it is worth it there too.
    """
    out = dict(assignment)
    left: dict[int, str] = {}
    if len(problem.devices) < 2 or not problem.units or max_sweeps <= 0:
        return out, left
    everything = dominant_device(problem, weight)
    if everything is not None:
        # No placement beats it: every move of the sweeps below could only reach it or stop short.
        for u in problem.units:
            if out[u.id] != everything:
                left[u.id] = out[u.id]
                out[u.id] = everything
        return out, left
    units = {u.id: u for u in problem.units}
    pos = {u.id: i for i, u in enumerate(problem.units)}
    cost = problem.cost
    edges = problem.edges
    links = problem.links
    # Per ordered device pair: (dispatch latency without the receiver's launch, seconds per byte).
    price: dict[tuple[str, str], tuple[float, float]] = {}
    for (a, b), link in links.items():
        price[(a, b)] = (max(0.0, link.latency_s - launch.get(b, 0.0)), link.seconds_per_byte)

    def boundary(ext_in: Sequence[tuple[int, int]], ext_out: Sequence[tuple[int, int]], dev: str) -> float:
        total = 0.0
        senders: set[str] = set()
        receivers: set[str] = set()
        for p, u in ext_in:
            src = out[p]
            if src == dev:
                continue
            lat_spb = price.get((src, dev))
            if lat_spb is None:
                continue
            if src not in senders:
                senders.add(src)
                total += lat_spb[0] + launch.get(dev, 0.0)
            total += edges.get((p, u), 0.0) * lat_spb[1]
        for u, s in ext_out:
            dst = out[s]
            if dst == dev:
                continue
            lat_spb = price.get((dev, dst))
            if lat_spb is None:
                continue
            if dst not in receivers:
                receivers.add(dst)
                total += lat_spb[0] + launch.get(dst, 0.0)
            total += edges.get((u, s), 0.0) * lat_spb[1]
        return total

    as_set: dict[tuple[str, ...], frozenset[str]] = {}  # units share their candidate tuples

    def group_cands(group: Sequence[int]) -> frozenset[str]:
        targets: frozenset[str] | None = None
        for uid in group:
            cands = units[uid].candidates
            got = as_set.get(cands)
            if got is None:
                got = as_set[cands] = frozenset(cands)
            targets = got if targets is None else targets & got
            if len(targets) <= 1:
                break
        return targets or frozenset()

    Edge = tuple[int, int]

    def where_it_is(gids: Sequence[int], region: Sequence[int], members: set[int],
                    ) -> tuple[list[Edge], list[Edge], float]:
        """The region's (groups ``gids``, units ``region``) boundary edges and its serial time where
        it is now: compute, the hand-offs between its own parts (what moving it whole saves) and
        its boundary."""
        ext_in = [(p, uid) for uid in region for p in units[uid].preds if p not in members]
        ext_out = [(uid, s) for uid in region for s in units[uid].succs if s not in members]
        devs = {out[groups[j][0]] for j in gids}
        if len(devs) == 1:
            (here,) = devs
            w = 1.0 if weight is None else weight.get(here, 1.0)
            return ext_in, ext_out, w * sum(group_cost(j, here) for j in gids) + boundary(ext_in, ext_out, here)
        # (a region of several groups: their inner hand-offs count too)
        now = 0.0
        for uid in region:
            here = out[uid]
            now += (1.0 if weight is None else weight.get(here, 1.0)) * cost[(uid, here)]
            for s in units[uid].succs:
                if s in members and out[s] != here:
                    lat_spb = price.get((here, out[s]))
                    if lat_spb is not None:
                        now += lat_spb[0] + launch.get(out[s], 0.0) + edges.get((uid, s), 0.0) * lat_spb[1]
        for dev_here in devs:
            now += boundary([e for e in ext_in if out[e[1]] == dev_here], [e for e in ext_out if out[e[0]] == dev_here],
                            dev_here)
        return ext_in, ext_out, now

    gsum: dict[tuple[int, str], float] = {}  # (group index, device) -> the group's compute there (per sweep)
    groups: list[list[int]] = []

    def group_cost(j: int, dev: str) -> float:
        c = gsum.get((j, dev))
        if c is None:
            c = gsum[(j, dev)] = sum(cost[(uid, dev)] for uid in groups[j])
        return c

    def on(gids: Sequence[int], ext_in: list[Edge], ext_out: list[Edge], dev: str, bound: float) -> float:
        """The serial time of groups ``gids`` on ``dev`` (anything >= ``bound`` once it cannot beat it)."""
        there = (1.0 if weight is None else weight.get(dev, 1.0)) * sum(group_cost(j, dev) for j in gids)
        if there >= bound:
            return there
        return there + boundary(ext_in, ext_out, dev)

    def _better(best: tuple[float, str, Sequence[int]] | None, gids: Sequence[int],
                now_of: tuple[list[Edge], list[Edge], float], dev: str) -> tuple[float, str, Sequence[int]] | None:
        """``best`` or moving groups ``gids`` to ``dev``, whichever gains more (None: neither gains)."""
        ext_in, ext_out, now = now_of
        floor = now * (1 - _REL_EPS) if best is None else min(now * (1 - _REL_EPS), now - best[0])
        there = on(gids, ext_in, ext_out, dev, floor)
        return (now - there, dev, gids) if there < floor else best

    dirty: set[int] | None = None  # units whose group's surroundings changed (None: all, first sweep)
    for _ in range(max_sweeps):
        moved: set[int] = set()
        found = _groups(problem, out, pos)
        groups = [g for _, g in found]
        gsum.clear()
        gid: dict[int, int] = {}
        for i, (c, g) in enumerate(found):
            gsum[(i, out[g[0]])] = c
            for uid in g:
                gid[uid] = i
        cands = [group_cands(g) for g in groups]
        for i, group in enumerate(groups):
            if dirty is not None and dirty.isdisjoint(group):
                continue  # nothing in or around it changed since it was last found to pay
            here = out[group[0]]  # groups move whole, so a group stays on one device within a sweep
            targets = cands[i]
            if not targets or targets == {here}:
                continue
            members = set(group)
            # Adjacent groups no bigger than this one (a bigger one weighs its own moves), each
            # a candidate to move along with it: two groups alternating between devices (a DLA
            # run, a Div on a CPU, a DLA run ...) only pay for their boundaries together.
            near: dict[int, None] = {}
            for uid in group:
                for n in (*units[uid].preds, *units[uid].succs):
                    j = gid[n]
                    if j != i and len(groups[j]) <= len(group):
                        near[j] = None
            best: tuple[float, str, Sequence[int]] | None = None
            alone = where_it_is((i,), group, members)
            # The group alone, and with its neighbours that can go there too.
            seen: dict[tuple[int, ...], tuple[list[Edge], list[Edge], float]] = {}
            for dev in sorted(targets):
                if dev == here:
                    continue
                best = _better(best, (i,), alone, dev)
                joined = tuple(j for j in near if dev in cands[j] and out[groups[j][0]] != dev)
                if joined:
                    if joined not in seen:
                        region = [*group, *(u for j in joined for u in groups[j])]
                        seen[joined] = where_it_is((i, *joined), region, set(region))
                    best = _better(best, (i, *joined), seen[joined], dev)
            if best is not None:
                _, dev, gids = best
                region = [u for j in gids for u in groups[j]]
                for uid in region:
                    left.setdefault(uid, out[uid])
                    out[uid] = dev
                moved.update(region)
                for uid in region:
                    moved.update(units[uid].preds)
                    moved.update(units[uid].succs)
        if not moved:
            break
        dirty = moved
    for uid in [u for u, d in left.items() if out[u] == d]:
        del left[uid]  # moved away and back
    return out, left
