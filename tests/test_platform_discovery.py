"""Readers, writers and discovery on small reference trees and on every twin board profile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hetsched._errors import GovernorError, UnsupportedFrequencyError, UnsupportedGovernorError
from hetsched._platform import SysfsRoot, cpufreq, devfreq, discover, jetson, power, rknpu, thermal

from _platform_trees import Link, orin_nx_tree, rk3588_tree, write_tree

# -- readers on reference trees ---------------------------------------------------


@pytest.fixture
def rk(tmp_path: Path) -> SysfsRoot:
    return SysfsRoot(write_tree(tmp_path / "rk", rk3588_tree()))


@pytest.fixture
def nx(tmp_path: Path) -> SysfsRoot:
    return SysfsRoot(write_tree(tmp_path / "nx", orin_nx_tree()))


def test_rk3588_policies(rk: SysfsRoot) -> None:
    pols = cpufreq.read_policies(rk)
    assert [(p.policy, p.cpus) for p in pols] == [(0, (0, 1, 2, 3)), (4, (4, 5)), (6, (6, 7))]
    little, big0, _ = pols
    assert little.available_khz[-1] == 1800000 and big0.available_khz[-1] == 2256000
    assert little.governor == "ondemand" and "userspace" in little.governors
    assert little.transition_latency_ns == 40000 and little.driver == "cpufreq-dt"
    assert (little.cpu_part, big0.cpu_part) == ("cortex-a55", "cortex-a76")
    # no cpu_capacity file: computed like the kernel from dmips/MHz x max freq
    assert big0.capacity == 1024 and little.capacity == round(1024 * 530 * 1800000 / (1024 * 2256000))


def test_policies_without_policy_dirs(tmp_path: Path) -> None:
    # jtop's fake tree: cpuN/cpufreq are real directories, no policyN, no related_cpus
    tree: dict[str, str | bytes | Link] = {}
    for n in range(4):
        d = f"sys/devices/system/cpu/cpu{n}/cpufreq"
        tree[f"{d}/scaling_governor"] = "test_cpu"
        tree[f"{d}/scaling_max_freq"] = "2035200"
        tree[f"{d}/scaling_cur_freq"] = "200000"
    fs = SysfsRoot(write_tree(tmp_path, tree))
    pols = cpufreq.read_policies(fs)
    assert [p.cpus for p in pols] == [(0,), (1,), (2,), (3,)]
    assert pols[0].cur_khz == 200000 and pols[0].governor == "test_cpu"


def test_cpufreq_writes_validate(rk: SysfsRoot) -> None:
    pol = cpufreq.read_policies(rk)[1]
    cpufreq.set_max_khz(rk, pol, 2208000)
    assert rk.read_int(f"{pol.path}/scaling_max_freq") == 2208000
    with pytest.raises(UnsupportedFrequencyError, match=r"2400000 kHz .* available: 408000"):
        cpufreq.set_max_khz(rk, pol, 2400000)
    assert rk.read_int(f"{pol.path}/scaling_max_freq") == 2208000
    with pytest.raises(UnsupportedGovernorError, match="turbo"):
        cpufreq.set_governor(rk, pol, "turbo")
    with pytest.raises(GovernorError, match="userspace"):
        cpufreq.set_setspeed(rk, pol, 1608000)
    cpufreq.set_governor(rk, pol, "userspace")
    cpufreq.set_setspeed(rk, pol, 1608000)
    assert rk.read_int(f"{pol.path}/scaling_setspeed") == 1608000


def test_cpufreq_set_limits_order(rk: SysfsRoot) -> None:
    pol = cpufreq.read_policies(rk)[0]
    cpufreq.set_limits(rk, pol, 408000, 816000)
    cpufreq.set_limits(rk, pol, 1608000, 1800000)  # new min above old max: max written first
    assert (rk.read_int(f"{pol.path}/scaling_min_freq"), rk.read_int(f"{pol.path}/scaling_max_freq")) == (
        1608000,
        1800000,
    )
    with pytest.raises(UnsupportedFrequencyError, match="above max"):
        cpufreq.set_limits(rk, pol, 1800000, 408000)


def test_rk3588_devfreq(rk: SysfsRoot) -> None:
    devs = {d.name: d for d in devfreq.read_devices(rk)}
    assert set(devs) == {"dmc", "fb000000.gpu", "fdab0000.npu", "fdd90000.vop"}
    gpu = devs["fb000000.gpu"]
    assert gpu.kind == "gpu" and gpu.available_hz[0] == 300000000 and gpu.max_freq_hz == 1000000000
    assert gpu.path == "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu"
    assert gpu.device_path == "sys/devices/platform/fb000000.gpu" and gpu.has_load
    assert devs["fdab0000.npu"].kind == "npu" and devs["dmc"].kind == "memory"
    assert devs["fdd90000.vop"].kind == "other"


def test_devfreq_writes_and_userspace(rk: SysfsRoot, tmp_path: Path) -> None:
    gpu = next(d for d in devfreq.read_devices(rk) if d.kind == "gpu")
    devfreq.set_max_hz(rk, gpu, 800000000)
    assert rk.read_int(f"{gpu.path}/max_freq") == 800000000
    with pytest.raises(UnsupportedFrequencyError, match="850000000 Hz"):
        devfreq.set_min_hz(rk, gpu, 850000000)
    with pytest.raises(GovernorError, match="userspace"):
        devfreq.set_userspace_freq(rk, gpu, 800000000)
    with pytest.raises(UnsupportedGovernorError):
        devfreq.set_governor(rk, gpu, "nvhost_podgov")
    devfreq.set_governor(rk, gpu, "userspace")
    # the kernel creates userspace/set_freq when the governor switches; emulate that
    (tmp_path / "rk" / gpu.path / "userspace").mkdir()
    (tmp_path / "rk" / gpu.path / "userspace/set_freq").write_text("0\n")
    devfreq.set_userspace_freq(rk, gpu, 700000000)
    assert rk.read_int(f"{gpu.path}/userspace/set_freq") == 700000000


def test_rk3588_thermal(rk: SysfsRoot) -> None:
    zones = thermal.read_zones(rk)
    assert [z.type for z in zones][:2] == ["soc-thermal", "bigcore0-thermal"]
    soc = zones[0]
    assert soc.policy == "power_allocator" and soc.passive_trip_c == 75.0 and soc.critical_trip_c == 115.0
    assert [t.type for t in soc.trips] == ["passive", "passive", "critical"] and soc.trips[0].hyst_c == 2.0
    assert thermal.read_temp_c(rk, soc) == pytest.approx(44.384)
    assert zones[1].passive_trip_c is None and zones[1].critical_trip_c == 115.0


def test_rk3588_has_no_power_sensor(rk: SysfsRoot) -> None:
    # The USB-PD supply reports a contract (20 V x 1.5 A = 30 W), not a measurement: not a rail.
    assert power.read_rails(rk) == []


def test_rknpu_reader(rk: SysfsRoot) -> None:
    assert rknpu.find_npu_load_path(rk) == "sys/kernel/debug/rknpu/load"
    assert rknpu.read_npu_version(rk) == "0.9.8"


def test_orin_nx_ina3221_by_name(nx: SysfsRoot) -> None:
    rails = power.find_ina3221(nx)
    assert [r.name for r in rails] == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]  # in7 "sum of shunt voltages" skipped
    assert all(r.source == "measured" for r in rails) and rails[0].is_total
    assert power.read_rail_power_w(nx, rails[0]) == pytest.approx(5.048 * 0.957)


def test_ina3221_nc_channels_skipped(tmp_path: Path) -> None:
    h = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0041/hwmon/hwmon7"
    tree: dict[str, str | bytes | Link] = {
        "sys/bus/i2c/devices/1-0041": Link("../../../devices/platform/bus@0/c240000.i2c/i2c-1/1-0041"),
        "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0041/name": "ina3221\n",
        f"{h}/name": "ina3221\n",
        f"{h}/in1_label": "NC\n",
        f"{h}/in2_label": "VDDQ_VDD2_1V8AO\n",
        f"{h}/in3_label": "NC\n",
        f"{h}/in2_input": "1800\n",
        f"{h}/curr2_input": "100\n",
    }
    fs = SysfsRoot(write_tree(tmp_path, tree))
    rails = power.find_ina3221(fs)
    assert [r.name for r in rails] == ["VDDQ_VDD2_1V8AO"]
    assert power.read_rail_power_w(fs, rails[0]) == pytest.approx(0.18)


def test_rapl_zones(tmp_path: Path) -> None:
    z = "sys/devices/virtual/powercap/intel-rapl/intel-rapl:0"
    tree: dict[str, str | bytes | Link] = {
        "sys/class/powercap/intel-rapl:0": Link("../../devices/virtual/powercap/intel-rapl/intel-rapl:0"),
        f"{z}/name": "package-0\n",
        f"{z}/energy_uj": "123456\n",
        f"{z}/max_energy_range_uj": "262143328850\n",
    }
    rails = power.read_rapl_rails(SysfsRoot(write_tree(tmp_path, tree)))
    assert len(rails) == 1 and rails[0].name.startswith("package-0") and rails[0].max_energy_range_uj == 262143328850


def test_orin_gpu_load_and_emc(nx: SysfsRoot) -> None:
    gpu = next(d for d in devfreq.read_devices(nx) if d.kind == "gpu")
    assert gpu.of_node_name == "gpu" and not gpu.has_load
    path = jetson.find_gpu_load_path(nx, gpu)
    assert path == "sys/devices/platform/bus@0/17000000.gpu/load"
    assert jetson.parse_gpu_load(nx.read_text(path)) == pytest.approx(0.537)
    emc = jetson.read_emc(nx)
    assert emc is not None and emc.rate_hz == 2133000000 and emc.iso_cap_hz is None and emc.locked is False
    assert emc.activity_path is not None
    assert jetson.emc_utilisation(nx.read_int(emc.activity_path), emc.rate_hz) == pytest.approx(0.10)


def test_orin_fused_zones(tmp_path: Path) -> None:
    fs = SysfsRoot(write_tree(tmp_path, orin_nx_tree(fused_cv="-256000")))
    temps = {z.type: thermal.read_temp_c(fs, z) for z in thermal.read_zones(fs)}
    assert temps["cv0-thermal"] is None and temps["cpu-thermal"] == 48.0


def test_orin_eagain_zone_via_fifo(tmp_path: Path) -> None:
    root = write_tree(tmp_path, orin_nx_tree())
    temp = root / "sys/devices/virtual/thermal/thermal_zone2/temp"
    temp.unlink()
    os.mkfifo(temp)
    rfd = os.open(temp, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(temp, os.O_WRONLY | os.O_NONBLOCK)
    try:
        p = discover(root)
        zone = next(z for z in p.thermal_zones if z.type == "cv0-thermal")
        assert zone.temp_c is None
        assert next(z for z in p.thermal_zones if z.type == "tj-thermal").temp_c == 48.0
    finally:
        os.close(wfd)
        os.close(rfd)


# -- discovery ----------------------------------------------------------------------


def test_discover_rk3588_reference_tree(rk: SysfsRoot) -> None:
    p = discover(rk)
    assert p.soc == "rk3588" and p.model == "Radxa ROCK 5B" and p.cpus == tuple(range(8))
    assert [c.name for c in p.cpu_clusters] == ["cluster0", "cluster4", "cluster6"]
    assert [(d.kind, d.name) for d in p.devices] == [("gpu", "fb000000.gpu"), ("npu", "fdab0000.npu"), ("memory", "dmc")]
    npu = p.device("npu")
    assert npu is not None and npu.load_format == "rknpu" and npu.cores == 3
    assert p.npu_driver == "0.9.8"
    assert p.power_rails and all(r.source == "estimated" for r in p.power_rails)
    assert any("estimated" in n for n in p.notes)


@pytest.mark.parametrize("jp5", [False, True])
def test_discover_orin_nx_reference_tree(tmp_path: Path, jp5: bool) -> None:
    p = discover(write_tree(tmp_path, orin_nx_tree(jp5=jp5)))
    assert p.soc == "orin-nx"
    assert p.jetpack == ("5" if jp5 else "6")
    gpu = p.device("gpu")
    assert gpu is not None and gpu.name == ("17000000.ga10b" if jp5 else "17000000.gpu")
    assert gpu.load_format == "permille" and gpu.max_freq_hz == 918000000
    mem = p.device("memory")
    assert mem is not None and mem.name == "emc" and mem.source == "bpmp"
    assert mem.frequencies_hz == (204000000, 665600000, 2133000000, 3199000000)  # possible_rates, not min/max
    assert [(r.name, r.source) for r in p.power_rails] == [
        ("VDD_IN", "measured"),
        ("VDD_CPU_GPU_CV", "measured"),
        ("VDD_SOC", "measured"),
    ]


def test_discover_orin_without_compatible_uses_cpu_topology(tmp_path: Path) -> None:
    tree = orin_nx_tree()
    del tree["proc/device-tree/compatible"]
    p = discover(write_tree(tmp_path, tree))
    assert p.soc == "orin-nx" and any("inferred" in n for n in p.notes)


def test_discover_empty_root(tmp_path: Path) -> None:
    p = discover(tmp_path)
    assert p.soc is None and p.cpu_clusters == () and p.devices == () and p.power_rails == ()
    assert json.loads(p.to_json())["soc"] is None


def test_discover_host_root_does_not_crash() -> None:
    p = discover("/")
    d = json.loads(p.to_json())
    assert set(d) >= {"soc", "cpu_clusters", "devices", "thermal_zones", "power_rails"}


def test_discover_skips_links_out_of_root_and_reports_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 23 item 8: one link leading out of the root (a devfreq node, a thermal zone, a cpufreq
    # policy, one value file) stopped discovery; it is skipped, never followed, and noted as the
    # PathOutsideRootError it is.
    root = write_tree(tmp_path / "r", rk3588_tree())
    (root / "sys/class/devfreq/evil").symlink_to("/etc")
    zone1 = root / "sys/class/thermal/thermal_zone1"
    zone1.unlink()
    zone1.symlink_to("/etc")
    (root / "sys/devices/system/cpu/cpufreq/policy9").symlink_to("/etc")
    cur = root / "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq"
    cur.unlink()
    cur.symlink_to("/etc/hostname")
    fs = SysfsRoot(root)
    with caplog.at_level("WARNING", logger="hetsched.platform"):
        p = discover(fs)
    assert len(p.thermal_zones) == 6 and len(p.cpu_clusters) == 3
    assert {d.name for d in devfreq.read_devices(fs)} == {"fb000000.gpu", "fdab0000.npu", "dmc", "fdd90000.vop"}
    bad = fs.unreadable()
    assert {"sys/class/devfreq/evil", "sys/class/thermal/thermal_zone1",
            "sys/devices/system/cpu/cpufreq/policy9"} <= set(bad)
    assert all(why.startswith("PathOutsideRootError") for why in bad.values())
    assert "PathOutsideRootError" in caplog.text


# -- every twin board profile and variant ---------------------------------------------------

@pytest.fixture
def boards() -> Any:
    """The twin's board builders (imported per test: a broken twin module fails only these tests)."""
    import hetsched.testing._boards as boards

    return boards

BOARD_CASES = [
    ("rk3588", None),
    ("rk3588", "vendor"),
    ("rk3588", "mainline"),
    ("orin-nx", None),
    ("orin-nx", "jp5"),
    ("orin-nx", "jp6"),
    ("orin-agx", "jp5"),
    ("orin-agx", "jp6"),
    ("orin-nano", "jp5"),
    ("orin-nano", "jp6"),
]


@pytest.mark.parametrize(("soc", "variant"), BOARD_CASES)
def test_discover_twin_boards(tmp_path: Path, boards: Any, soc: str, variant: str | None) -> None:
    root = boards.build_board_tree(tmp_path, soc, variant=variant)
    p = discover(root)
    assert p.soc == soc
    n_cpus = {"rk3588": 8, "orin-nx": 8, "orin-agx": 12, "orin-nano": 6}[soc]
    assert sorted(c for cl in p.cpu_clusters for c in cl.cpus) == list(range(n_cpus))
    for cl in p.cpu_clusters:
        assert cl.frequencies_khz == tuple(sorted(cl.frequencies_khz)) and cl.governor
    kinds = [d.kind for d in p.devices]
    assert kinds.count("gpu") == 1 and kinds.count("memory") == 1
    assert ("npu" in kinds) == (soc == "rk3588")
    for d in p.devices:
        assert d.frequencies_hz and d.max_freq_hz == max(d.frequencies_hz)
        assert d.load_path is not None  # utilisation readable for every device on the twin
    assert p.thermal_zones and any(z.passive_trip_c is not None for z in p.thermal_zones)
    if soc == "rk3588":
        assert p.cpu_clusters[0].frequencies_khz[-1] == 1800000
        assert all(r.source == "estimated" for r in p.power_rails) and p.power_rails
    else:
        assert p.power_rails and all(r.source == "measured" for r in p.power_rails)
        assert p.jetpack == (variant or "jp6")[-1]
        fused = [z for z in p.thermal_zones if z.type.lower().startswith("cv")]
        assert fused and all((z.temp_c is None) == (soc != "orin-agx") for z in fused)


@pytest.mark.parametrize("soc", ["orin-nx", "orin-nano"])
def test_discover_twin_eagain_style(tmp_path: Path, boards: Any, soc: str) -> None:
    root = boards.build_board_tree(tmp_path, soc, offline_style="eagain")
    p = discover(root)
    cv = [z for z in p.thermal_zones if z.type.startswith("cv")]
    assert len(cv) == 3 and all(z.temp_c is None for z in cv)


def test_rk3588_estimated_rails_use_pmic_names(rk: SysfsRoot) -> None:
    p = discover(rk)
    assert [r.name for r in p.power_rails] == [
        "vdd_cpu_lit",
        "vdd_cpu_big0",
        "vdd_cpu_big1",
        "vdd_gpu",
        "vdd_npu",
        "vdd_ddr",
        "board",
    ]


def test_twin_estimated_rails_match_the_twin_model(tmp_path: Path, boards: Any) -> None:
    import hetsched._twin.profiles as profiles

    p = discover(boards.build_board_tree(tmp_path, "rk3588"))
    model_rails = [r.name for r in profiles.get_profile("rk3588").rails if not r.measured]
    assert [r.name for r in p.power_rails] == model_rails


def test_emc_rate_lock_and_release(nx: SysfsRoot, tmp_path: Path) -> None:
    emc = "sys/kernel/debug/bpmp/debug/clk/emc"
    with pytest.raises(UnsupportedFrequencyError, match="not an EMC rate the kernel offers"):
        jetson.set_emc_rate(nx, 100_000_000)  # checked against possible_rates
    old_kernel = SysfsRoot(write_tree(tmp_path / "no-table", orin_nx_tree(emc_rates=None)))
    with pytest.raises(UnsupportedFrequencyError, match="outside the EMC range"):
        jetson.set_emc_rate(old_kernel, 100_000_000)  # no table: only min_rate..max_rate
    with pytest.raises(UnsupportedFrequencyError, match="available EMC rate"):
        jetson.set_emc_rate(nx, 1_000_000_000, available_hz=(204000000, 665600000, 2133000000, 3199000000))
    assert nx.read_int(f"{emc}/mrq_rate_locked") == 0  # nothing written on refusal
    jetson.set_emc_rate(nx, 665600000, available_hz=(204000000, 665600000, 2133000000, 3199000000))
    assert (nx.read_int(f"{emc}/mrq_rate_locked"), nx.read_int(f"{emc}/rate")) == (1, 665600000)
    jetson.release_emc_rate(nx)
    assert nx.read_int(f"{emc}/mrq_rate_locked") == 0


def test_emc_writer_absent_on_rk(rk: SysfsRoot) -> None:
    from hetsched import PlatformError

    with pytest.raises(PlatformError, match="no bpmp EMC"):
        jetson.set_emc_rate(rk, 528000000)
