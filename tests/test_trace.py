"""Session traces (``Session(trace=PATH)``, ``hetsched run --trace``): Chrome trace event JSON."""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetsched
from hetsched import Device, Event, EventInfo, Hooks, Phase, Priority, Session
from hetsched._runtime import Topology, rate_limited_copy
from hetsched._session._trace_writer import TraceWriter
from hetsched.policies import Pinned
from hetsched.testing import build_board_tree

F = TensorProto.FLOAT


def _cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.1, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", F, [1, 8, 32, 32])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


X = np.zeros((1, 3, 32, 32), np.float32)
TWO_CPUS = Pinned({"conv": "cpu:0", "relu": "cpu:1"})


class _Stages(Hooks):
    """Counts stage runs as the session reports them (device worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[EventInfo] = []

    def after_stage(self, info: EventInfo) -> None:
        with self.lock:
            self.runs.append(info)


def _load(path: Path) -> dict[str, Any]:
    obj = json.loads(path.read_text())
    assert set(obj) == {"traceEvents", "displayTimeUnit", "otherData"} and obj["displayTimeUnit"] == "ms"
    return obj


def _processes(trace: dict[str, Any]) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def _threads(trace: dict[str, Any], pid: int) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def _slices(trace: dict[str, Any], pid: int | None = None, cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)
            and (cat is None or e.get("cat") == cat)]


def _ns(us: float) -> int:
    return round(us * 1000)


def _assert_no_overlap(trace: dict[str, Any]) -> None:
    tracks: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for e in _slices(trace):
        assert e["dur"] >= 0
        tracks[e["pid"], e["tid"]].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["name"]))
    for key, spans in tracks.items():
        spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(spans):
            assert start >= end, f"{a!r} and {b!r} overlap on track {key}"


@pytest.mark.anyio
async def test_a_traced_session_on_a_twin_root(tmp_path: Path, anyio_backend: str) -> None:
    root = build_board_tree(tmp_path / "board", "rk3588")
    path = tmp_path / "run.json"
    rec = _Stages()
    async with Session(_cnn(), devices=["cpu:0", "cpu:1"], root=root, policy=TWO_CPUS, max_unit_nodes=1,
                       hooks=[rec], trace=path) as s:
        placed = {st.name: st.device for st in s.plan.stages}

        async def one(k: int) -> None:
            await s.run({"x": X}, priority=Priority.HIGH if k % 2 else Priority.NORMAL)

        async with anyio.create_task_group() as tg:
            for k in range(6):
                tg.start_soon(one, k)
        await s.replan(reason="test: trace")
        await s.run({"x": X})
    assert set(placed.values()) == {"cpu:0", "cpu:1"}
    trace = _load(path)
    procs = _processes(trace)
    assert {"device cpu:0", "device cpu:1", "board", "requests", "compile"} <= set(procs)

    # one slice per stage run, on a named worker thread of the device that ran it, with the args
    stages = _slices(trace, cat="stage")
    assert len(stages) == len(rec.runs) == 7 * len(placed)
    for e in stages:
        assert e["pid"] == procs[f"device {placed[e['name']]}"]
        assert e["tid"] in _threads(trace, e["pid"])
        assert e["args"]["priority"] in ("HIGH", "NORMAL")
        assert isinstance(e["args"]["bound"], bool)
        assert e["args"]["queued_us"] >= 0 and e["args"]["since_request_start_us"] >= e["args"]["queued_us"]
        assert "error" not in e["args"]
    assert sorted(e["args"]["request_id"] for e in stages) == sorted(cast(int, i.request_id) for i in rec.runs)

    # one slice per request; the stage runs of each lie inside it
    requests = {e["args"]["request_id"]: e for e in _slices(trace, procs["requests"])}
    assert len(requests) == 7 and all(e["name"] == f"request {rid}" for rid, e in requests.items())
    for e in stages:
        r = requests[e["args"]["request_id"]]
        assert _ns(r["ts"]) <= _ns(e["ts"]) and _ns(e["ts"]) + _ns(e["dur"]) <= _ns(r["ts"]) + _ns(r["dur"])
    _assert_no_overlap(trace)

    # counters for clock domains, zones and rails on the board process, on the same timeline
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert all(e["pid"] == procs["board"] for e in counters)
    units = {e["name"].split(" ", 1)[0]: next(iter(e["args"])) for e in counters}
    assert units == {"freq": "MHz", "temp": "C", "power": "W"}
    assert {"freq cluster0", "temp soc-thermal", "power vdd_cpu_lit"} <= {e["name"] for e in counters}
    assert min(e["ts"] for e in counters) <= min(e["ts"] for e in stages)  # sampled at opening, before any run
    board = trace["otherData"]["board"]
    assert board["soc"] == "rk3588" and board["zones"]["soc-thermal"]["passive_trip_c"] is not None

    (replan,) = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "replan"]
    assert replan["s"] == "g" and replan["args"]["reason"] == "test: trace" and replan["args"]["number"] == 1
    assert max(_ns(e["ts"]) for e in stages) > _ns(replan["ts"])  # the last request ran after it
    assert trace["otherData"]["dropped_events"] == 0 and trace["otherData"]["session_error"] is None


def test_no_trace_registers_no_hooks() -> None:
    off = Session(_cnn(), devices=["cpu:0"])
    assert all(off._dispatch.listeners[ev] == () for ev in Event)
    on = Session(_cnn(), devices=["cpu:0"], trace="unused.json")
    assert on._dispatch.listeners[Event.BEFORE_STAGE] and on._dispatch.listeners[Event.REPLAN]
    with pytest.raises(TypeError, match="trace must be a file path"):
        Session(_cnn(), trace=3)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_session_cancelled_mid_run_leaves_valid_json(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "cancelled.json"
    done = [0]
    with anyio.CancelScope() as scope:
        async with Session(_cnn(), devices=["cpu:0", "cpu:1"], policy=TWO_CPUS, max_unit_nodes=1, trace=path) as s:

            async def loop() -> None:
                while True:
                    await s.run({"x": X})
                    done[0] += 1
                    if done[0] == 3:
                        scope.cancel()  # the others are still in flight

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(loop)
    assert scope.cancelled_caught
    trace = _load(path)
    assert trace["otherData"]["session_error"] is not None  # the cancellation, as the session saw it
    requests = _slices(trace, _processes(trace)["requests"])
    assert sum(1 for e in requests if "error" not in e["args"] and not e["args"].get("unfinished")) >= 3
    _assert_no_overlap(trace)


@pytest.mark.anyio
async def test_a_session_that_raises_or_fails_to_open_leaves_valid_json(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "raised.json"
    with pytest.raises(RuntimeError, match="boom"):
        async with Session(_cnn(), devices=["cpu:0"], trace=path) as s:
            await s.run({"x": X})
            raise RuntimeError("boom")
    trace = _load(path)
    assert "boom" in trace["otherData"]["session_error"] and len(_slices(trace, cat="stage")) == 1

    from hetsched import PlacementError

    failed = tmp_path / "failed-open.json"
    with pytest.raises(PlacementError):
        async with Session(_cnn(), devices=["cpu:0"], policy="no-such-policy", trace=failed):
            pass
    assert "PlacementError" in _load(failed)["otherData"]["session_error"]

    with pytest.raises(FileNotFoundError, match="no-such-dir"):
        async with Session(_cnn(), devices=["cpu:0"], trace=tmp_path / "no-such-dir" / "t.json"):
            pass


class _FakeGovernor:
    """What GovernorHooks drives (``on_phase``) and a trace reads back (``current_phase``)."""

    def __init__(self) -> None:
        self.current_phase: Phase | None = None

    def on_phase(self, phase: Phase) -> None:
        self.current_phase = phase


@pytest.mark.anyio
async def test_governor_phases_become_back_to_back_slices(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "gov.json"
    async with Session(_cnn(), devices=["cpu:0", "cpu:1"], policy=TWO_CPUS, max_unit_nodes=1,
                       governor=_FakeGovernor(), trace=path) as s:
        for _ in range(2):
            await s.run({"x": X})
    trace = _load(path)
    phases = sorted(_slices(trace, _processes(trace)["governor"]), key=lambda e: e["ts"])
    # per request: PREPROCESS, then INFER / POSTPROCESS around each of the two stages, IDLE at the end
    one = ["preprocess", "infer", "postprocess", "infer", "postprocess", "idle"]
    assert [e["name"] for e in phases] == one + one
    for a, b in itertools.pairwise(phases):
        assert _ns(a["ts"]) + _ns(a["dur"]) == _ns(b["ts"])  # each phase ends where the next begins
    _assert_no_overlap(trace)


def _transfer_model() -> onnx.ModelProto:
    """r = relu(x) [host]; n = neg(r) [acc]; y = reducesum(n) [host]: two 1 MiB copies per request."""
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["n"], name="neg"),
         helper.make_node("ReduceSum", ["n", "axes"], ["y"], name="sum", keepdims=0)],
        "g", [helper.make_tensor_value_info("x", F, [512, 512])], [helper.make_tensor_value_info("y", F, [512])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


class _FirstTransfer(Hooks):
    def __init__(self) -> None:
        self.seen = threading.Event()

    def before_transfer(self, info: EventInfo) -> None:
        self.seen.set()


@pytest.mark.anyio
async def test_transfers_go_on_channel_tracks_with_preemption_instants(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "xfer.json"
    first = _FirstTransfer()
    devices = [Device(name="host-cpu", cpus=(0,)), Device(name="acc", cpus=(1,), memory_domain="acc")]
    async with Session(_transfer_model(), devices=devices, max_unit_nodes=1, memory=hetsched.Memory(topology=Topology.discrete("host", ["acc"]), chunk_bytes=64 << 10, copy_fn=rate_limited_copy(16 << 20)),
                       policy=Pinned({"relu": "host-cpu", "neg": "acc", "sum": "host-cpu"}), hooks=[first], trace=path) as s:
        x = np.ones((512, 512), np.float32)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: s.run({"x": x}, priority=Priority.BACKGROUND))
            await anyio.to_thread.run_sync(first.seen.wait)
            await anyio.sleep(0.01)
            tg.start_soon(lambda: s.run({"x": x}, priority=Priority.HIGH))
        st = s.statistics().transfers
    assert st is not None
    trace = _load(path)
    pid = _processes(trace)["transfers"]
    assert all(name.startswith("channel acc<->host") for name in _threads(trace, pid).values())
    copies = _slices(trace, pid, cat="transfer")
    moved: dict[str, int] = defaultdict(int)
    for e in copies:
        moved[e["name"] + f"#{e['args']['request_id']}"] += e["args"]["bytes"]
        assert e["args"]["nbytes"] == 512 * 512 * 4
    assert len(moved) == st.transfers == 4 and all(v == 512 * 512 * 4 for v in moved.values())  # segments add up
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["pid"] == pid]
    assert sum(e["name"] == "preempted" for e in instants) == st.preemptions
    assert sum(e["name"] == "resumed" for e in instants) == st.channels["acc<->host"].resumes
    assert len(copies) == st.transfers + st.preemptions  # a preempted copy is one segment more
    _assert_no_overlap(trace)


class _GatedWriter(TraceWriter):
    """A writer whose thread waits for the test: the buffer fills deterministically."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def _run(self) -> None:
        self.gate.wait()
        super()._run()


def test_the_writer_bounds_its_buffer_and_closes_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    w = _GatedWriter(path, flush_events=2, max_buffered=4)
    w.emit({"ph": "i", "name": "before open"})  # not open: dropped silently
    w.open()
    for k in range(10):
        w.emit({"ph": "C", "name": "c", "ts": float(k), "args": {"v": float("nan") if k == 0 else k}})
    assert w.statistics().events_dropped == 6
    w.gate.set()
    w.close({"note": "x"})
    w.close()  # idempotent
    obj = json.loads(path.read_text())
    assert [e["ts"] for e in obj["traceEvents"]] == [0.0, 1.0, 2.0, 3.0]
    assert obj["traceEvents"][0]["args"]["v"] is None  # NaN is not JSON
    assert obj["otherData"] == {"note": "x", "dropped_events": 6, "events": 4}
    stats = w.statistics()
    assert not stats.open and stats.events_written == 4 and stats.error is None


def test_cli_run_writes_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsched._cli import main

    root = build_board_tree(tmp_path / "board", "rk3588")
    model = tmp_path / "cnn.onnx"
    onnx.save(_cnn(), model)
    path = tmp_path / "cli.json"
    assert main(["run", str(model), "--root", str(root), "--requests", "3", "--trace", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    trace = _load(path)
    procs = _processes(trace)
    stages = _slices(trace, cat="stage")
    # the warm-up requests run (and are traced) before the three counted ones
    assert len(stages) == (3 + summary["warmup_requests"]) * len(summary["stages"])
    assert {f"device {row['device']}" for row in summary["stages"]} <= set(procs)
    assert all(e["args"].get("energy_j", 0) > 0 for e in stages)  # the twin's modelled energy per run
    assert any(e["ph"] == "C" for e in trace["traceEvents"])


def test_sigterm_to_hetsched_run_leaves_a_closed_trace(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    root = build_board_tree(tmp_path / "board", "rk3588")
    model = tmp_path / "cnn.onnx"
    onnx.save(_cnn(), model)
    path = tmp_path / "sig.json"
    proc = subprocess.Popen([sys.executable, "-m", "hetsched", "run", str(model), "--root", str(root),
                             "--requests", "1000000", "--trace", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        give_up = time.monotonic() + 300  # only guards against a hang; nothing here is timed
        while not (path.exists() and b'"cat":"stage"' in path.read_bytes()):
            assert proc.poll() is None and time.monotonic() < give_up, "the run never wrote a stage slice"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    trace = _load(path)  # parses: the list and the object were closed
    assert trace["otherData"]["session_error"] == "cancelled"
    assert _slices(trace, cat="stage")
