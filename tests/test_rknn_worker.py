"""The RKNN toolkit worker process (hetsched._rknn.client) with the real toolkit.

Skipped when no toolkit environment is found (``hetsched setup rknn``, or HETSCHED_RKNN_PYTHON).
Every wait is bounded: a thread join with a timeout, or pytest-timeout for the whole test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched import BackendUnavailableError, ToolkitWorkerError
from hetsched._rknn.client import BuildRequest, ToolkitProcess
from hetsched.lowlevel import BufferPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def toolkit_python() -> str:
    from hetsched._rknn.env import find_toolkit_python

    try:
        return find_toolkit_python()
    except BackendUnavailableError:
        pytest.skip("RKNN toolkit environment not found: run `hetsched setup rknn`")


def _conv_net(path: Path, seed: int = 0) -> Path:
    """A small conv net with seeded random weights (opset 13, static shapes)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _dropout9(path: Path) -> Path:
    """Opset-9 Dropout with its mask output: the toolkit refuses it."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Dropout", ["c"], ["d", "mask"], ratio=0.5),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "dropout9",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.save(model, path)
    return path


def _cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("rknn-models")
    return {"conv": _conv_net(d / "conv.onnx"), "dropout9": _dropout9(d / "dropout9.onnx")}


@pytest.fixture(scope="module")
def proc(toolkit_python: str) -> Any:
    with ToolkitProcess(name="npu:test", python=toolkit_python) as p:
        yield p


def test_build_and_run_match_onnxruntime(proc: ToolkitProcess, models: dict[str, Path], tmp_path: Path) -> None:
    assert proc.alive and proc.toolkit_version == "2.5.0"
    export = tmp_path / "conv.rknn"
    handle, result = proc.build(BuildRequest(str(models["conv"]), export_path=str(export)))
    assert result.ok and result.message == "" and handle is not None, result
    assert result.toolkit_version == "2.5.0" and result.seconds > 0
    assert export.stat().st_size > 0
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    out = np.full((1, 4, 8, 8), np.nan, np.float32)
    proc.run(handle, [x], [out])
    (ref,) = ort.InferenceSession(str(models["conv"]), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert not np.isnan(out).any()  # written in place, every element
    assert _cosine(out, ref) >= 0.999
    # a different input gives a different output (the run really happened)
    x2 = x[:, ::-1].copy()
    out2 = np.zeros_like(out)
    proc.run(handle, [x2], [out2])
    (ref2,) = ort.InferenceSession(str(models["conv"]), providers=["CPUExecutionProvider"]).run(None, {"x": x2})
    assert _cosine(out2, ref2) >= 0.999 and not np.allclose(out2, out)
    proc.release(handle)
    with pytest.raises(ToolkitWorkerError, match="no model with handle"):
        proc.run(handle, [x], [out])


def test_refused_model_reports_toolkit_message(proc: ToolkitProcess, models: dict[str, Path]) -> None:
    before = proc.statistics().build_failures
    handle, result = proc.build(BuildRequest(str(models["dropout9"])))
    assert handle is None and not result.ok
    assert "Not support 'Dropout' of opset-9!" in result.message
    assert "rknn-toolkit2 version" not in result.message
    assert proc.statistics().build_failures == before + 1
    assert proc.alive  # a refused model does not harm the process


def test_pool_input_goes_by_reference(proc: ToolkitProcess, models: dict[str, Path]) -> None:
    handle, result = proc.build(BuildRequest(str(models["conv"])))
    assert handle is not None, result
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(models["conv"]), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with BufferPool("host", backing="memfd") as pool:
        bx = pool.acquire_nowait((np.float32, (1, 3, 16, 16)))
        by = pool.acquire_nowait((np.float32, (1, 4, 8, 8)))
        try:
            ax, ay = bx.array(), by.array()
            ax[...] = x
            ay[...] = np.nan
            s0 = proc.statistics()
            proc.run(handle, [ax], [ay])
            s1 = proc.statistics()
            assert s1.arena_copies == s0.arena_copies  # the arena was not used
            assert s1.by_reference == s0.by_reference + 2
            assert _cosine(ay, ref) >= 0.999
            # an ordinary array beside a pool output: the input goes through the arena
            out = np.zeros((1, 4, 8, 8), np.float32)
            proc.run(handle, [x], [out])
            s2 = proc.statistics()
            assert s2.arena_copies == s1.arena_copies + 2 and s2.arena_bytes >= x.nbytes + out.nbytes
            np.testing.assert_array_equal(out, ay)
        finally:
            bx.release()
            by.release()
    proc.release(handle)


def test_arena_grows(proc: ToolkitProcess, tmp_path: Path) -> None:
    # big enough that the arena of earlier tests does not fit it
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((2, 3, 1, 1)) * 0.5).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 256, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 256, 256])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "big.onnx")
    handle, result = proc.build(BuildRequest(str(tmp_path / "big.onnx")))
    assert handle is not None, result
    x = rng.standard_normal((1, 3, 256, 256)).astype(np.float32)
    out = np.zeros((1, 2, 256, 256), np.float32)
    before = proc.statistics().arena_bytes
    proc.run(handle, [x], [out])
    assert proc.statistics().arena_bytes >= x.nbytes + out.nbytes > before
    (ref,) = ort.InferenceSession(str(tmp_path / "big.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert _cosine(out, ref) >= 0.999
    proc.release(handle)


def _reaped(pid: int) -> bool:
    """True when ``pid`` no longer exists (reaped) — not even as a zombie."""
    return not os.path.exists(f"/proc/{pid}")


def test_killed_mid_run_raises_and_is_reaped(toolkit_python: str, tmp_path: Path) -> None:
    # a model slow enough in the simulator that the kill lands during the run
    rng = np.random.default_rng(9)
    inits, nodes, prev = [], [], "x"
    for i in range(6):
        inits.append(numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.05).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        prev = f"c{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 128, 128])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "slow.onnx")
    p = ToolkitProcess(name="npu:killme", python=toolkit_python)
    p.start()
    try:
        handle, result = p.build(BuildRequest(str(tmp_path / "slow.onnx")))
        assert handle is not None, result
        pid = p.pid
        assert pid is not None
        x = rng.standard_normal((1, 32, 128, 128)).astype(np.float32)
        out = np.zeros((1, 32, 128, 128), np.float32)
        errors: list[BaseException] = []

        def call() -> None:
            try:
                while True:
                    p.run(handle, [x], [out])
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        t.join(30)
        assert not t.is_alive(), "the call hung after the worker died"
        assert len(errors) == 1 and isinstance(errors[0], ToolkitWorkerError)
        message = str(errors[0])
        assert "npu:killme" in message and str(pid) in message and "SIGKILL" in message
        assert _reaped(pid)
        assert not p.alive
        with pytest.raises(ToolkitWorkerError, match="npu:killme"):  # later calls fail at once
            p.run(handle, [x], [out])
        with pytest.raises(ToolkitWorkerError, match="npu:killme"):
            p.build(BuildRequest(str(tmp_path / "slow.onnx")))
    finally:
        p.close()
    p.close()  # idempotent


def test_killed_between_calls(toolkit_python: str) -> None:
    p = ToolkitProcess(name="npu:idle", python=toolkit_python)
    p.start()
    pid = p.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ToolkitWorkerError, match=rf"npu:idle.*{pid}"):
        p.release(1)
    assert _reaped(pid)
    p.close()


def test_close_reaps(toolkit_python: str) -> None:
    p = ToolkitProcess(name="npu:close", python=toolkit_python)
    p.start()
    pid = p.pid
    assert pid is not None and p.alive
    p.close()
    assert _reaped(pid) and not p.alive
    with pytest.raises(ToolkitWorkerError, match="closed"):
        p.release(1)


def test_child_dies_with_parent(toolkit_python: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from hetsched._rknn.client import ToolkitProcess
        p = ToolkitProcess(name="npu:orphan", python={toolkit_python!r})
        p.start()
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        child = int(line)
        assert os.path.exists(f"/proc/{child}")
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}"), "the toolkit worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_bad_interpreter_is_a_worker_error(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no such module: boom' >&2\nexit 3\n")
    fake.chmod(0o755)
    p = ToolkitProcess(name="npu:bad", python=str(fake))
    with pytest.raises(ToolkitWorkerError, match=r"npu:bad.*exited with status 3(.|\n)*no such module: boom"):
        p.start()
    assert not p.alive
    p.close()


def test_interpreter_without_toolkit(tmp_path: Path) -> None:
    # hetsched's own python has numpy but no rknn: the worker starts and reports the import error
    p = ToolkitProcess(name="npu:norknn", python=sys.executable)
    with pytest.raises(ToolkitWorkerError, match=r"npu:norknn.*cannot import rknn\.api"):
        p.start()
    pid = p.pid
    assert pid is not None and _reaped(pid)


def test_locate_shared() -> None:
    from hetsched._memory.shared import locate_shared

    with BufferPool("host", backing="memfd") as pool:
        buf = pool.acquire_nowait(4096)
        a = buf.array()
        loc = locate_shared(a.ctypes.data, a.nbytes)
        assert loc is not None
        fd, offset = loc
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:hetsched:host")
        os.pwrite(fd, b"\x07", offset + 5)  # the (fd, offset) pair really names this memory
        assert a[5] == 7
        assert locate_shared(a.ctypes.data + 10, a.nbytes - 10) == (fd, offset + 10)
        assert locate_shared(a.ctypes.data, 1 << 30) is None  # runs past the slab
        buf.release()
    assert locate_shared(a.ctypes.data, 1) is None  # the pool unmapped its slabs
    assert locate_shared(np.zeros(16).ctypes.data, 8) is None
    with BufferPool("anon", backing="anonymous") as pool:
        buf = pool.acquire_nowait(256)
        assert locate_shared(buf.array().ctypes.data, 256) is None
        buf.release()


def test_worker_started_from_a_short_lived_thread_outlives_that_thread(
        toolkit_python: str, models: dict[str, Path]) -> None:
    # Sessions start toolkit processes from anyio worker threads that end soon after; the
    # child's lifetime is tied to this process (the lifeline pipe), never to that thread.
    box: dict[str, ToolkitProcess] = {}

    def start() -> None:
        p = ToolkitProcess(name="npu:thread", python=toolkit_python)
        p.start()
        box["p"] = p

    t = threading.Thread(target=start)
    t.start()
    t.join(120)
    assert not t.is_alive()
    p = box["p"]
    try:
        time.sleep(0.5)  # a thread-bound death signal would have fired by now
        assert p.alive
        handle, result = p.build(BuildRequest(onnx_path=str(models["conv"])))
        assert result.ok and handle is not None
    finally:
        p.close()
