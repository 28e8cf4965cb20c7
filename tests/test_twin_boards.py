"""hetsched.testing.build_board_tree: every board and variant, laid out as docs/twin-sysfs.md describes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsched import UnknownSocError
from hetsched.testing import BOARD_SOCS, build_board_tree

CASES = [("rk3588", None), ("rk3588", "mainline"), ("orin-nx", None), ("orin-nx", "jp5"),
         ("orin-agx", "jp6"), ("orin-agx", "jp5"), ("orin-nano", "jp6"), ("orin-nano", "jp5")]  # fmt: skip


def _symlinks_stay_inside(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                assert target.is_relative_to(root.resolve()), p
                assert target.exists(), p


@pytest.mark.parametrize(("soc", "variant"), CASES)
def test_every_board_tree_is_complete_and_self_contained(tmp_path: Path, soc: str, variant: str | None) -> None:
    root = build_board_tree(tmp_path, soc, variant=variant)
    _symlinks_stay_inside(root)
    cpu = root / "sys/devices/system/cpu"
    n = {"rk3588": 8, "orin-nx": 8, "orin-agx": 12, "orin-nano": 6}[soc]
    assert (cpu / "online").read_text() == f"0-{n - 1}\n"
    for c in range(n):
        freqs = (cpu / f"cpu{c}/cpufreq/scaling_available_frequencies").read_text()
        assert freqs.endswith(" \n")
        cur = int((cpu / f"cpu{c}/cpufreq/scaling_cur_freq").read_text())
        assert str(cur) in freqs.split()
    for z in (root / "sys/class/thermal").glob("thermal_zone*"):
        assert (z / "type").read_text().strip()
    if soc == "rk3588":
        names = [(root / f"sys/class/thermal/thermal_zone{i}/type").read_text().strip() for i in range(7)]
        first = "package-thermal" if variant == "mainline" else "soc-thermal"
        assert names[0] == first
        assert (root / "sys/class/devfreq/fdab0000.npu/load").read_text() == "0@1000000000Hz\n"
        assert not (root / "sys/bus/i2c/drivers/ina3221").exists()
    else:
        jp = variant or "jp6"
        gpu = "17000000.gpu" if jp == "jp6" else "17000000.ga10b"
        df = root / "sys/class/devfreq" / gpu
        assert (df / "device/load").read_text() == "0\n"
        assert (root / ("sys/devices/platform/gpu.0" if jp == "jp6" else "sys/devices/gpu.0") / "load").is_file()
        hw = next((root / "sys/bus/i2c/devices/1-0040/hwmon").iterdir())
        labels = [(hw / f"in{i}_label").read_text().strip() for i in (1, 2, 3)]
        if soc == "orin-agx":
            assert labels == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"]
            assert (root / "sys/kernel/debug/clk/dla0_core/clk_rate").is_file()
        else:
            assert labels == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
            vdd_in = int((hw / "in1_input").read_text()) * int((hw / "curr1_input").read_text()) / 1e6
            assert 3.3 <= vdd_in <= 5.8  # published idle VDD_IN range
        assert (root / "etc/nvpmodel.conf").resolve().name.startswith("nvpmodel_p37")
        assert "PM_CONFIG DEFAULT=" in (root / "etc/nvpmodel.conf").read_text()


def test_rk3588_fixture_values(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "rk3588")
    pol = root / "sys/devices/system/cpu/cpufreq/policy6"
    assert (pol / "related_cpus").read_text() == "6 7 \n"
    assert (pol / "scaling_governor").read_text() == "ondemand\n"
    assert (pol / "cpuinfo_transition_latency").read_text() == "40000\n"
    assert (root / "sys/devices/system/cpu/cpu6/cpufreq").resolve() == pol.resolve()
    z0 = root / "sys/class/thermal/thermal_zone0"
    assert (z0 / "policy").read_text() == "power_allocator\n"
    assert (z0 / "sustainable_power").read_text() == "2100\n"
    assert [(z0 / f"trip_point_{i}_temp").read_text() for i in range(3)] == ["75000\n", "85000\n", "115000\n"]
    cd = [(root / f"sys/class/thermal/cooling_device{i}/type").read_text().strip() for i in range(4)]
    assert cd == ["cpufreq-cpu0", "cpufreq-cpu4", "cpufreq-cpu6", "devfreq-fb000000.gpu"]
    assert "CPU part\t: 0xd0b" in (root / "proc/cpuinfo").read_text()
    psy = root / "sys/class/power_supply/tcpm-source-psy-4-0022"
    assert (psy / "voltage_now").read_text() == "20000000\n"


def test_unknown_board_or_variant(tmp_path: Path) -> None:
    assert set(BOARD_SOCS) == {"rk3588", "orin-nx", "orin-agx", "orin-nano"}
    with pytest.raises(UnknownSocError, match="orin-nx"):
        build_board_tree(tmp_path, "jetson-tx2")
    with pytest.raises(UnknownSocError, match="jp5"):
        build_board_tree(tmp_path, "orin-nx", variant="mainline")
