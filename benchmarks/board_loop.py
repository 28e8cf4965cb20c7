"""The closed loop on a board: adaptive re-placement on a hot twin, and failover.

**Hot board.** An rk3588 twin (a labelled simulator) at a hot ambient serves a sustained stream of
a CNN (light_squeezenet) whose cool plan puts its body on the GPU. The twin's devices run every
stage on the host with onnxruntime and model its board time and energy at the tree's clocks; the
twin sees the session's work through its load channel, so the GPU heats, its thermal governor
caps it and its stages slow down. Board time is driven by the session's modelled work: after
every batch of results the twin advances by the batch's pipeline time, the largest of the
devices' modelled busy seconds (``SessionStatistics.device_busy_s``), so loads, temperatures and
throttling follow the work and nothing depends on how fast this host is. The same stream runs
with the plan made at opening (``replanning=None``) and with the session adapting (the default
:class:`hetsched.Replanning`): ``hot_throughput_ratio`` = board requests per board second,
adaptive / static (target >= 1.2), with the throttle events and the modelled energy per request
of each. The NPU here is the twin's (modelled time and energy, onnxruntime numerics); the RKNN
backend's stages go through Rockchip's simulator instead (``benchmarks/rknn.py``).

**Failover.** A small CNN on two devices of :class:`hetsched.testing.FakeBackend` (the preferred,
faster one and a slower one); in the middle of a 5,000-request stream the preferred device is
made to fail for good (every run raises :class:`hetsched.DeviceFailedError`).
``failover_lost_requests`` (target 0: every request gets its result, the failed ones retried on
the new plan; each result is checked against onnxruntime), ``failover_recovery_s`` (wall seconds
from the first failure to the first stage run of the new plan), ``replans``.

    .venv/bin/python benchmarks/board_loop.py [--requests 4000] [--ambient 82] [--failover-requests 5000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
from _labels import MODELLED, labelled, twin
from onnx import TensorProto, helper, numpy_helper

import hetsched
from hetsched import DeviceFailedError, EventInfo, Hooks, LiveTwin, Replanning, Session
from hetsched.backends.sim import clock_from_root, twin_devices
from hetsched.testing import FakeBackend, fake_device

TARGETS = {"hot_throughput_ratio": ">= 1.2", "failover_lost_requests": "== 0"}
_BATCH = 8


async def _hot_run(adaptive: bool, requests: int, ambient: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hetsched-board-loop-") as root:
        twin = LiveTwin("rk3588", root, ambient_c=ambient, noise=False)
        twin.advance(0.0)  # the tree, and the load channel the session's stages report into
        devices = twin_devices("rk3588", clock=clock_from_root(root), root=root)
        config = Replanning(period_s=0.1, min_interval_s=0.3, drift_min_runs=16, drift_factor=1.5) if adaptive else None
        async with Session("light_squeezenet", devices=devices, root=root, adaptation=hetsched.Adaptation(replanning=config)) as s:
            first = s.get_inputs()[0]
            shape = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            cool_plan = sorted({st.device for st in s.plan.stages})
            board_s = 0.0
            prev: dict[str, float] = {}
            done = 0
            t0 = time.perf_counter()
            async with s.map(({first.name: x} for _ in range(requests)), window=_BATCH) as results:
                async for _ in results:
                    done += 1
                    if done % _BATCH and done != requests:
                        continue
                    busy = dict(s.statistics().device_busy_s)
                    dt = max((busy[k] - prev.get(k, 0.0) for k in busy), default=0.0)
                    prev = busy
                    if dt > 0:
                        twin.advance(dt)
                        board_s += dt
            wall = time.perf_counter() - t0
            stats = s.statistics()
            tw = twin.statistics()
            return {
                "requests": requests,
                "board_s": round(board_s, 3),
                "requests_per_board_s": round(requests / board_s, 2) if board_s > 0 else None,
                "throttle_events": tw.throttle_events,
                "peak_temp_c": round(tw.peak_temp_c, 1),
                "energy_per_request_mj": round((stats.energy_j or 0.0) / requests * 1e3, 4),
                "replans": stats.replanning.replans,
                "replan_reasons": dict(stats.replanning.reasons),
                "cool_plan_devices": cool_plan,
                "final_plan_devices": sorted({st.device for st in s.plan.stages}),
                "wall_s": round(wall, 2),
            }


def _small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.2, "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              initializer=[w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


class _FailoverClock(Hooks):
    """The first failed stage run, the re-plan, and the first stage run after it."""

    def __init__(self, failing: str):
        self.failing = failing
        self.first_failure: float | None = None
        self.replanned: float | None = None
        self.first_after: float | None = None

    def after_stage(self, info: EventInfo) -> None:
        if isinstance(info.error, DeviceFailedError):
            if self.first_failure is None:
                self.first_failure = info.time_s
        elif info.error is None and self.replanned is not None and self.first_after is None \
                and info.device != self.failing:
            self.first_after = info.time_s

    def replan(self, info: EventInfo) -> None:
        if self.replanned is None:
            self.replanned = info.time_s


async def _failover(requests: int) -> dict[str, Any]:
    model = _small_cnn()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(64)]
    expected = [ref.run(None, {"x": x})[0] for x in inputs]
    clock = _FailoverClock("fast")
    with FakeBackend("board-loop-fake") as backend:
        devices = [fake_device("fast", backend="board-loop-fake", peak_flops=1e13),
                   fake_device("slow", backend="board-loop-fake", peak_flops=1e10)]
        async with Session(model, devices=devices, hooks=[clock], max_in_flight=128) as s:
            assert {st.device for st in s.plan.stages} == {"fast"}

            def source() -> Any:
                for i in range(requests):
                    if i == requests // 2:
                        backend.fail_device("fast")
                    yield {"x": inputs[i % len(inputs)]}

            good = 0
            errors = 0
            async with s.map(source(), window=64) as results:
                try:
                    async for i, out in _enumerate(results):
                        good += bool(np.allclose(out["y"], expected[i % len(inputs)], rtol=1e-4, atol=1e-5))
                except Exception:
                    errors += 1
            stats = s.statistics()
    recovery = (clock.first_after - clock.first_failure
                if clock.first_after is not None and clock.first_failure is not None else None)
    fo = stats.failover
    return {
        "requests": requests,
        "failover_lost_requests": requests - good,
        "failover_recovery_s": round(recovery, 4) if recovery is not None else None,
        "replans": stats.replanning.replans,
        "quarantined": list(fo.quarantined) if fo is not None else [],
        "resubmitted": fo.resubmitted if fo is not None else 0,
        "stream_errors": errors,
    }


async def _enumerate(results: Any) -> Any:
    i = 0
    async for out in results:
        yield i, out
        i += 1


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    static = await _hot_run(False, args.requests, args.ambient)
    adaptive = await _hot_run(True, args.requests, args.ambient)
    fail = await _failover(args.failover_requests)
    s_rate, a_rate = static["requests_per_board_s"], adaptive["requests_per_board_s"]
    return {
        "benchmark": "board_loop",
        "soc": "rk3588 (twin: a labelled simulator)",
        "ambient_c": args.ambient,
        "hot_throughput_ratio": round(a_rate / s_rate, 3) if s_rate and a_rate else None,
        "static_throttle_events": static["throttle_events"],
        "adaptive_throttle_events": adaptive["throttle_events"],
        "static_energy_per_request_mj": static["energy_per_request_mj"],
        "adaptive_energy_per_request_mj": adaptive["energy_per_request_mj"],
        "failover_lost_requests": fail["failover_lost_requests"],
        "failover_recovery_s": fail["failover_recovery_s"],
        "replans": fail["replans"],
        "static": static,
        "adaptive": adaptive,
        "failover": fail,
        "targets": TARGETS,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000, help="requests per hot-board run")
    ap.add_argument("--ambient", type=float, default=82.0, help="the twin's ambient temperature in C")
    ap.add_argument("--failover-requests", type=int, default=5000)
    args = ap.parse_args()
    print(json.dumps(labelled(anyio.run(main_async, args), board=twin("rk3588"), figures=MODELLED)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
