"""The RKNN backend with the real rknn-toolkit2 and its simulator (skipped only without a toolkit env).

Every conversion goes through Rockchip's toolkit in its own environment (``hetsched setup rknn``,
or ``HETSCHED_RKNN_PYTHON``); the stages run in its simulator, the rest on onnxruntime.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import BackendUnavailableError, CompileError, Session
from hetsched._devices.resolve import resolve_devices
from hetsched._rknn.accuracy import RANDOM_SAMPLES
from hetsched.backends import Device, WorkerInfo, get_backend
from hetsched.backends.rknn import RknnBackend, RknnStage
from hetsched.policies import PlacementProblem
from hetsched.testing import with_seeded_weights

from _rknn_models import conv_net

F = TensorProto.FLOAT

try:
    from hetsched._rknn.env import find_toolkit_python

    find_toolkit_python()
except BackendUnavailableError as _exc:
    pytest.skip(f"no rknn-toolkit2 environment: {_exc}", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hetsched.testing import build_board_tree

    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rknn-cache")


@pytest.fixture(autouse=True)
def _cache_env(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(cache_dir))


def _npu(twin_root: Path, spec: str = "npu", **options: object) -> Device:
    (dev,) = resolve_devices([spec], root=twin_root)
    return dataclasses.replace(dev, options={**dev.options, **options})




def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _split_policy(problem: PlacementProblem) -> dict[int, str]:
    """The first third of the units on the CPU device, the rest on the NPU wherever it can run them."""
    units = problem.units
    cut = max(1, len(units) // 3)
    return {u.id: ("npu" if i >= cut and "npu" in u.candidates else "cpu:0") for i, u in enumerate(units)}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("which", ["conv_net", "squeezenet"])
async def test_cnn_split_across_cpu_and_npu_matches_onnxruntime(twin_root: Path, which: str, anyio_backend: str) -> None:
    model = conv_net() if which == "conv_net" else with_seeded_weights("light_squeezenet")
    devices = [*resolve_devices(["cpu:0"], root=twin_root, available_cpus=[0]), _npu(twin_root)]
    backend = get_backend("rknn")
    before = backend.statistics()  # type: ignore[attr-defined]
    rng = np.random.default_rng(7)
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    name, shape = inp.name, [d.dim_value for d in inp.type.tensor_type.shape.dim]
    async with Session(model, devices=devices, policy=_split_policy, root=twin_root, max_unit_nodes=4) as s:
        stages = s.plan.stages if hasattr(s.plan, "stages") else ()
        assert {st.device for st in stages} >= {"cpu:0", "npu"}
        npu_compiled = [st.compiled for st in s._stages if st.spec.device == "npu"]
        assert npu_compiled and all(isinstance(c.rknn, RknnStage) for c in npu_compiled)
        for _ in range(3):
            x = rng.standard_normal(shape).astype(np.float32)
            got = await s.run({name: x})
            (want,) = _reference(model, {name: x})
            (out,) = got.values()
            assert _cosine(out, want) >= 0.999
            assert int(np.argmax(out)) == int(np.argmax(want))
        assert sum(c.statistics().runs for c in npu_compiled) == 3 * len(npu_compiled)
        # the twin still models the NPU stages' time
        assert all(c.statistics().modelled_time_s > 0 for c in npu_compiled)
    after = backend.statistics()  # type: ignore[attr-defined]
    assert after.conversions + after.cache_hits > before.conversions + before.cache_hits


def test_second_compile_is_a_cache_hit_and_changed_settings_convert_again(twin_root: Path, tmp_path: Path) -> None:
    backend = RknnBackend()
    model = conv_net(seed=3)
    dev = _npu(twin_root, cache_dir=str(tmp_path))
    backend.compile(model, dev, name="s").close()
    s1 = backend.statistics()
    assert (s1.conversions, s1.cache_hits) == (1, 0) and s1.seconds > 0
    stage = backend.compile(model, dev, name="s")
    s2 = backend.statistics()
    assert (s2.conversions, s2.cache_hits) == (1, 1) and s2.seconds == s1.seconds
    assert stage.rknn.statistics().cached  # type: ignore[attr-defined]
    stage.close()
    for changed in (_npu(twin_root, cache_dir=str(tmp_path), float_dtype="bfloat16"),
                    _npu(twin_root, cache_dir=str(tmp_path), target="rk3576")):
        backend.compile(model, changed, name="s").close()
    s3 = backend.statistics()
    assert (s3.conversions, s3.cache_hits) == (3, 1)
    assert len(list(tmp_path.rglob("*.rknn"))) == len(list(tmp_path.rglob("*.json"))) == 3


def test_per_core_workers_get_one_context_each(twin_root: Path) -> None:
    backend = RknnBackend()
    dev = _npu(twin_root)
    assert len(backend.worker_cpus(dev)) == 3
    model = conv_net(seed=4)
    stage = backend.compile(model, dev, name="s")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (want,) = _reference(model, {"x": x})
    try:
        states = [stage.worker_state(WorkerInfo("npu", i, ())) for i in range(3)]  # type: ignore[attr-defined]
        pids = {st.proc.pid for st in states}
        assert len(pids) == 3  # three toolkit contexts in three processes
        for st in states:
            (out,) = stage.run({"x": x}, state=st)  # type: ignore[call-arg]
            assert _cosine(out, want) >= 0.999
        stats = stage.rknn.statistics()  # type: ignore[attr-defined]
        assert stats.core_masks == (1, 2, 4) and stats.contexts_started == 2
        for st in states:
            stage.close_worker_state(st)  # type: ignore[attr-defined]
        assert all(not st.proc.alive for st in states[1:])
    finally:
        stage.close()


def test_a_core_mask_is_passed_as_given(twin_root: Path) -> None:
    backend = RknnBackend()
    dev = _npu(twin_root, "npu:0-2")
    assert len(backend.worker_cpus(dev)) == 1
    stage = backend.compile(conv_net(seed=5), dev, name="s")
    try:
        st = stage.worker_state(WorkerInfo("npu:0-2", 0, ()))  # type: ignore[attr-defined]
        assert stage.rknn.statistics().core_masks == (7,)  # type: ignore[attr-defined]
        stage.close_worker_state(st)  # type: ignore[attr-defined]
    finally:
        stage.close()


def test_opset9_dropout_stage_converts_after_preparation(twin_root: Path) -> None:
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Dropout", ["r"], ["d"], ratio=0.3),
         helper.make_node("Sigmoid", ["d"], ["y"])], "d9",
        [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])], [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])]),
        opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 4
    stage = RknnBackend().compile(m, _npu(twin_root, "npu:1"), name="d9")
    try:
        x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
        (out,) = stage.run({"x": x})
        np.testing.assert_allclose(out, _reference(m, {"x": x})[0], atol=2e-3)
    finally:
        stage.close()


def test_a_refused_stage_raises_the_toolkits_message_and_the_refusal_is_cached(twin_root: Path) -> None:
    m = helper.make_model(helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])], "nms",
        [helper.make_tensor_value_info("boxes", F, [1, 16, 4]), helper.make_tensor_value_info("scores", F, [1, 1, 16])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    backend = RknnBackend()
    dev = _npu(twin_root, "npu:2")
    with pytest.raises(CompileError) as first:
        backend.compile(m, dev, name="nms")
    assert str(first.value).startswith("npu:2: ") and len(str(first.value)) > len("npu:2: ") + 10
    converted = backend.statistics()
    t0 = time.perf_counter()
    with pytest.raises(CompileError) as again:
        backend.compile(m, dev, name="nms")
    assert time.perf_counter() - t0 < 1.0  # no process started, nothing converted
    # the same words, saying they come from the cache and naming its verdict file (issue 23)
    assert str(again.value).endswith(str(first.value).removeprefix("npu:2: "))
    assert "a cached refusal" in str(again.value) and ".json" in str(again.value)
    s = backend.statistics()
    assert (s.conversions, s.cache_hits, s.refusals_cached) == (converted.conversions, 1, 1)


def test_other_workers_contexts_build_in_the_background_at_compile(twin_root: Path) -> None:
    backend = RknnBackend()
    stage = backend.compile(conv_net(seed=6), _npu(twin_root), name="s")
    try:
        deadline = time.monotonic() + 120
        while stage.rknn.statistics().contexts_started < 2 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.05)
        assert stage.rknn.statistics().contexts_started == 2  # type: ignore[attr-defined]  # before any request
        states = [stage.worker_state(WorkerInfo("npu", i, ())) for i in range(3)]  # type: ignore[attr-defined]
        assert len({st.proc.pid for st in states}) == 3
        stats = stage.rknn.statistics()  # type: ignore[attr-defined]
        assert stats.core_masks == (1, 2, 4) and stats.contexts_started == 2  # taken, not built again
        for st in states:
            stage.close_worker_state(st)  # type: ignore[attr-defined]
    finally:
        stage.close()


def test_a_refusal_trial_starts_no_background_contexts(twin_root: Path) -> None:
    # The session compiles units alone with options["trial"] to find what a device refuses and
    # closes them at once: other workers' contexts would only be started to be killed.
    backend = RknnBackend()
    asked: list[int] = []
    acquire = backend._processes.acquire

    def recording(device: str, index: int) -> Any:
        asked.append(index)  # recorded before the (slow) process start
        return acquire(device, index)

    backend._processes.acquire = recording  # type: ignore[method-assign]
    dev = _npu(twin_root)
    for options, want in (({**dev.options, "trial": True}, [0]), (dev.options, [0, 1, 2])):
        asked.clear()
        stage = backend.compile(conv_net(seed=6), dataclasses.replace(dev, options=options), name="s")
        try:
            deadline = time.monotonic() + 5
            while sorted(asked) != want and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # room for a background start that should not happen
            assert sorted(asked) == want
        finally:
            stage.close()


def test_a_stage_closed_at_once_reaps_its_background_contexts(twin_root: Path) -> None:
    backend = RknnBackend()
    started: list = []
    acquire = backend._processes.acquire

    def recording(device: str, index: int) -> Any:
        proc = acquire(device, index)
        started.append(proc)
        return proc

    backend._processes.acquire = recording  # type: ignore[method-assign]
    threads = set(threading.enumerate())
    stage = backend.compile(conv_net(seed=7), _npu(twin_root), name="s")
    stage.close()
    assert set(threading.enumerate()) - threads == set()
    assert started and all(not p.alive and p._proc.poll() is not None for p in started)  # stopped and reaped
    assert backend._processes._procs == {}


def test_a_cache_hit_reuses_the_measured_accuracy(twin_root: Path, tmp_path: Path) -> None:
    backend = RknnBackend()
    model = conv_net(seed=8)
    dev = _npu(twin_root, "npu:1", cache_dir=str(tmp_path))
    first = backend.compile(model, dev, name="s")
    measured = first.rknn.statistics()  # type: ignore[attr-defined]
    first.close()
    # the compile-time probe run (issue 24), then the accuracy samples
    assert measured.accuracy is not None and measured.runs == 1 + RANDOM_SAMPLES and not measured.cached
    again = backend.compile(model, dev, name="s")
    hit = again.rknn.statistics()  # type: ignore[attr-defined]
    again.close()
    # a verified cache hit of a stage whose verdict says it passed its probe run: no probe run
    # again (a cached open pays the simulator's rebuild only), the accuracy is not measured again
    assert hit.cached and hit.accuracy == measured.accuracy and hit.runs == 0
    assert again.rknn.proven  # type: ignore[attr-defined]
    (verdict,) = tmp_path.rglob("*.json")
    data = json.loads(verdict.read_text())
    assert data["accuracy"]["probe_passed"] is True
    del data["accuracy"]  # an entry written before accuracies were kept: measured again, then kept
    verdict.write_text(json.dumps(data))
    old = backend.compile(model, dev, name="s")
    remeasured = old.rknn.statistics()  # type: ignore[attr-defined]
    old.close()
    assert remeasured.runs == 1 + RANDOM_SAMPLES and remeasured.accuracy == measured.accuracy
    assert json.loads(verdict.read_text())["accuracy"]["probe_passed"] is True
