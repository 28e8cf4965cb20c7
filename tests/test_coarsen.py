"""coarsen: a group pays for its boundary or moves; a device faster for every unit takes them all."""

from __future__ import annotations

from hetsched._planning.coarsen import coarsen, dominant_device
from hetsched.policies import DeviceState, Link, PlacementProblem, Unit

DEVS = ("a", "b", "c")


def _chain(costs: list[dict[str, float]], *, latency_s: float = 1e-4) -> PlacementProblem:
    """A chain of units, unit i costing ``costs[i][dev]`` on each device it can run on."""
    n = len(costs)
    units = tuple(
        Unit(id=i, nodes=(f"n{i}",), op_types=("Relu",), candidates=tuple(costs[i]),
             preds=(i - 1,) if i else (), succs=(i + 1,) if i + 1 < n else ())
        for i in range(n)
    )
    cost = {(i, d): c for i, cs in enumerate(costs) for d, c in cs.items()}
    edges = {(i, i + 1): 1024.0 for i in range(n - 1)}
    links = {(x, y): Link(latency_s, 0.0) for x in DEVS for y in DEVS if x != y}
    return PlacementProblem(units, {d: DeviceState(name=d) for d in DEVS}, cost, edges, links)


def test_a_device_at_least_as_fast_for_every_unit_is_dominant() -> None:
    problem = _chain([{"a": 2e-3, "b": 1e-3, "c": 1e-3}, {"a": 2e-3, "b": 3e-3, "c": 2e-3}])
    assert dominant_device(problem) == "c"


def test_no_device_dominates_when_each_is_faster_somewhere() -> None:
    problem = _chain([{"a": 1e-3, "b": 2e-3, "c": 3e-3}, {"a": 3e-3, "b": 1e-3, "c": 3e-3}])
    assert dominant_device(problem) is None


def test_a_device_that_cannot_run_every_unit_is_not_dominant() -> None:
    problem = _chain([{"a": 1e-3, "b": 2e-3}, {"b": 1e-3, "c": 1e-3}])
    assert dominant_device(problem) is None


def test_weights_decide_dominance() -> None:
    problem = _chain([{"a": 1e-3, "b": 1.5e-3, "c": 9e-3}, {"a": 1e-3, "b": 1.5e-3, "c": 9e-3}])
    assert dominant_device(problem) == "a"
    assert dominant_device(problem, {"a": 2.0, "b": 1.0, "c": 1.0}) == "b"  # a hot "a": 2 ms weighted


def test_everything_goes_to_the_dominant_device_and_says_where_it_was() -> None:
    # the policy spread a chain over three devices for a little parallelism: serially every
    # boundary is paid and "c" is fastest for each unit, so all of it goes there
    problem = _chain([{"a": 2e-3, "b": 2e-3, "c": 1e-3}] * 6)
    spread = {i: DEVS[i % 3] for i in range(6)}
    out, left = coarsen(problem, spread, {d: 3e-5 for d in DEVS})
    assert set(out.values()) == {"c"}
    assert left == {i: d for i, d in spread.items() if d != "c"}


def test_without_a_dominant_device_a_group_that_pays_for_its_boundary_stays() -> None:
    # units 0-2 much faster on "a", 3-5 on "b": two big groups, each paying for its boundary
    fast_a, fast_b = {"a": 1e-3, "b": 9e-3, "c": 9e-3}, {"a": 9e-3, "b": 1e-3, "c": 9e-3}
    problem = _chain([fast_a] * 3 + [fast_b] * 3)
    split = {i: "a" if i < 3 else "b" for i in range(6)}
    out, left = coarsen(problem, split, {d: 3e-5 for d in DEVS})
    assert out == split and left == {}


def test_a_small_group_between_runs_of_another_device_moves() -> None:
    # one unit on "b" in a run on "a": a little faster there, but not by its two hand-offs
    fast_a = {"a": 1e-3, "b": 2e-3, "c": 9e-3}
    problem = _chain([fast_a, fast_a, {"a": 1.05e-3, "b": 1e-3, "c": 9e-3}, fast_a, fast_a])
    placed = {0: "a", 1: "a", 2: "b", 3: "a", 4: "a"}
    assert dominant_device(problem) is None
    out, left = coarsen(problem, placed, {d: 3e-5 for d in DEVS})
    assert set(out.values()) == {"a"} and left == {2: "b"}


def _small_dag_plan(**kwargs: object) -> object:
    import random

    from onnx import TensorProto, helper

    from hetsched import load_model, resolve_devices
    from hetsched._planning.graph import GraphIndex
    from hetsched._planning.plan import build_plan

    rng = random.Random(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [64, 64], b"\x00" * (4 * 64 * 64), raw=True)
    nodes, values = [], ["x"]
    for i in range(40):
        a = rng.choice(values[-4:])
        if i % 3 == 0:
            nodes.append(helper.make_node("MatMul", [a, "W"], [f"v{i}"], name=f"n{i}"))
        else:
            nodes.append(helper.make_node("Add", [a, rng.choice(values[-4:])], [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    graph = helper.make_graph(nodes, "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info(values[-1], TensorProto.FLOAT, [64, 64])],
                              initializer=[w])
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    devices = resolve_devices(["cpu:0", "cpu:1", "cpu:0-1"], available_cpus=[0, 1])
    return build_plan(GraphIndex(model), devices, "heft", max_unit_nodes=1, **kwargs)  # type: ignore[arg-type]


def test_the_fold_weighs_other_sessions_reservations() -> None:
    from hetsched._planning.plan import Plan
    from hetsched.policies import Reservation

    alone = _small_dag_plan()
    assert isinstance(alone, Plan)
    assert {s.device for s in alone.stages} == {"cpu:0-1"}  # both cores beat one, for every unit
    busy = Reservation("other", {"cpu:0-1": 0.9}, priority=1)
    shared = _small_dag_plan(reservations=(busy,), priority=2, slo_s=0.5)
    assert isinstance(shared, Plan)
    assert shared.problem.reservations == (busy,) and shared.problem.priority == 2 and shared.problem.slo_s == 0.5
    # another session keeps both cores 90 % busy: the fold must not move the model back onto them
    assert "cpu:0-1" not in {s.device for s in shared.stages}, shared.table()


def test_the_offered_rate_reaches_the_placement_problem() -> None:
    from hetsched._planning.plan import Plan

    plan = _small_dag_plan(rate_hz=25.0, slo_s=0.2)
    assert isinstance(plan, Plan)
    assert plan.problem.rate_hz == 25.0 and plan.problem.slo_s == 0.2
    assert _small_dag_plan().problem.rate_hz is None  # type: ignore[attr-defined]
