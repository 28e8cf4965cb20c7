"""Boards as roots: device specs on every twin profile's tree, default devices, DLA cores, errors."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hetsched import DeviceSpecError, Session, resolve_devices
from hetsched._devices.resolve import board_device_notes
from hetsched._twin.profiles import get_profile, known_socs
from hetsched.backends import get_backend
from hetsched.backends.sim import clock_from_root, twin_devices
from hetsched.testing import build_board_tree, with_seeded_weights

pytestmark = pytest.mark.anyio

# NVIDIA's module data (docs/sources.md [orin-dla]): AGX and NX 16GB two DLA cores, Nano none.
DLA_CORES = {"rk3588": 0, "orin-nx": 2, "orin-agx": 2, "orin-nano": 0}
CLUSTERS = {"rk3588": ["cluster0", "cluster4", "cluster6"], "orin-nx": ["cluster0", "cluster4"],
            "orin-agx": ["cluster0", "cluster4", "cluster8"], "orin-nano": ["cluster0", "cluster4"]}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {soc: build_board_tree(tmp_path_factory.mktemp(soc), soc) for soc in known_socs()}


@pytest.fixture
def no_toolkit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(tmp_path / "no-such-python"))


@pytest.fixture
def toolkit_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # the resolver only asks whether the environment exists; nothing here compiles for the NPU
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", sys.executable)


def _names(specs: object, root: Path) -> list[str]:
    return [d.name for d in resolve_devices(specs, root=root)]  # type: ignore[arg-type]


def test_every_profile_is_covered() -> None:
    assert set(DLA_CORES) == set(known_socs())


@pytest.fixture
def mali_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an RK3588 where ncnn finds the Mali through a hardware Vulkan driver."""
    import hetsched.backends._ncnn_devices as ncnn_devices

    monkeypatch.setattr(ncnn_devices, "hardware_reason", lambda: None)


@pytest.fixture
def no_mali(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an RK3588 without ncnn or a Vulkan driver for the Mali (every real board today)."""
    import hetsched.backends._ncnn_devices as ncnn_devices

    monkeypatch.setattr(ncnn_devices, "hardware_reason", lambda: "ncnn is not installed (pip install 'hetsched[ncnn]')")


@pytest.mark.parametrize("soc", sorted(DLA_CORES))
def test_default_devices_are_the_boards(roots: dict[str, Path], soc: str, toolkit_found: None, mali_runs: None) -> None:
    devices = resolve_devices(None, root=roots[soc])
    dla = [f"dla:{i}" for i in range(DLA_CORES[soc])]
    npu = ["npu"] if soc == "rk3588" else []
    assert [d.name for d in devices] == [*CLUSTERS[soc], "gpu", *npu, *dla]
    by_name = {d.name: d for d in devices}
    for name in CLUSTERS[soc]:
        assert (by_name[name].kind, by_name[name].backend) == ("cpu", "sim")
    assert (by_name["gpu"].kind, by_name["gpu"].backend) == ("gpu", "sim")
    if npu:
        assert (by_name["npu"].kind, by_name["npu"].backend) == ("npu", "rknn")
    for name in dla:
        assert (by_name[name].kind, by_name[name].backend, by_name[name].options["op_set"]) == ("dla", "sim", "dla")
    assert board_device_notes(roots[soc]) == []


def test_a_mali_without_a_backend_is_no_default_and_noted(roots: dict[str, Path], toolkit_found: None,
                                                         no_mali: None, caplog: pytest.LogCaptureFixture) -> None:
    # A real RK3588's Mali runs only through ncnn on a hardware Vulkan driver: without one, the
    # twin's default devices are those the real board could run (issue 24: plans put whole
    # models on a GPU the board cannot use).
    with caplog.at_level(logging.WARNING, logger="hetsched.devices"):
        assert _names(None, roots["rk3588"]) == [*CLUSTERS["rk3588"], "npu"]
    (note,) = board_device_notes(roots["rk3588"])
    assert note.startswith("gpu: left out of the rk3588") and "hetsched[ncnn]" in note
    assert note in caplog.text
    # named, the twin's GPU is still there; the Orin's GPU (TensorRT on the real board) stays a default
    assert _names(["gpu"], roots["rk3588"]) == ["gpu"]
    assert "gpu" in _names(None, roots["orin-nx"]) and board_device_notes(roots["orin-nx"]) == []


def test_without_the_toolkit_the_npu_is_left_out_and_noted(roots: dict[str, Path], no_toolkit: None, mali_runs: None,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hetsched.devices"):
        assert _names(None, roots["rk3588"]) == [*CLUSTERS["rk3588"], "gpu"]
    (note,) = board_device_notes(roots["rk3588"])
    assert note.startswith("npu: left out") and "hetsched setup rknn" in note
    assert note in caplog.text
    # asked for by name, the NPU is still the RKNN backend's (its compile then says what is missing)
    (npu,) = resolve_devices(["npu"], root=roots["rk3588"])
    assert npu.backend == "rknn"
    assert board_device_notes(roots["orin-nx"]) == [] and board_device_notes("/") == []


@pytest.mark.parametrize(("soc", "big", "little"), [
    ("rk3588", ["cluster4", "cluster6"], ["cluster0"]),
    # Orin's clusters are all alike: each is both big and little
    ("orin-nx", ["cluster0", "cluster4"], ["cluster0", "cluster4"]),
    ("orin-agx", ["cluster0", "cluster4", "cluster8"], ["cluster0", "cluster4", "cluster8"]),
    ("orin-nano", ["cluster0", "cluster4"], ["cluster0", "cluster4"]),
])
def test_cpu_specs_pick_the_boards_clusters(roots: dict[str, Path], soc: str, big: list[str],
                                             little: list[str]) -> None:
    root = roots[soc]
    assert _names(["big"], root) == big
    assert _names(["little"], root) == little
    assert _names(["clusters"], root) == CLUSTERS[soc] == _names(["cpu"], root)
    assert _names([CLUSTERS[soc][-1]], root) == [CLUSTERS[soc][-1]]
    with pytest.raises(DeviceSpecError, match="no such device") as e:
        resolve_devices(["mid"], root=root)
    assert "big" in str(e.value) and CLUSTERS[soc][0] in str(e.value)
    # the twin's clusters run on cores this process has, one each
    for d in resolve_devices(None, root=root, available_cpus=[0]):
        assert d.cpus in ((0,), ())


@pytest.mark.parametrize("soc", sorted(DLA_CORES))
def test_accelerator_specs(roots: dict[str, Path], soc: str, toolkit_found: None) -> None:
    root = roots[soc]
    assert _names(["gpu"], root) == ["gpu"] == _names(["gpu:0"], root)
    if soc == "rk3588":
        for spec in ("npu", "npu:0", "npu:1", "npu:2", "npu:0-1", "npu:0-2"):
            (d,) = resolve_devices([spec], root=root)
            assert (d.name, d.backend) == (spec, "rknn")
    else:
        with pytest.raises(DeviceSpecError) as e:
            resolve_devices(["npu"], root=root)
        assert "no NPU found under" in str(e.value) and f"the {soc} board's specs" in str(e.value)
        assert "gpu" in str(e.value)
    for i in range(2):
        if i < DLA_CORES[soc]:
            (d,) = resolve_devices([f"dla:{i}"], root=root)
            assert (d.name, d.kind, d.domain) == (f"dla:{i}", "dla", f"dla{i}")
            assert _names([f"dla{i}"], root) == [f"dla:{i}"]  # the twin's domain name
        else:
            with pytest.raises(DeviceSpecError, match=rf"'dla:{i}'.*the {soc} board under .* has no such device") as e:
                resolve_devices([f"dla:{i}"], root=root)
            assert "gpu:0" in str(e.value) and CLUSTERS[soc][0] in str(e.value)
    with pytest.raises(DeviceSpecError, match="duplicate"):
        resolve_devices(["gpu", "gpu:0"], root=root)


def test_an_unknown_spec_lists_what_the_board_has(roots: dict[str, Path], toolkit_found: None) -> None:
    with pytest.raises(DeviceSpecError) as e:
        resolve_devices(["tpu"], root=roots["orin-agx"])
    msg = str(e.value)
    assert "'tpu'" in msg and "orin-agx" in msg
    for spec in ("big", "gpu", "dla:0", "dla:1", "cluster8"):
        assert spec in msg
    assert "npu" not in msg
    with pytest.raises(DeviceSpecError) as e:
        resolve_devices(["dla:0"], root=roots["rk3588"])
    assert "npu:0-2" in str(e.value) and "dla" not in str(e.value).split("specs:")[1]


def test_cpu_lists_stay_the_hosts_cores_on_a_board_root(roots: dict[str, Path]) -> None:
    (d,) = resolve_devices(["cpu:0"], root=roots["rk3588"], available_cpus=[0])
    assert (d.name, d.backend, d.cpus, d.domain) == ("cpu:0", "cpu", (0,), "cluster0")


@pytest.mark.parametrize("spec", ["gpu", "gpu:0", "dla", "dla:0", "dla:1"])
def test_gpu_and_dla_off_a_jetson_are_refused(tmp_path: Path, spec: str) -> None:
    for root in ("/", tmp_path):  # the host, and a tree that names no SoC: never a simulator
        with pytest.raises(DeviceSpecError, match="no Jetson Orin under") as e:
            resolve_devices([spec], root=root)
        assert repr(spec) in str(e.value)


def test_twin_cluster_roles_rank_the_profile() -> None:
    roles = {d.name: (d.options["role"], d.options["core"]) for d in twin_devices("rk3588") if d.kind == "cpu"}
    assert roles == {"cluster0": ("little", "Cortex-A55"), "cluster4": ("big", "Cortex-A76"),
                     "cluster6": ("big", "Cortex-A76")}
    assert {d.options["role"] for d in twin_devices("orin-nano") if d.kind == "cpu"} == {"cpu"}


@pytest.mark.parametrize("soc", sorted(DLA_CORES))
def test_dla_engines_in_the_profiles(soc: str) -> None:
    prof = get_profile(soc)
    assert [e.name for e in prof.engines] == [f"dla{i}" for i in range(DLA_CORES[soc])]
    # device-only: physics and governors never see them (the profile's data is checked, not its type)
    assert all(d.kind != "dla" for d in prof.domains)  # type: ignore[comparison-overlap]
    if prof.engines:
        gpu = prof.domain("gpu")
        dla = prof.engines[0]
        # [orin-dla]: one DLA core is about a third of the GPU at their top clocks (published TOPS split)
        assert 0.2 < dla.ops_per_cycle * dla.max_hz / (gpu.ops_per_cycle * gpu.max_hz) < 0.45
        assert dla.full_power_w(dla.max_hz) > 0


def _conv() -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 3, 3],
                           np.random.default_rng(0).standard_normal(16 * 8 * 9).astype(np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_dla_runs_at_the_trees_engine_clock(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "orin-nx")
    rate = root / "sys/kernel/debug/clk/dla1_core/clk_rate"
    top = get_profile("orin-nx").engines[1].max_hz
    assert int(rate.read_text()) == top and clock_from_root(str(root))("dla1") == top
    (dev,) = resolve_devices(["dla:1"], root=root)
    stage = get_backend("sim").compile(_conv(), dev, name="s")
    t_top, e_top = stage.modelled()  # type: ignore[attr-defined]
    rate.chmod(0o600)
    rate.write_text(f"{top // 2}\n")
    t_half, _ = stage.modelled()  # type: ignore[attr-defined]
    assert t_half == pytest.approx(2 * t_top) and e_top > 0  # a compute-bound conv follows the clock
    x = np.random.default_rng(1).standard_normal([1, 8, 32, 32]).astype(np.float32)
    (ref,) = ort.InferenceSession(_conv().SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(stage.run({"x": x})[0], ref, rtol=1e-5, atol=1e-5)
    stage.close()


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
async def test_a_session_on_a_twin_root_opens_with_the_boards_devices(roots: dict[str, Path], soc: str,
                                                                       no_toolkit: None) -> None:
    model = with_seeded_weights("light_squeezenet")
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    x = np.random.default_rng(2).standard_normal([d.dim_value for d in inp.type.tensor_type.shape.dim])
    feeds = {inp.name: x.astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    async with Session(model, root=roots[soc]) as s:
        names = [d.name for d in s.devices]
        assert names == _names(None, roots[soc])
        assert {st.device for st in s.plan.stages} <= set(names)
        out = await s.run(None, feeds)
        modelled = [x for x in s.stage_statistics().values() if x is not None and hasattr(x, "modelled_time_s")]
        assert modelled and all(m.runs == 1 and m.modelled_time_s > 0 for m in modelled)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-5)


def test_a_board_roots_simulated_devices_are_injected(roots: dict[str, Path]) -> None:
    """Device resolution gets a board root's devices from whoever it is given (by default the
    twin's, through ``_estimators``): it never builds them itself (issue 25)."""
    from hetsched._devices.board import board_root
    from hetsched._platform._fs import SysfsRoot
    from hetsched.backends import Device

    asked: list[tuple[str, str, tuple[int, ...] | None]] = []

    def twins(soc: str, root: str, host: tuple[int, ...] | None) -> list[Device]:
        asked.append((soc, root, host))
        return [Device(name="cluster0", kind="cpu", cpus=(0,), options={"role": "cpu"})]

    board = board_root(SysfsRoot(roots["orin-nx"]), host=(0,), twins=twins)
    assert board is not None and [d.name for d in board.clusters] == ["cluster0"]
    assert asked == [("orin-nx", str(roots["orin-nx"]), (0,))]
    default = board_root(SysfsRoot(roots["orin-nx"]), host=(0,))
    assert default is not None and [d.name for d in default.clusters] == CLUSTERS["orin-nx"]
