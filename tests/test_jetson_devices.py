"""GPU and DLA device specs on a real Jetson Orin root (not a twin's tree), and on a twin's (unchanged).

A real board is the host's ``/``; here a board tree is read through a SysfsRoot that says it is
the host's root, which is all that tells a real board from a twin's tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsched import DeviceSpecError, resolve_devices
from hetsched._devices.jetson import default_host_specs, dla_core_count, jetson_device_notes
from hetsched._platform import devfreq
from hetsched._platform._fs import SysfsRoot
from hetsched.testing import build_board_tree


class RealBoardRoot(SysfsRoot):
    """A board's tree read as the host's ``/``: what the resolver sees on a real Orin."""

    __slots__ = ()

    @property
    def is_host_root(self) -> bool:
        return True


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {soc: build_board_tree(tmp_path_factory.mktemp(soc), soc) for soc in ("orin-agx", "orin-nano", "rk3588")}


def _minimal_orin(root: Path, module: str, nvdla: tuple[int, ...]) -> Path:
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/compatible").write_bytes(f"nvidia,{module}\0nvidia,tegra234\0".encode())
    (root / "etc").mkdir()
    (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.3\n")
    for n in nvdla:
        (root / f"sys/bus/platform/devices/158{8 + 4 * n:x}0000.nvdla{n}").mkdir(parents=True)
    return root


def test_gpu_and_dla_on_a_real_orin_are_tensorrt_devices(trees: dict[str, Path]) -> None:
    fs = RealBoardRoot(trees["orin-agx"])
    gpu, dla0 = resolve_devices(["gpu", "dla:0"], root=fs)
    assert (gpu.name, gpu.kind, gpu.backend, gpu.domain, gpu.cpus) == ("gpu", "gpu", "tensorrt", "gpu", ())
    assert (dla0.name, dla0.kind, dla0.backend, dla0.domain) == ("dla:0", "dla", "tensorrt", "dla0")
    assert dla0.options["dla_core"] == 0 and "dla_core" not in gpu.options
    assert gpu.options["soc"] == "orin-agx" and gpu.memory_domain == "host"
    (node,) = [d for d in devfreq.read_devices(fs) if d.kind == "gpu"]
    assert node.max_hz is not None and gpu.max_freq_khz == node.max_hz // 1000
    assert 0 < dla0.peak_flops < gpu.peak_flops
    (same,) = resolve_devices(["gpu:0"], root=fs)
    assert same == gpu


def test_every_dla_core_and_the_onnxruntime_variants(trees: dict[str, Path]) -> None:
    fs = RealBoardRoot(trees["orin-agx"])
    assert [(d.name, d.options["dla_core"]) for d in resolve_devices(["dla"], root=fs)] == [("dla:0", 0), ("dla:1", 1)]
    devices = resolve_devices(["gpu:ort", "dla:1:ort", "gpu"], root=fs)
    assert [(d.name, d.kind, d.backend) for d in devices] == [
        ("gpu:ort", "gpu", "ort-gpu"), ("dla:1:ort", "dla", "ort-gpu"), ("gpu", "gpu", "tensorrt")]
    assert devices[1].options["dla_core"] == 1


@pytest.mark.parametrize("spec", ["dla:2", "dla:7:ort"])
def test_a_dla_core_beyond_the_boards_is_refused_with_what_it_has(trees: dict[str, Path], spec: str) -> None:
    with pytest.raises(DeviceSpecError) as e:
        resolve_devices([spec], root=RealBoardRoot(trees["orin-agx"]))
    msg = str(e.value)
    assert repr(spec) in msg and "2 DLA cores (dla:0, dla:1)" in msg and "dla:1:ort" in msg


def test_orin_nano_has_a_gpu_and_no_dla(trees: dict[str, Path]) -> None:
    fs = RealBoardRoot(trees["orin-nano"])
    (gpu,) = resolve_devices(["gpu"], root=fs)
    assert (gpu.backend, gpu.options["soc"]) == ("tensorrt", "orin-nano")
    for spec in ("dla", "dla:0"):
        with pytest.raises(DeviceSpecError, match="has 0 DLA cores; its specs: gpu, gpu:0, gpu:ort") as e:
            resolve_devices([spec], root=fs)
        assert "dla:0" not in str(e.value).split("specs:")[1]


def test_the_orin_has_one_gpu(trees: dict[str, Path]) -> None:
    with pytest.raises(DeviceSpecError, match=r"'gpu:1': the orin-agx board has one GPU \(gpu:0\)"):
        resolve_devices(["gpu:1"], root=RealBoardRoot(trees["orin-agx"]))


@pytest.mark.parametrize("spec", ["gpu:x", "dla:", "gpu:0:trt", "dla:0:ort:1"])
def test_malformed_gpu_specs(trees: dict[str, Path], spec: str) -> None:
    with pytest.raises(DeviceSpecError, match=rf"{spec!r}: expected gpu, gpu:0, dla, dla:N"):
        resolve_devices([spec], root=RealBoardRoot(trees["orin-agx"]))


def test_dla_cores_are_counted_from_the_platform_devices(tmp_path: Path) -> None:
    # an Orin NX 8GB (p3767-0001) has one DLA core: the platform devices say so, not the module table
    fs = RealBoardRoot(_minimal_orin(tmp_path / "nx8", "p3767-0001", nvdla=(0,)))
    assert dla_core_count(fs, "orin-nx") == 1
    assert [d.name for d in resolve_devices(["dla"], root=fs)] == ["dla:0"]
    with pytest.raises(DeviceSpecError, match=r"has 1 DLA core \(dla:0\)"):
        resolve_devices(["dla:1"], root=fs)
    (gpu,) = resolve_devices(["gpu"], root=fs)
    assert gpu.max_freq_khz is None  # no devfreq node: a prior clock, no maximum claimed


def test_without_evidence_the_module_table_counts_dla_cores(tmp_path: Path) -> None:
    fs = RealBoardRoot(_minimal_orin(tmp_path / "nx16", "p3767-0000", nvdla=()))
    assert [d.name for d in resolve_devices(["dla"], root=fs)] == ["dla:0", "dla:1"]


def test_the_rk3588_gpu_is_the_mali_through_ncnn_only_when_ncnn_finds_a_gpu(
        trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import hetsched.backends._ncnn_devices as nd

    monkeypatch.setattr(nd, "hardware_reason", lambda: "ncnn finds only a software Vulkan device (llvmpipe)")
    with pytest.raises(DeviceSpecError, match="runs through ncnn, which cannot run here: ncnn finds only a software"):
        resolve_devices(["gpu"], root=RealBoardRoot(trees["rk3588"]))
    with pytest.raises(DeviceSpecError, match="no DLA"):
        resolve_devices(["dla"], root=RealBoardRoot(trees["rk3588"]))


def test_a_twin_root_keeps_its_simulated_devices(trees: dict[str, Path]) -> None:
    gpu, dla0 = resolve_devices(["gpu", "dla:0"], root=trees["orin-agx"])
    assert [(d.kind, d.backend) for d in (gpu, dla0)] == [("gpu", "sim"), ("dla", "sim")]
    with pytest.raises(DeviceSpecError, match="has no such device"):
        resolve_devices(["gpu:ort"], root=trees["orin-agx"])


def test_big_on_a_real_orin_is_every_cluster(trees: dict[str, Path]) -> None:
    # an Orin's clusters are all alike (Cortex-A78AE): each is both big and little, as on a twin's root
    fs = RealBoardRoot(trees["orin-agx"])
    devices = resolve_devices(["big", "gpu", "dla:0"], root=fs, available_cpus=range(12))
    assert [(d.kind, d.backend) for d in devices] == [("cpu", "cpu")] * 3 + [("gpu", "tensorrt"), ("dla", "tensorrt")]
    assert sorted(c for d in devices for c in d.cpus) == list(range(12))
    assert resolve_devices(["little"], root=fs, available_cpus=range(12)) == devices[:3]


def test_a_real_orins_default_devices_include_the_gpu_and_dla_when_tensorrt_runs(trees: dict[str, Path]) -> None:
    fs = RealBoardRoot(trees["orin-agx"])
    assert default_host_specs(fs, reason=lambda: None) == ["clusters", "gpu", "dla"]
    assert jetson_device_notes(fs, reason=lambda: None) == []
    specs = default_host_specs(fs, reason=lambda: None)
    devices = resolve_devices(specs, root=fs, available_cpus=range(12))
    assert [d.name for d in devices if d.backend == "tensorrt"] == ["gpu", "dla:0", "dla:1"]
    nano = RealBoardRoot(trees["orin-nano"])
    assert default_host_specs(nano, reason=lambda: None) == ["clusters", "gpu"]  # no DLA on an Orin Nano


def test_without_tensorrt_the_gpu_and_dla_are_left_out_with_a_note(
        trees: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    fs = RealBoardRoot(trees["orin-agx"])
    why = "the tensorrt backend needs TensorRT's Python bindings (module 'tensorrt'), which are not installed"
    with caplog.at_level("WARNING", logger="hetsched.devices"):
        assert default_host_specs(fs, reason=lambda: why) == ["clusters"]
    (note,) = jetson_device_notes(fs, reason=lambda: why)
    assert note == f"gpu and the DLA cores (dla): left out of the orin-agx board's default devices: {why}"
    assert note in caplog.text
    nano = RealBoardRoot(trees["orin-nano"])
    assert jetson_device_notes(nano, reason=lambda: why)[0].startswith("gpu: left out of the orin-nano")


def test_default_specs_elsewhere_are_the_clusters(trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import hetsched.backends._ncnn_devices as nd

    monkeypatch.setattr(nd, "hardware_reason", lambda: "no Vulkan device")  # the RK3588's Mali: no ncnn GPU
    assert default_host_specs(RealBoardRoot(trees["rk3588"]), reason=lambda: None) == ["clusters"]
    assert default_host_specs(SysfsRoot(trees["orin-agx"]), reason=lambda: None) == ["clusters"]  # a twin's tree
    assert jetson_device_notes(SysfsRoot(trees["orin-agx"]), reason=lambda: "x") == []
