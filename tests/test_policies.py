"""Placement policies on plain data: PlacementProblem built by hand, no models, no I/O."""

from __future__ import annotations

import collections
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import hetsched.policies as policies_mod
from hetsched import PlacementError
from hetsched.policies import (
    HEFT,
    DeviceState,
    Link,
    Pinned,
    Placement,
    PlacementProblem,
    PowerThermalWeighted,
    RandomPolicy,
    Unit,
    consolidate,
    get_policy,
    makespan,
    validate_placement,
)


def _problem(
    costs: Mapping[int, Mapping[str, float]],
    *,
    edges: Mapping[tuple[int, int], float] | None = None,
    states: Mapping[str, DeviceState] | None = None,
    links: Mapping[tuple[str, str], Link] | None = None,
    names: Mapping[int, Sequence[str]] | None = None,
) -> PlacementProblem:
    """Units 0..n-1 (ids in topological order) with ``costs[unit][device]``."""
    edges = dict(edges or {})
    devices = sorted({d for c in costs.values() for d in c})
    preds: dict[int, list[int]] = collections.defaultdict(list)
    succs: dict[int, list[int]] = collections.defaultdict(list)
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    units = tuple(
        Unit(
            id=u,
            nodes=tuple(names[u]) if names else (f"n{u}",),
            op_types=("Conv",),
            candidates=tuple(costs[u]),
            preds=tuple(preds[u]),
            succs=tuple(succs[u]),
        )
        for u in sorted(costs)
    )
    st = {d: DeviceState(name=d) for d in devices}
    st.update(states or {})
    cost = {(u, d): c for u, cs in costs.items() for d, c in cs.items()}
    return PlacementProblem(units, st, cost, edges, dict(links or {}))


# -- PowerThermalWeighted -------------------------------------------------------------------------


def test_power_thermal_picks_the_fast_cool_device_over_the_slow_cool_one() -> None:
    p = _problem({0: {"slow": 3.0, "fast": 1.0}})
    placement = PowerThermalWeighted().place(p)
    assert placement.assignment == {0: "fast"}
    assert placement.policy == "power-thermal"
    terms = placement.scores[0]
    assert terms["fast"]["latency_s"] == 1.0 and terms["slow"]["latency_s"] == 3.0
    assert terms["fast"]["score"] == pytest.approx(1.0)


def test_power_thermal_avoids_a_hot_busy_device_unless_much_faster() -> None:
    hot = DeviceState("fast", utilisation=0.9, temp_headroom=0.1, power_headroom=0.1)
    # Score of the hot device: 0.4*0.1 + 0.3*0.1 + 0.3*0.1 = 0.1, so its latency counts x10.
    p = _problem({0: {"slow": 3.0, "fast": 1.0}}, states={"fast": hot})
    placement = PowerThermalWeighted().place(p)
    assert placement.assignment == {0: "slow"}
    assert placement.scores[0]["fast"]["score"] == pytest.approx(0.1)
    assert placement.scores[0]["fast"]["effective_s"] == pytest.approx(10.0)
    # Twenty times faster: worth using even hot.
    p = _problem({0: {"slow": 3.0, "fast": 0.15}}, states={"fast": hot})
    assert PowerThermalWeighted().place(p).assignment == {0: "fast"}


def test_power_thermal_weights_are_configurable() -> None:
    # "a": idle but hot and at its power limit; "b": half busy but cool with power to spare.
    states = {"a": DeviceState("a", utilisation=0.0, temp_headroom=0.0, power_headroom=0.0),
              "b": DeviceState("b", utilisation=0.5, temp_headroom=1.0, power_headroom=1.0)}
    p = _problem({0: {"a": 1.0, "b": 1.0}}, states=states)
    assert PowerThermalWeighted().place(p).assignment == {0: "b"}  # 0.4 vs 0.8
    assert PowerThermalWeighted(w_util=1.0, w_temp=0.0, w_power=0.0).place(p).assignment == {0: "a"}
    # Weights are normalised: only their ratios matter.
    w = PowerThermalWeighted(4, 3, 3)
    assert w.score(0.5, 1.0, 1.0) == pytest.approx(PowerThermalWeighted().score(0.5, 1.0, 1.0))
    assert PowerThermalWeighted().score(0.25, 0.5, 0.2) == pytest.approx(0.4 * 0.75 + 0.3 * 0.5 + 0.3 * 0.2)


@pytest.mark.parametrize("weights", [(-0.1, 0.5, 0.6), (0.0, 0.0, 0.0)])
def test_power_thermal_rejects_bad_weights(weights: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        PowerThermalWeighted(*weights)


def test_power_thermal_spreads_independent_units_over_equal_devices() -> None:
    # Two independent units, two identical cool devices: the second unit should not queue
    # behind the first.
    p = _problem({0: {"a": 1.0, "b": 1.0}, 1: {"a": 1.0, "b": 1.0}})
    assert set(PowerThermalWeighted().place(p).assignment.values()) == {"a", "b"}


def test_power_thermal_counts_transfer_cost() -> None:
    # Unit 1 is a bit faster on "b" but the edge from unit 0 (on "a") costs 5 s to move.
    p = _problem({0: {"a": 1.0}, 1: {"a": 1.0, "b": 0.9}}, edges={(0, 1): 5.0},
                 links={("a", "b"): Link(0.0, 1.0), ("b", "a"): Link(0.0, 1.0)})
    assert PowerThermalWeighted().place(p).assignment == {0: "a", 1: "a"}
    p_free = _problem({0: {"a": 1.0}, 1: {"a": 1.0, "b": 0.9}}, edges={(0, 1): 5.0})
    assert PowerThermalWeighted().place(p_free).assignment == {0: "a", 1: "b"}


# -- HEFT ---------------------------------------------------------------------------------------

# Topcuoglu, Hariri, Wu (2002), Fig. 2: ten tasks on three processors.
_TOPCUOGLU_W = {
    1: (14, 16, 9), 2: (13, 19, 18), 3: (11, 13, 19), 4: (13, 8, 17), 5: (12, 13, 10),
    6: (13, 16, 9), 7: (7, 15, 11), 8: (5, 11, 14), 9: (18, 12, 20), 10: (21, 7, 16),
}
_TOPCUOGLU_C = {
    (1, 2): 18, (1, 3): 12, (1, 4): 9, (1, 5): 11, (1, 6): 14, (2, 8): 19, (2, 9): 16, (3, 7): 23,
    (4, 8): 27, (4, 9): 23, (5, 9): 13, (6, 8): 15, (7, 10): 17, (8, 10): 11, (9, 10): 13,
}


def _topcuoglu() -> PlacementProblem:
    procs = ("P1", "P2", "P3")
    costs = {t - 1: dict(zip(procs, w, strict=True)) for t, w in _TOPCUOGLU_W.items()}
    edges = {(a - 1, b - 1): float(c) for (a, b), c in _TOPCUOGLU_C.items()}
    # Communication cost = data volume on any inter-processor link, 0 on the same processor.
    links = {(a, b): Link(0.0, 1.0) for a in procs for b in procs if a != b}
    return _problem(costs, edges=edges, links=links)


def test_heft_reproduces_the_textbook_schedule() -> None:
    # the paper's algorithm alone: consolidation (on by default) is hetsched's extension
    placement = HEFT(consolidate=False).place(_topcuoglu())
    expected = {1: "P3", 2: "P1", 3: "P3", 4: "P2", 5: "P3", 6: "P2", 7: "P3", 8: "P1", 9: "P2", 10: "P2"}
    assert {u + 1: d for u, d in placement.assignment.items()} == expected
    eft = {u + 1: placement.scores[u][d]["eft_s"] for u, d in placement.assignment.items()}
    assert eft[10] == pytest.approx(80.0)  # the paper's makespan
    ranks = {u + 1: placement.scores[u]["P1"]["rank"] for u in range(10)}
    assert ranks[1] == pytest.approx(108.0)
    assert ranks[3] == pytest.approx(80.0) and ranks[4] == pytest.approx(80.0)
    assert ranks[10] == pytest.approx(44 / 3)


def test_heft_consolidation_never_lengthens_the_estimated_schedule() -> None:
    problem = _topcuoglu()
    plain = HEFT(consolidate=False).place(problem)
    merged = HEFT().place(problem)
    assert makespan(problem, merged.assignment) <= makespan(problem, plain.assignment)
    assert merged.scores == plain.scores  # the decisions' terms are kept


def test_consolidate_folds_a_small_island_between_two_units_on_one_device() -> None:
    # u1 is a bit faster on "cpu", but each hand-off costs a launch of the next stage: the
    # island costs 2 x 0.5 more than it saves, so it joins the "npu" run around it.
    costs = {0: {"npu": 1.0, "cpu": 9.0}, 1: {"npu": 0.3, "cpu": 0.2}, 2: {"npu": 1.0, "cpu": 9.0}}
    links = {("npu", "cpu"): Link(0.5, 0.0), ("cpu", "npu"): Link(0.5, 0.0)}
    problem = _problem(costs, edges={(0, 1): 1.0, (1, 2): 1.0}, links=links)
    island = Placement({0: "npu", 1: "cpu", 2: "npu"}, "test")
    assert consolidate(problem, island).assignment == {0: "npu", 1: "npu", 2: "npu"}
    # free hand-offs: the island is worth it and stays
    free = _problem(costs, edges={(0, 1): 1.0, (1, 2): 1.0})
    assert consolidate(free, island).assignment == island.assignment
    # a unit the surrounding device cannot run stays where it is
    pinned = _problem({**costs, 1: {"cpu": 0.2}}, edges={(0, 1): 1.0, (1, 2): 1.0}, links=links)
    assert consolidate(pinned, island).assignment == island.assignment


def test_heft_sends_parallel_branches_to_different_devices() -> None:
    costs = {u: {"a": 1.0, "b": 1.0} for u in range(4)}
    diamond = {(0, 1): 1.0, (0, 2): 1.0, (1, 3): 1.0, (2, 3): 1.0}
    placement = HEFT().place(_problem(costs, edges=diamond))  # no links: transfers are free
    assert placement.assignment[1] != placement.assignment[2]


def test_heft_keeps_branches_together_when_transfers_are_expensive() -> None:
    costs = {u: {"a": 1.0, "b": 1.0} for u in range(4)}
    diamond = {(0, 1): 1.0, (0, 2): 1.0, (1, 3): 1.0, (2, 3): 1.0}
    links = {("a", "b"): Link(10.0, 0.0), ("b", "a"): Link(10.0, 0.0)}
    placement = HEFT().place(_problem(costs, edges=diamond, links=links))
    assert len(set(placement.assignment.values())) == 1


def test_heft_insertion_fills_idle_gaps() -> None:
    # u0 (long, only on a) -> u2; u1 is independent and short. With insertion u1 can use
    # the gap on b before u2 starts there, or on a; either way EFT never exceeds the
    # non-insertion variant.
    costs = {0: {"a": 5.0}, 1: {"a": 1.0, "b": 1.0}, 2: {"a": 9.0, "b": 1.0}}
    p = _problem(costs, edges={(0, 2): 1.0})
    with_ins = HEFT().place(p)
    without = HEFT(insertion=False).place(p)
    mk = lambda pl: max(pl.scores[u][d]["eft_s"] for u, d in pl.assignment.items())  # noqa: E731
    assert mk(with_ins) <= mk(without)
    assert with_ins.assignment[2] == "b"


def test_heft_slot_finds_a_gap() -> None:
    h = HEFT()
    assert h._slot([(0.0, 2.0), (5.0, 6.0)], ready=1.0, dur=2.0) == 2.0
    assert h._slot([(0.0, 2.0), (5.0, 6.0)], ready=1.0, dur=4.0) == 6.0
    assert HEFT(insertion=False)._slot([(0.0, 2.0), (5.0, 6.0)], ready=1.0, dur=2.0) == 6.0


# -- Pinned ---------------------------------------------------------------------------------------


def _three_units() -> PlacementProblem:
    return _problem({u: {"a": 1.0, "b": 1.0, "c": 1.0} for u in range(3)},
                    names={0: ["conv1", "relu1"], 1: ["conv2"], 2: ["fc"]})


def test_pinned_everything_on_one_device() -> None:
    placement = Pinned("b").place(_three_units())
    assert placement.assignment == {0: "b", 1: "b", 2: "b"}
    assert placement.policy == "pinned"


def test_pinned_mapping_with_default() -> None:
    placement = Pinned({"relu1": "c", "fc": "a"}, default="b").place(_three_units())
    assert placement.assignment == {0: "c", 1: "b", 2: "a"}


def test_pinned_callable() -> None:
    placement = Pinned(lambda u: "a" if u.id % 2 else "c").place(_three_units())
    assert placement.assignment == {0: "c", 1: "a", 2: "c"}


def test_pinned_without_default_names_the_unmapped_unit() -> None:
    with pytest.raises(PlacementError, match=r"unit 1 \(nodes \['conv2'\]\) has no mapping"):
        Pinned({"conv1": "a", "fc": "a"}).place(_three_units())


def test_pinned_to_unknown_device_is_caught_by_validation() -> None:
    p = _three_units()
    with pytest.raises(PlacementError, match="unknown device 'gpu'"):
        validate_placement(p, Pinned("gpu").place(p), "pinned")


# -- RandomPolicy -------------------------------------------------------------------------------


def _many_units(n: int) -> PlacementProblem:
    costs: dict[int, dict[str, float]] = {}
    for u in range(n):
        costs[u] = {"a": 1.0, "b": 1.0, "c": 1.0} if u % 4 else {"b": 1.0, "c": 1.0}
    return _problem(costs)


def test_random_policy_is_reproducible_by_seed() -> None:
    p = _many_units(60)
    assert RandomPolicy(7).place(p).assignment == RandomPolicy(7).place(p).assignment
    assert RandomPolicy(7).place(p).assignment != RandomPolicy(8).place(p).assignment


def test_random_policy_is_uniform_over_capable_devices() -> None:
    p = _many_units(4000)
    assignment = RandomPolicy(3).place(p).assignment
    full = collections.Counter(d for u, d in assignment.items() if u % 4)
    restricted = collections.Counter(d for u, d in assignment.items() if u % 4 == 0)
    assert set(restricted) == {"b", "c"}  # never an incapable device
    assert set(full) == {"a", "b", "c"}
    # 3000 draws over 3 devices: 1000 each, sd ~26; 1000 over 2: 500 each, sd ~16.
    assert all(850 <= c <= 1150 for c in full.values()), full
    assert all(420 <= c <= 580 for c in restricted.values()), restricted
    validate_placement(p, RandomPolicy(3).place(p), "random")


# -- validate_placement ------------------------------------------------------------------------


def _restricted() -> PlacementProblem:
    return _problem({0: {"a": 1.0, "b": 1.0}, 1: {"a": 1.0}}, names={0: ["conv"], 1: ["lstm"]})


def test_validate_unknown_device() -> None:
    with pytest.raises(PlacementError, match=r"unit 0 on unknown device 'npu'.*devices: \['a', 'b'\]"):
        validate_placement(_restricted(), {0: "npu", 1: "a"}, "mine")


def test_validate_incapable_device() -> None:
    with pytest.raises(PlacementError, match=r"policy 'mine' placed unit 1 .*device 'b', which cannot run it "
                                             r"\(capable: \['a'\]\)"):
        validate_placement(_restricted(), {0: "a", 1: "b"}, "mine")


def test_validate_unplaced_unit() -> None:
    with pytest.raises(PlacementError, match=r"left unit 1 \(lstm\) unplaced"):
        validate_placement(_restricted(), Placement({0: "a"}), "mine")


def test_validate_unknown_unit_and_wrong_type() -> None:
    with pytest.raises(PlacementError, match=r"unknown units \[5\]"):
        validate_placement(_restricted(), {0: "a", 1: "a", 5: "a"}, "mine")
    with pytest.raises(PlacementError, match="returned list"):
        validate_placement(_restricted(), ["a", "a"], "mine")


def test_validate_accepts_a_mapping_and_names_the_policy() -> None:
    placement = validate_placement(_restricted(), {0: "b", 1: "a"}, "mine")
    assert placement.assignment == {0: "b", 1: "a"} and placement.policy == "mine"


# -- get_policy -----------------------------------------------------------------------------------


def test_get_policy_builtin_names() -> None:
    assert isinstance(get_policy(None), PowerThermalWeighted)
    assert isinstance(get_policy("power-thermal"), PowerThermalWeighted)
    assert isinstance(get_policy("heft"), HEFT)
    assert isinstance(get_policy("HEFT"), HEFT)
    r = get_policy("random:42")
    assert isinstance(r, RandomPolicy) and r.seed == 42
    pinned = get_policy("pinned:cpu:0")
    assert isinstance(pinned, Pinned) and pinned.mapping == "cpu:0"


def test_builtins_are_registered_as_entry_points() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep for ep in entry_points(group="hetsched.policies")}
    assert {"heft", "power-thermal", "pinned", "random"} <= set(eps)
    assert eps["heft"].load() is HEFT
    assert eps["power-thermal"].load() is PowerThermalWeighted


def test_get_policy_unknown_name_lists_known_ones() -> None:
    with pytest.raises(PlacementError, match=r"unknown policy 'nope'.*'heft'.*'power-thermal'"):
        get_policy("nope")
    with pytest.raises(PlacementError, match="needs a device"):
        get_policy("pinned")


def test_get_policy_loads_a_third_party_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    (tmp_path / "thirdparty_policy_mod.py").write_text(textwrap.dedent("""
        class AllOnLast:
            def place(self, problem):
                last = sorted(problem.devices)[-1]
                return {u.id: last for u in problem.units}

        def first_device(problem):
            return {u.id: u.candidates[0] for u in problem.units}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    real = policies_mod.entry_points
    extra = [EntryPoint("all-on-last", "thirdparty_policy_mod:AllOnLast", "hetsched.policies"),
             EntryPoint("first", "thirdparty_policy_mod:first_device", "hetsched.policies")]

    def fake_entry_points(*, group: str):  # type: ignore[no-untyped-def]
        return [*real(group=group), *extra]

    monkeypatch.setattr(policies_mod, "entry_points", fake_entry_points)
    try:
        p = _three_units()
        assert get_policy("all-on-last").place(p) == {0: "c", 1: "c", 2: "c"}
        assert get_policy("first").place(p) == {0: "a", 1: "a", 2: "a"}
        with pytest.raises(PlacementError, match="all-on-last"):
            get_policy("missing")
    finally:
        sys.modules.pop("thirdparty_policy_mod", None)


def test_get_policy_custom_object_and_plain_function() -> None:
    class Mine:
        def place(self, problem: PlacementProblem) -> Mapping[int, str]:
            return {u.id: "a" for u in problem.units}

    obj = Mine()
    assert get_policy(obj) is obj

    def everything_on_b(problem: PlacementProblem) -> Mapping[int, str]:
        return {u.id: "b" for u in problem.units}

    pol = get_policy(everything_on_b)
    p = _three_units()
    placement = validate_placement(p, pol.place(p), policies_mod.policy_name(pol))
    assert placement.assignment == {0: "b", 1: "b", 2: "b"}
    assert placement.policy == "everything_on_b"
    with pytest.raises(PlacementError, match="got int"):
        get_policy(3)  # type: ignore[arg-type]
