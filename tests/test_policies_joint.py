"""Joint placement (issue 26): the other sessions' reservations and the model's SLO are inputs."""

from __future__ import annotations

import pytest

from hetsched import PlacementError, Priority
from hetsched.policies import (
    HEFT,
    DeviceState,
    PlacementProblem,
    PowerThermalWeighted,
    Reservation,
    Unit,
    makespan,
)

POLICIES = [PowerThermalWeighted, HEFT]


def chain(n: int, npu_s: float, gpu_s: float, **kw: object) -> PlacementProblem:
    """``n`` units in a chain, each runnable on npu or gpu."""
    units = tuple(
        Unit(i, (f"n{i}",), ("Conv",), ("npu", "gpu"), preds=(i - 1,) if i else (), succs=(i + 1,) if i < n - 1 else ())
        for i in range(n)
    )
    cost = {}
    for u in units:
        cost[(u.id, "npu")] = npu_s
        cost[(u.id, "gpu")] = gpu_s
    devices = {"npu": DeviceState("npu", "npu"), "gpu": DeviceState("gpu", "gpu")}
    return PlacementProblem(units, devices, cost, **kw)  # type: ignore[arg-type]


def devices_of(problem: PlacementProblem, policy: object) -> set[str]:
    return set(policy.place(problem).assignment.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_alone_both_models_choose_the_npu(policy_cls: type) -> None:
    # the starting point of the issue: placed alone, each model takes the faster NPU
    assert devices_of(chain(3, 0.010, 0.015), policy_cls()) == {"npu"}


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_joint_placement_spreads_two_models_that_fit_apart(policy_cls: type) -> None:
    # model A keeps the NPU 70 % busy at its offered rate: model B (equal priority) would get
    # 30 % of it, 10 ms / 0.3 = 33 ms per unit against 15 ms on the idle GPU
    a = Reservation("A", {"npu": 0.7}, priority=Priority.NORMAL)
    problem = chain(3, 0.010, 0.015, reservations=(a,), priority=Priority.NORMAL)
    placement = policy_cls().place(problem)
    assert set(placement.assignment.values()) == {"gpu"}
    terms = placement.scores[0]
    assert terms["npu"]["contention"] == pytest.approx(1 / 0.3)
    assert terms["gpu"]["contention"] == pytest.approx(1.0)
    # a light reservation leaves the NPU the better device
    light = chain(3, 0.010, 0.015, reservations=(Reservation("A", {"npu": 0.1}),))
    assert devices_of(light, policy_cls()) == {"npu"}


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_background_takes_what_the_high_model_leaves(policy_cls: type) -> None:
    high = Reservation("det", {"npu": 0.6}, priority=Priority.HIGH, slo_s=0.033)
    bg = chain(2, 0.010, 0.020, reservations=(high,), priority=Priority.BACKGROUND)
    assert devices_of(bg, policy_cls()) == {"gpu"}  # 10 ms / 0.4 = 25 ms > 20 ms on the GPU
    # the HIGH model is served ahead of a background session's queue: its load does not count
    busy_bg = Reservation("bg", {"npu": 1.0}, priority=Priority.BACKGROUND)
    det = chain(2, 0.010, 0.020, reservations=(busy_bg,), priority=Priority.HIGH)
    assert devices_of(det, policy_cls()) == {"npu"}
    # unless the policy is told the scheduler does not order by priority (FIFO): saturated NPU
    assert devices_of(det, policy_cls(lower_priority_weight=1.0)) == {"gpu"}


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_an_slo_model_gets_the_faster_device(policy_cls: type) -> None:
    # the NPU is faster but expensive in energy (and, for PowerThermalWeighted, hot): without
    # an SLO the policy trades its speed away; a 20 ms deadline the GPU misses takes it back
    units = (Unit(0, ("conv",), ("Conv",), ("npu", "gpu")),)
    cost = {(0, "npu"): 0.010, (0, "gpu"): 0.025}
    energy = {(0, "npu"): 5.0, (0, "gpu"): 0.1}
    devices = {"npu": DeviceState("npu", "npu", utilisation=1.0, temp_headroom=0.0),
               "gpu": DeviceState("gpu", "gpu")}
    policy = policy_cls(w_energy=0.01)
    relaxed = policy.place(PlacementProblem(units, devices, cost, energy=energy))
    assert relaxed.assignment[0] == "gpu"
    urgent = PlacementProblem(units, devices, cost, energy=energy, slo_s=0.020)
    placed = policy.place(urgent)
    assert placed.assignment[0] == "npu"
    assert placed.policy.endswith("+slo")
    assert makespan(urgent, placed.assignment) <= 0.020
    # a deadline the default placement already meets changes nothing
    assert policy.place(PlacementProblem(units, devices, cost, energy=energy, slo_s=0.1)).assignment[0] == "gpu"


def test_contended_prices_once_and_caps_saturation() -> None:
    p = chain(1, 0.010, 0.015, reservations=(Reservation("A", {"npu": 0.5}), Reservation("B", {"npu": 0.9})))
    assert p.reserved_share("npu") == pytest.approx(1.4)
    q = p.contended()
    assert q.cost[(0, "npu")] == pytest.approx(0.010 / 0.05)  # capped at MAX_RESERVED_SHARE
    assert q.cost[(0, "gpu")] == pytest.approx(0.015)
    assert q.reservations == () and q.contended() is q


@pytest.mark.parametrize(
    "bad",
    [lambda: Reservation("A", {"npu": -0.1}), lambda: Reservation("A", {"npu": float("nan")}),
     lambda: Reservation("A", {"npu": 0.5}, slo_s=0.0), lambda: chain(1, 0.01, 0.02, slo_s=-1.0),
     lambda: HEFT(lower_priority_weight=2.0), lambda: PowerThermalWeighted(lower_priority_weight=-1)],
)
def test_bad_reservation_inputs_are_placement_errors(bad: object) -> None:
    with pytest.raises(PlacementError):
        bad()  # type: ignore[operator]


def test_build_plan_places_a_second_model_where_the_first_leaves_room() -> None:
    # the planner end to end on the rk3588 twin: SqueezeNet alone takes the NPU (0.9 ms, fp16); a
    # first session keeping the NPU 60 % busy at the same priority sends it to the Mali (1.8 ms);
    # one of a lower class (BACKGROUND, served after it) does not
    from hetsched import load_model
    from hetsched.backends.sim import twin_devices
    from hetsched.lowlevel import GraphIndex, build_plan

    index, devices = GraphIndex(load_model("light_squeezenet")), twin_devices("rk3588")
    assert {s.device for s in build_plan(index, devices).stages} == {"npu"}
    first = Reservation("first", {"npu": 0.6}, priority=Priority.NORMAL)
    joint = build_plan(index, devices, reservations=(first,), priority=Priority.NORMAL)
    assert {s.device for s in joint.stages} == {"gpu"}
    behind = Reservation("bulk", {"npu": 0.6}, priority=Priority.BACKGROUND)
    urgent = build_plan(index, devices, reservations=(behind,), priority=Priority.HIGH)
    assert {s.device for s in urgent.stages} == {"npu"}


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_a_model_without_slo_whose_load_fits_stays_on_the_cheap_device(policy_cls: type) -> None:
    # the NPU is 60 % busy with a HIGH model; a NORMAL classifier at 10 req/s needs 3 x 10 ms x 10 = 30 %
    # more: it fits, so it stays on the NPU (cheapest in energy) instead of chasing latency on the GPU
    high = Reservation("det", {"npu": 0.6}, priority=Priority.HIGH, slo_s=0.033)
    energy = {(u, d): (0.01 if d == "npu" else 1.0) for u in range(3) for d in ("npu", "gpu")}
    fits = chain(3, 0.010, 0.015, reservations=(high,), priority=Priority.NORMAL, rate_hz=10.0, energy=energy)
    assert fits.fits("npu") and devices_of(fits, policy_cls()) == {"npu"}
    # at 20 req/s it needs 60 %: it does not fit beside the detector and is placed by what is left
    over = chain(3, 0.010, 0.015, reservations=(high,), priority=Priority.NORMAL, rate_hz=20.0, energy=energy)
    assert not over.fits("npu") and devices_of(over, policy_cls()) == {"gpu"}
    # a closed loop (no rate) takes what is left: priced by it
    loop = chain(3, 0.010, 0.015, reservations=(high,), priority=Priority.NORMAL, energy=energy)
    assert devices_of(loop, policy_cls()) == {"gpu"}
    with pytest.raises(PlacementError, match="rate_hz"):
        chain(1, 0.01, 0.02, rate_hz=-1.0)


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_closed_loops_of_one_class_spread_over_the_devices(policy_cls: type) -> None:
    # a BACKGROUND closed loop (elastic) keeps the NPU busy: a second one goes to the slower, idle GPU
    # (there it adds to what the board serves; on the NPU it would only split it)
    first = Reservation("bg0", {"npu": 1.0}, priority=Priority.BACKGROUND, elastic=True)
    second = chain(3, 0.010, 0.015, reservations=(first,), priority=Priority.BACKGROUND)
    assert second.sharers("npu") == 1 and second.sharers("gpu") == 0
    assert devices_of(second, policy_cls()) == {"gpu"}
    # with both taken, the next one shares the device with the fewest loops for its speed:
    # the NPU with three (4 x 20 x 10 ms) against the GPU with one (2 x 20 x 15 ms)
    taken = (first, *(Reservation(f"bg{i}", {"npu": 1.0}, priority=Priority.BACKGROUND, elastic=True)
                      for i in (1, 2)),
             Reservation("bg3", {"gpu": 1.0}, priority=Priority.BACKGROUND, elastic=True))
    fifth = chain(3, 0.010, 0.015, reservations=taken, priority=Priority.BACKGROUND)
    assert fifth.contention_factor("npu") == pytest.approx(4 * 20.0)
    assert fifth.contention_factor("gpu") == pytest.approx(2 * 20.0)
    assert devices_of(fifth, policy_cls()) == {"gpu"}
    # loops of another class are no sharers: a HIGH model is served before them (not priced, weight 0)
    urgent = chain(3, 0.010, 0.015, reservations=taken, priority=Priority.HIGH)
    assert urgent.sharers("npu") == 0 and urgent.contention_factor("npu") == pytest.approx(1.0)
    assert devices_of(urgent, policy_cls()) == {"npu"}


def test_an_offered_load_fits_beside_closed_loops_of_its_class_only_in_its_fair_share() -> None:
    # beside a HIGH detector (20 % of the NPU) alone, 3 units x 10 ms x 15 req/s = 45 % fits
    det = Reservation("det", {"npu": 0.2}, priority=Priority.HIGH, slo_s=0.033)
    assert chain(3, 0.010, 0.015, reservations=(det,), priority=Priority.NORMAL, rate_hz=15.0).fits("npu")
    # a closed loop of its class keeping the rest busy: nothing is left beside it
    loop = Reservation("cls", {"npu": 0.8}, priority=Priority.NORMAL, elastic=True)
    assert not chain(3, 0.010, 0.015, reservations=(det, loop), priority=Priority.NORMAL, rate_hz=1.0).fits("npu")
    # one measured at 30 % so far: the newcomer's fair half of the 50 % left, 25 % (8 req/s: 24 %; 9: 27 %)
    half = Reservation("cls", {"npu": 0.3}, priority=Priority.NORMAL, elastic=True)
    assert chain(3, 0.010, 0.015, reservations=(det, half), priority=Priority.NORMAL, rate_hz=8.0).fits("npu")
    assert not chain(3, 0.010, 0.015, reservations=(det, half), priority=Priority.NORMAL, rate_hz=9.0).fits("npu")
    with pytest.raises(PlacementError, match="elastic"):
        Reservation("x", {"npu": 0.1}, elastic="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_a_closed_loop_spreads_only_where_its_requests_cost_no_more_energy(policy_cls: type) -> None:
    # a BACKGROUND loop keeps the NPU busy; the idle GPU is slower (15 ms vs 10 ms a unit)
    first = Reservation("bg0", {"npu": 1.0}, priority=Priority.BACKGROUND, elastic=True)

    def second(gpu_j: float | None) -> PlacementProblem:
        energy = {(u, "npu"): 0.01 for u in range(3)}
        if gpu_j is not None:
            energy.update({(u, "gpu"): gpu_j for u in range(3)})
        return chain(3, 0.010, 0.015, reservations=(first,), priority=Priority.BACKGROUND, energy=energy)

    # the GPU runs a unit for less energy (or unknown): spreading adds throughput for no more J/request
    assert devices_of(second(0.005), policy_cls()) == {"gpu"}
    assert devices_of(second(None), policy_cls()) == {"gpu"}
    # 100x the NPU's joules (ResNet-50 on CPU cores beside a busy NPU): it shares the NPU instead,
    # priced by its fair half of it (2 x 10 ms), not as taken
    costly = second(1.0)
    assert devices_of(costly, policy_cls()) == {"npu"}
    assert costly.sharing_factor("npu") == pytest.approx(2.0)
    assert costly.contended().cost[(0, "npu")] == pytest.approx(0.020)
    assert second(0.005).contended().cost[(0, "npu")] == pytest.approx(0.010 * 2 * 20.0)


def test_an_offered_load_that_fits_beside_closed_loops_is_not_priced() -> None:
    # a NORMAL model at 2 req/s (3 x 10 ms x 2 = 6 %) fits in its fair half of what a NORMAL loop and a
    # HIGH detector leave on the NPU: unpriced there (not even by its fair part, although the GPU would
    # cost it more energy)
    det = Reservation("det", {"npu": 0.2}, priority=Priority.HIGH, slo_s=0.033)
    loop = Reservation("cls", {"npu": 0.3}, priority=Priority.NORMAL, elastic=True)
    energy = {(u, d): (0.01 if d == "npu" else 1.0) for u in range(3) for d in ("npu", "gpu")}
    light = chain(3, 0.010, 0.015, reservations=(det, loop), priority=Priority.NORMAL, rate_hz=2.0, energy=energy)
    assert light.fits("npu") and light.contended().cost[(0, "npu")] == pytest.approx(0.010)


@pytest.mark.parametrize("policy_cls", POLICIES)
def test_a_closed_loop_sharing_the_efficient_device_does_not_move_to_a_costlier_one(policy_cls: type) -> None:
    # two BACKGROUND loops keep the NPU busy; the idle GPU would run this loop's units faster than its
    # third of the NPU (12 ms against 3 x 10 ms) but at 100x the joules: it shares the NPU
    loops = tuple(Reservation(f"bg{i}", {"npu": 1.0}, priority=Priority.BACKGROUND, elastic=True) for i in range(2))
    energy = {(u, d): (0.01 if d == "npu" else 1.0) for u in range(3) for d in ("npu", "gpu")}
    third = chain(3, 0.010, 0.012, reservations=loops, priority=Priority.BACKGROUND, energy=energy)
    assert devices_of(third, policy_cls()) == {"npu"}
    priced = third.contended().cost
    assert priced[(0, "npu")] == pytest.approx(0.030) and priced[(0, "gpu")] == pytest.approx(0.012 * 20.0)
    # where the GPU costs no more energy it is where the loop goes (it adds to what the board serves)
    cheap = {(u, d): 0.01 for u in range(3) for d in ("npu", "gpu")}
    assert devices_of(chain(3, 0.010, 0.012, reservations=loops, priority=Priority.BACKGROUND, energy=cheap),
                      policy_cls()) == {"gpu"}
