"""NPU stages end to end through ``hetsched.Session`` on an rk3588 twin root, with the real
rknn-toolkit2 and its simulator (skipped only when no toolkit environment is found).

What the backend and worker unit tests (test_rknn_backend.py, test_rknn_worker.py) do not cover:
fallback of ops the toolkit refuses inside a session, the compile cache across sessions, a
worker process killed under a serving session, SIGTERM to a process serving NPU stages, and
per-core contexts while requests run concurrently. Every wait is bounded (``anyio.fail_after``,
a subprocess timeout, or pytest-timeout for the whole test).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import (
    Adaptation,
    BackendUnavailableError,
    Device,
    DeviceFailedError,
    EventInfo,
    Hooks,
    Session,
    StageExecutionError,
    resolve_devices,
)
from hetsched.backends import Capabilities, get_backend
from hetsched.backends.rknn import RknnStage, rknn_capabilities
from hetsched.policies import PlacementProblem

try:
    from hetsched._rknn.env import find_toolkit_python

    find_toolkit_python()
except BackendUnavailableError as _exc:
    pytest.skip(f"no rknn-toolkit2 environment: {_exc}", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)

F = TensorProto.FLOAT
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hetsched.testing import build_board_tree

    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.fixture(autouse=True)
def _cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh compile cache per test: what one test converts never answers another."""
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn-cache"))


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)


def _i64(name: str, *values: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _finish(nodes: list, name: str, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializer=inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def conv_net(seed: int = 0) -> onnx.ModelProto:
    """conv-relu-conv-relu-gap-flatten-gemm on a 1x3x16x16 input, seeded random weights."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "w1", 8, 3, 3, 3), _w(rng, "w2", 16, 8, 3, 3), _w(rng, "fc", 10, 16)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1, name="fc"),
    ]
    return _finish(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                   [helper.make_tensor_value_info("y", F, [1, 10])], inits)


def detector(seed: int = 0) -> onnx.ModelProto:
    """A detector in miniature: a conv head predicting 64 anchors x (4 box + 1 score), then a
    ``NonMaxSuppression`` tail (data-dependent output: the toolkit refuses it)."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "w1", 8, 3, 3, 3), _w(rng, "w2", 5, 8, 3, 3), _i64("shape", 1, 64, 5), _i64("s0", 0),
             _i64("s4", 4), _i64("s5", 5), _i64("axis", 2), _i64("max_out", 10),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Transpose", ["c2"], ["t"], perm=[0, 2, 3, 1], name="to_nhwc"),
        helper.make_node("Reshape", ["t", "shape"], ["anchors"], name="anchors"),
        helper.make_node("Slice", ["anchors", "s0", "s4", "axis"], ["boxes"], name="boxes"),
        helper.make_node("Slice", ["anchors", "s4", "s5", "axis"], ["logits"], name="logits"),
        helper.make_node("Sigmoid", ["logits"], ["prob"], name="sigmoid"),
        helper.make_node("Transpose", ["prob"], ["scores"], perm=[0, 2, 1], name="scores"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["selected"], name="nms"),
    ]
    return _finish(nodes, "detector", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                   [helper.make_tensor_value_info("boxes", F, [1, 64, 4]),
                    helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3])], inits)


def loop_net(seed: int = 0) -> onnx.ModelProto:
    """conv-relu, then a ``Loop`` (3 rounds of ``acc = acc * 0.5 + 1``), then a sigmoid."""
    rng = np.random.default_rng(seed)
    acc = [1, 4, 8, 8]
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "half"], ["m"]), helper.make_node("Add", ["m", "one"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, acc)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, acc)],
        initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Loop", ["trip", "cond", "r1"], ["acc"], body=body, name="loop"),
        helper.make_node("Sigmoid", ["acc"], ["y"], name="sigmoid"),
    ]
    inits = [_w(rng, "w1", 4, 3, 3, 3), numpy_helper.from_array(np.array(3, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "cond")]
    return _finish(nodes, "loopnet", [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info("y", F, acc)], inits)


def _x(model: onnx.ModelProto, seed: int) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _reference(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _npu(root: Path, spec: str = "npu", **options: object) -> Device:
    (dev,) = resolve_devices([spec], root=root)
    return dataclasses.replace(dev, options={**dev.options, **options})


def _devices(root: Path, spec: str = "npu", **options: object) -> list[Device]:
    return [_npu(root, spec, **options), *resolve_devices(["cpu:0"], root=root, available_cpus=[0])]


def _rknn_stages(s: Session) -> list[RknnStage]:
    """The session's NPU stages as the toolkit runs them (the twin wraps each one)."""
    out = [getattr(st.compiled, "rknn", st.compiled) for st in s._stages]
    return [x for x in out if isinstance(x, RknnStage)]


def _toolkit_children() -> list[int]:
    """Pids of this process's live children that run the toolkit worker."""
    pids = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return [p for p in pids if _is_worker(p) and _state(p) not in (None, "Z")]


def _is_worker(pid: int) -> bool:
    try:
        return b"_worker_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _state(pid: int) -> str | None:
    """The process state letter from /proc (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_until(done: Callable[[], bool], seconds: float) -> None:
    """Poll ``done`` (a process exit has no event to wait on) for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _hetsched_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hetsched-")]


@pytest.fixture
def claims_nms_and_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's first guess widened to claim NonMaxSuppression and Loop, so the toolkit
    itself is tried on them (the issue's measured case: the op list is wrong both ways)."""
    backend = get_backend("rknn")
    extra = Capabilities.ops(["NonMaxSuppression", "Loop"])
    base = rknn_capabilities()
    monkeypatch.setattr(backend, "capabilities", lambda device: Capabilities(allow=base.allow + extra.allow,
                                                                             deny=base.deny))


def npu_where_possible(problem: PlacementProblem) -> dict[int, str]:
    """Every unit the NPU may run on the NPU (``npu*``), the rest on the CPU device: these tests
    are about fallback and workers, not about whether the NPU pays off for a tiny model."""
    out = {}
    for u in problem.units:
        npu = [d for d in u.candidates if d.startswith("npu")]
        out[u.id] = npu[0] if npu else next(d for d in u.candidates if d.startswith("cpu"))
    return out


def _check_outputs(model: onnx.ModelProto, got: dict[str, np.ndarray], x: np.ndarray) -> None:
    want = _reference(model, {"x": x})
    assert set(got) == set(want)
    for name, ref in want.items():
        if ref.dtype == np.int64:  # NMS indices: exact, computed on the CPU from fp16-close boxes
            np.testing.assert_array_equal(got[name], ref)
        else:
            assert got[name].shape == ref.shape
            assert _cosine(got[name], ref) >= 0.999, name


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("which", ["nms", "loop"])
async def test_an_unsupported_tail_runs_on_the_cpu_by_the_op_list(twin_root: Path, which: str, anyio_backend: str) -> None:
    model, op = (detector(), "NonMaxSuppression") if which == "nms" else (loop_net(), "Loop")
    async with Session(model, devices=_devices(twin_root), root=twin_root, policy=npu_where_possible) as s:
        plan = s.plan.to_json()
        (unit,) = [u for u in plan["units"] if op in s.plan.units[u["id"]].op_types]
        assert "npu" not in unit["candidates"] and unit["device"] == "cpu:0"  # the op list's first guess
        assert not rknn_capabilities().supports(op, "", 13)
        backends = {st["backend"] for st in plan["stages"] if st["device"] == "npu"}
        assert backends == {"rknn"}, plan["stages"]
        assert _rknn_stages(s)
        for seed in range(3):
            x = _x(model, seed)
            _check_outputs(model, await s.run({"x": x}), x)


@pytest.mark.parametrize("which", ["nms", "loop"])
async def test_a_refused_op_falls_back_with_the_toolkits_reason(twin_root: Path, which: str, anyio_backend: str,
                                                                claims_nms_and_loop: None) -> None:
    model, op = (detector(), "NonMaxSuppression") if which == "nms" else (loop_net(), "Loop")
    # small units: the refused op's unit is not the whole model (a unit is what trying rejects)
    async with Session(model, devices=_devices(twin_root), root=twin_root, policy=npu_where_possible,
                       max_unit_nodes=2) as s:
        refused = s.plan.to_json()["refused"]
        assert refused and all(r["device"] == "npu" for r in refused)
        (reason,) = {r["reason"] for r in refused if op in s.plan.units[r["unit"]].op_types}
        assert reason.startswith("npu: ") and f"{op}(" in reason  # the toolkit's own message names the node
        assert "refused by a backend" in s.plan.table() and op in s.plan.table()
        stage_of = {u: st for st in s.plan.stages for u in st.units}
        for r in refused:
            assert stage_of[r["unit"]].device == "cpu:0"
        assert any(st.device == "npu" for st in s.plan.stages), s.plan.table()  # the conv head stays
        assert s.statistics().compile.refused == len(refused)
        for seed in range(2):
            x = _x(model, seed)
            _check_outputs(model, await s.run({"x": x}), x)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_second_session_converts_nothing_and_a_changed_setting_converts_again(twin_root: Path,
                                                                                      anyio_backend: str) -> None:
    model = conv_net(seed=1)
    x = _x(model, 0)
    want = _reference(model, {"x": x})["y"]
    async with Session(model, devices=_devices(twin_root), root=twin_root, policy=npu_where_possible) as s:
        first = s.statistics().compile
        assert first.conversions > 0 and first.seconds > 0
        assert _cosine((await s.run({"x": x}))["y"], want) >= 0.999
        # each NPU stage's measured accuracy against fp32 onnxruntime is part of the plan
        npu_rows = [r for r in s.plan.to_json()["stages"] if r["backend"] == "rknn"]
        assert npu_rows and all(r["accuracy"]["min_cosine"] >= 0.999 and r["accuracy"]["samples"] > 0
                                for r in npu_rows)
    async with Session(model, devices=_devices(twin_root), root=twin_root, policy=npu_where_possible) as s:
        again = s.statistics().compile
        assert again.conversions == 0 and again.cache_hits >= first.conversions and again.seconds == 0
        assert all(st.statistics().cached for st in _rknn_stages(s))
        assert _cosine((await s.run({"x": x}))["y"], want) >= 0.999
    # the float dtype is part of the cache key: the same stages convert once more
    async with Session(model, devices=_devices(twin_root, float_dtype="bfloat16"), root=twin_root,
                       policy=npu_where_possible) as s:
        changed = s.statistics().compile
        assert changed.conversions == first.conversions and changed.cache_hits == 0
        assert not any(st.statistics().cached for st in _rknn_stages(s))


class _Gate(Hooks):
    """Holds the first run of a stage on ``device`` in its worker thread until released."""

    def __init__(self, device: str):
        self.device = device
        self.entered = threading.Event()
        self.release = threading.Event()

    def before_stage(self, info: EventInfo) -> None:
        if info.device == self.device and not self.entered.is_set():
            self.entered.set()
            self.release.wait(60)


@pytest.mark.parametrize("failover", [False, True], ids=["no-failover", "failover"])
async def test_a_worker_killed_mid_run_fails_its_requests_and_nothing_hangs(twin_root: Path, anyio_backend: str,
                                                                            failover: bool) -> None:
    """Without failover the requests the dead worker had fail (DeviceFailedError naming the
    device); with it (the default) they start over on a new worker process and all succeed."""
    model = conv_net(seed=2)
    gate = _Gate("npu:0")
    before = set(_toolkit_children())
    errors: list[BaseException] = []
    done: list[dict] = []

    async def one(s: Session, seed: int) -> None:
        try:
            done.append(await s.run({"x": _x(model, seed)}))
        except StageExecutionError as exc:
            errors.append(exc)

    extra: dict[str, Any] = {} if failover else {"adaptation": Adaptation(replanning=None)}
    with anyio.fail_after(120):
        async with Session(model, devices=_devices(twin_root, "npu:0"), root=twin_root, policy=npu_where_possible,
                           hooks=[gate], **extra) as s:
            (stage,) = _rknn_stages(s)
            runs0 = stage.statistics().runs
            workers = set(_toolkit_children()) - before
            assert len(workers) == 1
            (pid,) = workers
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(one, s, i)
                await anyio.to_thread.run_sync(gate.entered.wait, 60)
                os.kill(pid, signal.SIGKILL)  # while the first request is inside the stage
                gate.release.set()
            if failover:
                assert not errors and len(done) == 4
                fo = s.statistics().failover
                assert fo is not None and fo.failures["npu:0"] >= 1 and fo.resubmitted >= 1
            else:
                assert errors, "a request ran on a killed worker without failing"
                for err in errors:
                    assert isinstance(err, DeviceFailedError) and err.device == "npu:0"
                    assert "npu:0" in str(err)
                assert len(errors) + len(done) == 4
                assert s.statistics().requests_failed == len(errors)
                assert stage.statistics().runs - runs0 == len(done)
    _wait_until(lambda: _state(pid) is None and not set(_toolkit_children()) - before, 10)
    assert _state(pid) is None, f"worker {pid} left behind in state {_state(pid)}"  # reaped: no zombie
    assert set(_toolkit_children()) <= before
    assert not _hetsched_threads()


_SERVE = textwrap.dedent("""
    import sys
    import anyio, numpy as np, onnx
    from hetsched import Session, resolve_devices

    def npu_first(problem):
        return {u.id: next((d for d in u.candidates if d.startswith("npu")), "cpu:0") for u in problem.units}

    model = onnx.load(sys.argv[1])
    devices = resolve_devices(["npu", "cpu:0"], root=sys.argv[2], available_cpus=[0])

    async def main():
        async with Session(model, devices=devices, root=sys.argv[2], policy=npu_first) as s:
            x = np.zeros((1, 3, 16, 16), np.float32)
            await s.run({"x": x})
            print("ready", flush=True)
            while True:
                await s.run({"x": x})

    anyio.run(main)
""")


def _children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def test_sigterm_to_a_process_serving_npu_stages_ends_its_toolkit_workers(twin_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(conv_net(seed=3), path)
    script = tmp_path / "serve.py"
    script.write_text(_SERVE)
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(twin_root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        workers = [p for p in _children_of(proc.pid) if _is_worker(p)]
        assert workers  # the contexts of per-core workers start as requests reach them
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _wait_until(lambda: all(_state(p) in (None, "Z") for p in workers), 30)
    assert [(p, _state(p)) for p in workers if _state(p) not in (None, "Z")] == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_per_core_contexts_serve_concurrent_requests(twin_root: Path, anyio_backend: str) -> None:
    model = conv_net(seed=4)
    want = {i: _reference(model, {"x": _x(model, i)})["y"] for i in range(12)}
    got: dict[int, np.ndarray] = {}
    before = set(_toolkit_children())

    async def one(s: Session, i: int) -> None:
        got[i] = (await s.run({"x": _x(model, i)}))["y"]

    with anyio.fail_after(300):
        async with Session(model, devices=[_npu(twin_root)], root=twin_root, policy=npu_where_possible) as s:
            (stage,) = _rknn_stages(s)
            runs0 = stage.statistics().runs  # an accuracy check at compile time may have run it
            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(one, s, i)
            stats = stage.statistics()
            assert stats.core_masks == (1, 2, 4) and stats.contexts_started == 2
            assert stats.runs - runs0 == 12
            assert len(set(_toolkit_children()) - before) == 3  # three contexts, three processes
            assert s.statistics().peak_in_flight > 1
        assert all(_cosine(got[i], want[i]) >= 0.999 for i in range(12))
        async with Session(model, devices=[_npu(twin_root, "npu:0-2")], root=twin_root, policy=npu_where_possible) as s:
            (stage,) = _rknn_stages(s)
            await s.run({"x": _x(model, 0)})
            assert stage.statistics().core_masks == (7,)
