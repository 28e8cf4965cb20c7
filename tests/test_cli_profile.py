"""``hetsched profile``: per-node and per-unit times, the cost table, why each unit sits where it
is; the report's pure parts (onnxruntime's profile events, ``explain``); ``Progress``'s ETA;
``Session.profile``'s progress callback."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from hetsched._cli import main
from hetsched._cli._common import Progress, format_duration, light_model
from hetsched._cli._profile_report import (
    OrtRun,
    build_report,
    capability_gap,
    explain,
    median_run,
    node_tag,
    parse_ort_profile,
)
from hetsched._errors import ProfileError
from hetsched._planning.costs import CostTable
from hetsched._planning.graph import GraphIndex
from hetsched._planning.plan import build_plan, unit_key
from hetsched.backends import Capabilities, Device
from hetsched.policies import DeviceState

# -- the CLI ------------------------------------------------------------------------------------


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def _host_devices() -> list[str]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) == 1:
        return [f"cpu:{cpus[0]}"]
    return [f"cpu:{cpus[0]}", f"cpu:{cpus[0]},{cpus[1]}"]


def _assert_consistent(report: dict) -> None:
    assert {"units", "nodes", "costs", "devices", "stages", "notes"} <= set(report)
    names = {d["name"] for d in report["devices"]}
    stage_of_unit = {u: st["device"] for st in report["stages"] for u in st["units"]}
    node_units = {n["unit"] for n in report["nodes"]}
    for u in report["units"]:
        assert u["device"] in u["candidates"] and set(u["candidates"]) <= names
        assert u["why"] and u["decided_by"]
        assert set(u["not_on"]) == names - {u["device"]}
        assert u["id"] in node_units
        if not u["runs"]:
            assert u["decided_by"] == "constant"
            continue
        assert stage_of_unit[u["id"]] == u["device"]
        # every candidate timed (none failed), each with its source
        assert not u["errors"]
        assert set(u["seconds"]) == set(u["candidates"]) == set(u["source"])
        assert all(s > 0 for s in u["seconds"].values())


def test_profile_host_json_per_node_and_per_unit(capsys: pytest.CaptureFixture[str]) -> None:
    devices = _host_devices()
    report = _json(capsys, ["profile", "light_squeezenet", "--devices", *devices, "--repeats", "2",
                            "--max-unit-nodes", "24", "--json"])
    _assert_consistent(report)
    assert len(report["devices"]) == len(devices)
    devices = [d["name"] for d in report["devices"]]  # as the resolver names them (cpu:0-1)
    assert all(d["per_node"] and d["source"] == "measured" for d in report["devices"])
    running = [u for u in report["units"] if u["runs"]]
    assert len(running) >= 2
    keys = {k for k, _, _ in report["costs"]["seconds"]}
    for u in running:
        assert set(u["source"].values()) == {"measured"}
        assert u["key"] in keys  # the cost table the plan used has this unit on its devices
        for d in devices:
            nodes = [n for n in report["nodes"] if n["unit"] == u["id"] and d in n["seconds"]]
            assert nodes
            kernels = sum(n["seconds"][d] for n in nodes)
            # the per-node figures and the unit's figure come from the same onnxruntime run:
            # its kernels (the nodes' and onnxruntime's own) lie inside it
            assert kernels + u["other_s"][d] == pytest.approx(u["node_sum_s"][d])
            assert 0 < u["node_sum_s"][d] <= u["seconds"][d] + 1e-6
    convs = [n for n in report["nodes"] if n["op_type"] == "Conv"]
    assert convs and all(set(n["seconds"]) == set(devices) for n in convs)  # a Conv keeps its kernel
    # a Relu after a Conv of its unit is fused into it by onnxruntime: no kernel of its own
    relus = [n for n in report["nodes"] if n["op_type"] == "Relu"]
    assert any(n["no_kernel"] == devices and not n["seconds"] for n in relus)
    assert all(not set(n["no_kernel"]) & set(n["seconds"]) for n in report["nodes"])


def test_profile_host_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "light_squeezenet", "--devices", *_host_devices()[:1], "--repeats", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "why each unit is where it is:" in out and "slowest nodes on" in out and "cost table:" in out
    assert err == ""  # stderr is not a terminal: no progress bar


def test_profile_twin_matches_plan_and_names_the_op(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from hetsched.testing import build_board_tree

    root = str(build_board_tree(tmp_path / "rk3588", "rk3588"))
    common = ["light_squeezenet", "--root", root, "--devices", "gpu", "big", "--max-unit-nodes", "8"]
    report = _json(capsys, ["profile", *common, "--repeats", "1", "--json"])
    _assert_consistent(report)
    assert all(d["source"] == "modelled" and not d["per_node"] for d in report["devices"])
    assert not any(n["seconds"] for n in report["nodes"])  # no per-node times on a twin
    assert any("simulated" in note for note in report["notes"])
    plan = _json(capsys, ["plan", *common, "--profile", "--json", "--quiet"])
    assert {u["id"]: u["device"] for u in plan["units"]} == {u["id"]: u["device"] for u in report["units"]}
    costs = {(k, d): s for k, d, s in report["costs"]["seconds"]}
    for u in report["units"]:
        for d, s in u["seconds"].items():
            assert u["source"][d] == "modelled"
            # the twin models the same board seconds for the unit alone and for the cost table
            assert costs[(u["key"], d)] == pytest.approx(s, rel=1e-9)
            assert u["planned_s"][d] == pytest.approx(s, rel=1e-9)
    # the constant units the twin's GPU cannot run say which op
    incapable = [u for u in report["units"] if "gpu" not in u["candidates"]]
    assert incapable
    for u in incapable:
        reason = u["not_on"]["gpu"]
        assert reason.startswith("not a candidate: op ") and any(f"op {op} " in reason for op in u["op_types"])


def test_profile_rejects_bad_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["profile", "light_squeezenet", "--repeats", "0"])
    assert info.value.code == 2 and "--repeats" in capsys.readouterr().err


# -- onnxruntime's profile events ---------------------------------------------------------------


def _ev(cat: str, name: str, ts: int, dur: int, op: str = "") -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X", "args": {"op_name": op} if op else {}}


def test_parse_ort_profile_assigns_kernels_to_runs_and_nodes() -> None:
    events = [
        _ev("Session", "session_initialization", 0, 50),
        _ev("Node", f"{node_tag(3)}_kernel_time", 10, 5, "Conv"),  # during initialisation: not a run
        _ev("Session", "model_run", 100, 40),
        _ev("Node", f"{node_tag(3)}_fence_before", 101, 1, "Conv"),
        _ev("Node", f"{node_tag(3)}_kernel_time", 102, 20, "FusedConv"),
        _ev("Node", f"{node_tag(12)}_kernel_time", 123, 10, "Concat"),
        _ev("Node", "ReorderOutput_kernel_time", 134, 4, "ReorderOutput"),
        _ev("Session", "model_run", 200, 30),
        _ev("Node", f"{node_tag(3)}_kernel_time", 201, 25, "FusedConv"),
    ]
    runs = parse_ort_profile(events)
    assert [r.seconds for r in runs] == pytest.approx([40e-6, 30e-6])
    assert runs[0].nodes == pytest.approx({3: 20e-6, 12: 10e-6})
    assert runs[0].other == pytest.approx({"ReorderOutput": 4e-6})
    assert runs[1].nodes == pytest.approx({3: 25e-6}) and not runs[1].other


def test_parse_ort_profile_rejects_garbage() -> None:
    with pytest.raises(ProfileError, match="list of events"):
        parse_ort_profile({"traceEvents": []})
    with pytest.raises(ProfileError, match="malformed"):
        parse_ort_profile([{"cat": "Session", "name": "model_run", "ts": 1}])


def test_median_run_skips_warmup() -> None:
    runs = [OrtRun(9.0, {}), OrtRun(3.0, {}), OrtRun(1.0, {}), OrtRun(2.0, {})]
    median, first = median_run(runs), median_run(runs[:1])
    assert median is not None and first is not None
    assert median.seconds == 2.0  # of 3, 1, 2 (the first is the warm-up)
    assert first.seconds == 9.0
    assert median_run([]) is None


# -- why a unit is where it is (pure, on hand-made plans) -------------------------------------


def _model(ops: list[str], n: int = 1 << 18) -> onnx.ModelProto:
    names = ["x", *[f"v{i}" for i in range(len(ops) - 1)], "y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"{op.lower()}{i}") for i, op in enumerate(ops)]
    vi = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, n]) for v in names]
    graph = helper.make_graph(nodes, "g", [vi[0]], [vi[-1]], value_info=vi[1:-1])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _costs(index: GraphIndex, per_unit: dict[tuple[int, ...], dict[str, float]]) -> CostTable:
    table = CostTable()
    for nodes, by_dev in per_unit.items():
        for dev, s in by_dev.items():
            table.update(unit_key(index, nodes), dev, s)
    return table


@pytest.mark.parametrize("policy", ["power-thermal", "heft"])
def test_explain_transfer_keeps_a_unit_off_a_faster_device(policy: str) -> None:
    index = GraphIndex(_model(["Sigmoid", "Relu"]))
    a = Device("a", cpus=(0,))
    b = Device("b", kind="gpu", cpus=(0,), memory_domain="b-mem")
    caps = {"a": Capabilities.everything(), "b": Capabilities.ops(["Relu"])}
    costs = _costs(index, {(0,): {"a": 1e-3}, (1,): {"a": 1e-3, "b": 0.9e-3}})
    plan = build_plan(index, [a, b], policy, costs=costs, capabilities=caps)
    assert [u.candidates for u in plan.units] == [("a",), ("a", "b")]
    assert plan.placement.assignment == {0: "a", 1: "a"}
    why = explain(plan, 1, {})
    assert why.decided_by == "transfer", why.text
    assert "not on the faster b" in why.text and "transfer cost" in why.text
    assert why.not_on["b"].startswith("faster")
    gap = capability_gap(index, plan.unit_nodes[0], caps["b"])
    assert gap == ("sigmoid0", "Sigmoid")
    first = explain(plan, 0, {"b": gap})
    assert first.decided_by == "only-candidate"
    assert first.not_on["b"] == "not a candidate: op Sigmoid (node 'sigmoid0') is not supported there"


def test_explain_score_of_a_hot_busy_device() -> None:
    index = GraphIndex(_model(["Relu"]))
    a, b = Device("a", cpus=(0,)), Device("b", cpus=(0,))
    hot = DeviceState(name="a", utilisation=1.0, temp_headroom=0.0, power_headroom=0.0)
    plan = build_plan(index, [a, b], "power-thermal", costs=_costs(index, {(0,): {"a": 1e-3, "b": 2e-3}}),
                      device_states={"a": hot})
    assert plan.placement.assignment == {0: "b"}
    why = explain(plan, 0, {})
    assert why.decided_by == "score", why.text
    assert "headroom score is 0.05" in why.text
    fastest = build_plan(index, [a, b], "power-thermal", costs=_costs(index, {(0,): {"a": 1e-3, "b": 2e-3}}))
    assert explain(fastest, 0, {}).decided_by == "fastest"
    assert explain(fastest, 0, {}).not_on == {"b": "slower: 2.000 ms vs 1.000 ms"}


def test_explain_refusal_and_report_fields() -> None:
    index = GraphIndex(_model(["Relu"]))
    a, b = Device("a", cpus=(0,)), Device("b", cpus=(0,))
    key = unit_key(index, (0,))
    plan = build_plan(index, [a, b], "heft", refused={(key, "a"): "the toolkit says no"})
    why = explain(plan, 0, {})
    assert why.decided_by == "only-candidate" and why.not_on == {"a": "refused by its backend: the toolkit says no"}
    report = build_report(index, plan, [], CostTable().to_json(), {})
    (unit,) = report["units"]
    assert unit["refused"] == {"a": "the toolkit says no"} and unit["device"] == "b" and unit["runs"]
    assert report["nodes"] == [{"name": "relu0", "op_type": "Relu", "unit": 0, "seconds": {}, "no_kernel": []}]


# -- Progress ---------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("seconds", "text"), [(0.04, "0.0 s"), (4.25, "4.2 s"), (42.4, "42 s"), (65, "1:05"),
                                               (3723, "1:02:03"), (-1, "0.0 s")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_progress_eta_from_injected_clock() -> None:
    clock, out = _Clock(), io.StringIO()
    bar = Progress(10, enabled=True, label="requests", clock=clock, stream=out)
    assert bar.eta_s() is None and "ETA --" in bar.line()
    clock.t += 4.0
    bar.update(2)
    assert bar.eta_s() == pytest.approx(16.0)
    assert out.getvalue().startswith("\r[######........................] 2/10 requests  4.0 s, ETA 16 s")
    clock.t += 0.05
    bar.update()  # within the redraw interval: nothing written
    assert out.getvalue().count("\r") == 1
    clock.t += 15.95
    bar.update(7)
    assert bar.line().endswith("10/10 requests in 20 s")
    assert out.getvalue().split("\r")[-1] == f"{'[' + '#' * 30 + '] 10/10 requests in 20 s':<78}\n"
    bar.update()  # finished: no more lines
    assert out.getvalue().count("\r") == 2


def test_progress_advance_to_grows_total_and_quiet_writes_nothing() -> None:
    clock, out = _Clock(), io.StringIO()
    bar = Progress(0, enabled=True, label="unit runs", clock=clock, stream=out)
    bar.advance_to(0, 4)
    assert "0/4 unit runs" in out.getvalue() and "ETA --" in out.getvalue()
    clock.t += 3.0
    bar.advance_to(3, 4)
    assert "3/4 unit runs  3.0 s, ETA 1.0 s" in out.getvalue()
    quiet = io.StringIO()
    off = Progress(3, enabled=False, clock=clock, stream=quiet)
    off.update(3)
    assert quiet.getvalue() == "" and off.done == 3
    assert Progress(3, stream=io.StringIO()).enabled is False  # not a terminal


# -- Session.profile's progress ---------------------------------------------------------------


@pytest.mark.anyio
async def test_session_profile_reports_progress() -> None:
    from hetsched import Session

    calls: list[tuple[int, int]] = []
    async with Session(light_model("light_squeezenet"), devices=_host_devices(), max_unit_nodes=24) as s:
        await s.profile(repeats=1, progress=lambda done, total: calls.append((done, total)))
        entries = s.costs.statistics().entries
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] == entries > 0
    assert all(t == calls[0][1] for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_a_profile_that_is_no_regular_file_is_a_unit_error_not_a_crash(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime's profile is read with ``read_regular_file`` (bounded, regular files only): a
    directory where the profile should be becomes the unit's error (the old ``read_text`` raised
    IsADirectoryError out of the profile run)."""
    import numpy as np

    import hetsched._onnxruntime as ort_mod
    from hetsched._cli._profile import _time_cpu
    from hetsched.backends.cpu import CpuBackend

    class _Wrapped:
        def __init__(self, sess: object) -> None:
            self._sess = sess

        def __getattr__(self, name: str) -> object:
            return getattr(self._sess, name)

        def end_profiling(self) -> str:
            real = self._sess.end_profiling()  # type: ignore[attr-defined]
            os.unlink(real)
            os.mkdir(real)  # a directory where the profile was
            return real

    real_session = ort_mod.ort_session
    monkeypatch.setattr(ort_mod, "ort_session", lambda *a, **k: _Wrapped(real_session(*a, **k)))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    cpu = sorted(os.sched_getaffinity(0))[0]
    dev = Device(name=f"cpu:{cpu}", kind="cpu", cpus=(cpu,), backend="cpu")
    timing, values = _time_cpu(CpuBackend(), model, (0,), dev, {"x": np.ones([1, 4], np.float32)}, 1, 0)
    assert timing.seconds is None and "onnxruntime's profile could not be read" in (timing.error or "")
    assert "not a regular file" in (timing.error or "") or "directory" in (timing.error or "")
    np.testing.assert_array_equal(values["y"], np.ones([1, 4], np.float32))
