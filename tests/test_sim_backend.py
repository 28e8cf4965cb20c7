"""Simulated twin devices: real outputs, accelerator op limits, modelled time and energy."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import Session
from hetsched.backends import Device, get_backend
from hetsched.backends.sim import OP_SETS, SimStage, clock_from_root, twin_devices
from hetsched.testing import build_board_tree

pytestmark = pytest.mark.anyio


def _conv_then_cumsum() -> onnx.ModelProto:
    """Conv (an NPU op) and a Relu followed by CumSum (which the twin's RKNN op set lacks).

    (TopK served here until the toolkit was measured to convert and run it: accelerators.md §1.)
    """
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], np.random.default_rng(0).standard_normal(216).astype(np.float32))
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("CumSum", ["f", "axis"], ["vals"], name="cumsum"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("vals", TensorProto.FLOAT, [1, 2048])], [w, axis])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_op_limits() -> None:
    assert OP_SETS["rknn"].supports("Conv", "", 17, [TensorProto.FLOAT])
    assert not OP_SETS["rknn"].supports("CumSum", "", 17, [TensorProto.FLOAT])
    assert not OP_SETS["rknn"].supports("NonMaxSuppression", "", 17, [TensorProto.FLOAT])
    assert not OP_SETS["dla"].supports("MatMul", "", 17, [TensorProto.FLOAT])
    # DLA runs FP16/INT8 engines: a double-precision conv is not its business.
    assert not OP_SETS["dla"].supports("Conv", "", 17, [TensorProto.DOUBLE])
    assert OP_SETS["cpu"].supports("TopK", "", 17, [TensorProto.FLOAT])


def test_twin_devices_describe_the_board() -> None:
    rk = {d.name: d for d in twin_devices("rk3588")}
    assert set(rk) == {"cluster0", "cluster4", "cluster6", "gpu", "npu"}
    assert rk["npu"].options["op_set"] == "rknn" and rk["gpu"].options["op_set"] == "mali"
    assert rk["cluster4"].capacity > rk["cluster0"].capacity
    orin = {d.name: d for d in twin_devices("orin-nx")}
    assert orin["gpu"].options["op_set"] == "ampere"
    import os

    host = set(os.sched_getaffinity(0))
    for d in [*rk.values(), *orin.values()]:
        assert set(d.cpus) <= host, "twin devices must never pin to cores the host lacks"


async def test_unsupported_op_falls_back_and_outputs_are_exact() -> None:
    model = _conv_then_cumsum()
    x = np.random.default_rng(1).standard_normal([1, 3, 16, 16]).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    devices = [d for d in twin_devices("rk3588") if d.name in ("cluster0", "npu")]
    # Pin everything possible to the NPU: CumSum cannot go there and must land on the CPU.
    policy = lambda problem: {u.id: ("npu" if "npu" in u.candidates else "cluster0") for u in problem.units}  # noqa: E731
    async with Session(model, devices=devices, policy=policy) as s:
        out = await s.run(None, {"x": x})
        placed = {st.device for st in s.plan.stages}
        tail_unit = next(u for u in s.plan.units if "CumSum" in u.op_types)
        assert tail_unit.candidates == ("cluster0",)
        assert s.plan.placement.assignment[tail_unit.id] == "cluster0"
        assert placed == {"npu", "cluster0"}
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-6)


def _sim_stage(clock: dict[str, int], flops_model: onnx.ModelProto, device: str = "gpu") -> SimStage:
    dev = next(d for d in twin_devices("rk3588", clock=lambda n: clock.get(n)) if d.name == device)
    return cast("SimStage", get_backend("sim").compile(flops_model, dev, name="s"))


def _matmul(n: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _add(n: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_modelled_time_follows_the_right_clock() -> None:
    fast = {"gpu": 1_000_000_000, "memory": 2_112_000_000}
    slow_core = {"gpu": 300_000_000, "memory": 2_112_000_000}
    slow_mem = {"gpu": 1_000_000_000, "memory": 528_000_000}
    compute = _matmul(1024)  # 2*1024^3 FLOPs over 12 MiB: compute-bound even at the lowest memory clock
    memory = _add(1 << 20)  # 1 FLOP per 12 bytes: memory-bound
    t_c_fast, e_c_fast = _sim_stage(fast, compute).modelled()
    t_c_slow, e_c_slow = _sim_stage(slow_core, compute).modelled()
    assert t_c_slow == pytest.approx(t_c_fast * 1e9 / 3e8, rel=1e-6)
    assert _sim_stage(slow_mem, compute).modelled()[0] == pytest.approx(t_c_fast)
    assert e_c_slow < e_c_fast  # lower V and f: less energy for the same work
    t_m_fast, _ = _sim_stage(fast, memory).modelled()
    t_m_slowmem, _ = _sim_stage(slow_mem, memory).modelled()
    assert t_m_slowmem == pytest.approx(t_m_fast * 2112 / 528, rel=1e-6)
    assert _sim_stage(slow_core, memory).modelled()[0] == pytest.approx(t_m_fast)


def test_stage_statistics_accumulate() -> None:
    st = _sim_stage({}, _add(1024))
    a = np.ones(1024, np.float32)
    out = st.run({"a": a, "b": a})
    np.testing.assert_array_equal(out[0], a + a)
    st.run({"a": a, "b": a})
    stats = st.statistics()
    assert stats.runs == 2 and stats.modelled_time_s > 0 and stats.modelled_energy_j > 0
    assert stats.modelled_time_s == pytest.approx(2 * stats.last_modelled_s)
    st.close()


def test_clock_from_a_board_tree(tmp_path: Path) -> None:
    build_board_tree(tmp_path, "rk3588")
    clock = clock_from_root(str(tmp_path))
    assert clock("cluster0") == int((tmp_path / "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq").read_text()) * 1000
    assert clock("gpu") == 300_000_000
    assert clock("memory") == 528_000_000
    assert clock("no-such-domain") is None
    # The clock is read live: a write to the tree shows at the next call.
    (tmp_path / "sys/class/devfreq/fb000000.gpu/cur_freq").write_text("800000000\n")
    assert clock("gpu") == 800_000_000


# ---- paced mode (the real runtime in the twin's board time): K x the modelled time, outputs not computed


def _paced(kind: str, pace: float, compute: str = "skip", root: str | None = None) -> Device:
    from hetsched.backends.sim import paced_devices

    return next(d for d in paced_devices(twin_devices("rk3588", root=root), pace, compute=compute) if d.name == kind)


def test_a_paced_stage_takes_k_times_its_modelled_time_and_skips_the_compute() -> None:
    import time

    dev = _paced("npu", 40.0)
    stage = cast("SimStage", get_backend("sim").compile(_conv_then_cumsum(), dev, name="paced"))
    t = stage.modelled()[0] + dev.options["launch_s"]
    x = np.ones([1, 3, 16, 16], np.float32)
    t0 = time.perf_counter()
    (out,) = stage.run({"x": x})
    host = time.perf_counter() - t0
    assert host >= 40.0 * t * (1 - 1e-6)  # held K x its modelled board time (never less)
    assert out.shape == (1, 2048) and out.dtype == np.float32 and not out.any()  # declared, zeros: not computed
    st = stage.statistics()
    assert st.pace == 40.0 and st.computed is False
    assert st.last_modelled_s == pytest.approx(t)  # its board time: the modelled one, launch included
    buf = np.full((1, 2048), 7.0, np.float32)
    stage.hooks.in_place.run_into({"x": x}, [buf])  # type: ignore[union-attr]  # in place: zeros written where the runtime asks
    assert not buf.any()
    stage.close()


def test_two_paced_runs_on_one_device_each_take_twice_as_long(tmp_path: Path) -> None:
    # A slow pace (~0.18 s per lone run) so that the two threads' start jitter on a loaded host is a
    # small part of the overlap the modelled time is checked on.
    pace = 200.0
    import threading
    import time

    from hetsched.backends import NO_STAGE_HOOKS
    from hetsched.backends.sim import SimStage

    both = threading.Barrier(2)

    class Inner:  # returns once both runs are in flight (each begun on the board before its call)
        input_names: tuple[str, ...] = ("x",)
        output_names: tuple[str, ...] = ("y",)
        hooks = NO_STAGE_HOOKS

        def run(self, feeds: Any) -> list[Any]:
            both.wait(10)
            return [feeds["x"]]

        def close(self) -> None:
            pass

    dev = _paced("npu", pace, compute="run", root=str(tmp_path))
    stages = [SimStage(Inner(), f"s{i}", dev, 3e9, 1e6) for i in range(2)]
    t = stages[0].modelled()[0] + dev.options["launch_s"]
    took: list[float] = []

    start = threading.Barrier(2)

    def go(s: SimStage) -> None:
        start.wait(10)  # both begin together: the overlap is the whole of each run
        t0 = time.perf_counter()
        s.run({"x": np.zeros(4, np.float32)})
        took.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=go, args=(s,)) for s in stages]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert len(took) == 2 and min(took) >= 2 * pace * t * (1 - 0.05)  # each at half rate: 2 x K x t
    for s in stages:
        assert s.statistics().last_modelled_s == pytest.approx(2 * t, rel=0.05)  # its board time doubled
        assert s.statistics().busy_time_s == pytest.approx(t, rel=1e-6)  # its own device time is its own


def test_paced_options_are_checked() -> None:
    from hetsched import DeviceSpecError
    from hetsched.backends.sim import paced_devices

    devs = twin_devices("rk3588")
    with pytest.raises(DeviceSpecError, match="pace"):
        paced_devices(devs, -1.0)
    with pytest.raises(DeviceSpecError, match="compute"):
        paced_devices(devs, 4.0, compute="maybe")
    from hetsched import Device

    with pytest.raises(DeviceSpecError, match="not a twin device"):
        paced_devices([Device("cpu:0")], 4.0)
    skip_only = Device("npu", kind="npu", backend="sim", options={**devs[-1].options, "compute": "skip"})
    with pytest.raises(DeviceSpecError, match="needs options\\['pace'\\]"):
        get_backend("sim").compile(_conv_then_cumsum(), skip_only, name="x")


async def test_a_session_on_paced_devices_serves_declared_shapes() -> None:
    from hetsched.backends.sim import paced_devices

    async with Session(_conv_then_cumsum(), devices=paced_devices(twin_devices("rk3588"), 2.0)) as s:
        (out,) = (await s.run({"x": np.ones([1, 3, 16, 16], np.float32)})).values()
    assert out.shape == (1, 2048) and out.dtype == np.float32 and not out.any()
