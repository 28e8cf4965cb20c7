"""Telemetry on trees whose values change between samples, and on twin boards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from hetsched import PlatformError, RuntimeStateError
from hetsched._estimators import power_estimator_for
from hetsched._platform import SysfsRoot, Telemetry, discover
from hetsched._snapshot import Snapshot

from _platform_trees import Link, orin_nx_tree, rk3588_tree, write_tree


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _stat(busy: list[int], idle: list[int]) -> str:
    lines = ["cpu  1 0 0 1 0 0 0 0 0 0"]
    lines += [f"cpu{n} {b} 0 0 {i} 0 0 0 0 0 0" for n, (b, i) in enumerate(zip(busy, idle, strict=True))]
    return "\n".join(lines) + "\nintr 0\n"


def test_rk3588_values_follow_the_tree(tmp_path: Path) -> None:
    root = write_tree(tmp_path, rk3588_tree())
    (root / "proc/stat").write_text(_stat([1000] * 8, [9000] * 8))
    clock = FakeClock()
    tm = Telemetry(root, clock=clock, capacity=4, estimator=power_estimator_for(discover(root)))
    s1 = tm.sample_once()
    assert s1.soc == "rk3588" and s1.cpu_utilisation == ()  # no delta yet
    assert set(s1.domains) == {"cluster0", "cluster4", "cluster6", "gpu", "npu", "memory"}
    c4 = s1.domains["cluster4"]
    assert c4.kind == "cpu" and c4.freq_hz == 816_000_000 and c4.cpus == (4, 5) and c4.governor == "ondemand"
    assert c4.available_hz[-1] == 2_256_000_000 and c4.max_hz == 2_256_000_000
    assert s1.domains["gpu"].available_hz[0] == 300_000_000 and s1.domains["gpu"].utilisation == 0.0
    assert s1.domains["memory"].utilisation == pytest.approx(0.12)
    assert s1.zones["soc-thermal"].temp_c == pytest.approx(44.384) and s1.zones["soc-thermal"].passive_trip_c == 75.0

    # the board moves on
    (root / "proc/stat").write_text(_stat([1050] * 4 + [1100] * 4, [9050] * 4 + [9000] * 4))
    pol4 = root / "sys/devices/system/cpu/cpufreq/policy4"
    (pol4 / "scaling_cur_freq").write_text("2208000\n")
    (pol4 / "scaling_governor").write_text("userspace\n")
    gpu = root / "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu"
    (gpu / "cur_freq").write_text("800000000\n")
    (gpu / "load").write_text("73@800000000Hz\n")
    (root / "sys/kernel/debug/rknpu/load").write_text("NPU load:  Core0: 30%, Core1: 60%, Core2: 90%,\n")
    (root / "sys/devices/virtual/thermal/thermal_zone0/temp").write_text("81250\n")
    clock.t += 0.5
    s2 = tm.sample_once()
    assert s2.time_s == pytest.approx(100.5)
    assert s2.domains["cluster4"].freq_hz == 2_208_000_000 and s2.domains["cluster4"].governor == "userspace"
    assert s2.cpu_utilisation[4] == pytest.approx(1.0) and s2.cpu_utilisation[0] == pytest.approx(0.5)
    assert s2.domains["cluster4"].utilisation == pytest.approx(1.0)
    assert s2.domains["cluster0"].utilisation == pytest.approx(0.5)
    assert s2.domains["gpu"].freq_hz == 800_000_000 and s2.domains["gpu"].utilisation == pytest.approx(0.73)
    assert s2.domains["npu"].utilisation == pytest.approx(0.6)
    assert s2.zones["soc-thermal"].temp_c == pytest.approx(81.25)
    assert s2.hottest_headroom_c() == pytest.approx(75.0 - 81.25)
    # no sensor: the SoC model passed in estimates every rail, and the rails say so
    assert s2.rails and all(r.source == "estimated" and r.power_w is not None for r in s2.rails.values())
    board_w, big_w = s2.rails["board"].power_w, s2.rails["vdd_cpu_big0"].power_w
    assert board_w is not None and big_w is not None and board_w > big_w > 0
    assert tm.history() == (s1, s2) and tm.latest() is s2


def test_ring_buffer_capacity(tmp_path: Path) -> None:
    tm = Telemetry(write_tree(tmp_path, rk3588_tree()), capacity=3, clock=FakeClock())
    snaps = [tm.sample_once() for _ in range(5)]
    assert tm.history() == tuple(snaps[-3:])
    st = tm.statistics()
    assert st.samples == 5 and st.retained == 3 and st.capacity == 3
    assert st.mean_sample_us is not None and st.mean_sample_us > 0


def test_ina3221_energy_integration(tmp_path: Path) -> None:
    root = write_tree(tmp_path, orin_nx_tree())
    clock = FakeClock()
    tm = Telemetry(root, clock=clock)
    h = root / "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    (h / "in1_input").write_text("5000\n")
    (h / "curr1_input").write_text("1000\n")  # 5 W
    s1 = tm.sample_once()
    assert s1.rails["VDD_IN"].power_w == pytest.approx(5.0) and s1.total_power_w == pytest.approx(5.0)
    for _ in range(10):
        clock.t += 1.0
        tm.sample_once()
    assert tm.latest().rails["VDD_IN"].energy_j == pytest.approx(50.0)  # constant 5 W for 10 s
    (h / "curr1_input").write_text("2000\n")  # 10 W
    clock.t += 2.0
    s = tm.sample_once()
    # trapezoid between 5 W and 10 W over 2 s
    assert s.rails["VDD_IN"].energy_j == pytest.approx(50.0 + 15.0)
    assert s.rails["VDD_IN"].source == "measured"
    assert tm.statistics().energy_j["VDD_IN"] == pytest.approx(65.0)


def test_orin_gpu_emc_and_fused_zone(tmp_path: Path) -> None:
    root = write_tree(tmp_path, orin_nx_tree(fused_cv="-256000"))
    tm = Telemetry(root, clock=FakeClock())
    s = tm.sample_once()
    assert s.soc == "orin-nx"
    assert s.domains["gpu"].utilisation == pytest.approx(0.537) and s.domains["gpu"].governor == "nvhost_podgov"
    assert s.domains["memory"].freq_hz == 2_133_000_000 and s.domains["memory"].utilisation == pytest.approx(0.10)
    assert s.zones["cv0-thermal"].temp_c is None and s.zones["cpu-thermal"].temp_c == 48.0
    (root / "sys/devices/platform/bus@0/17000000.gpu/load").write_text("0\n")  # rail-gated
    assert tm.sample_once().domains["gpu"].utilisation == 0.0


def test_rapl_counter_wrap(tmp_path: Path) -> None:
    z = "sys/devices/virtual/powercap/intel-rapl/intel-rapl:0"
    tree: dict[str, str | bytes | Link] = {
        "sys/class/powercap/intel-rapl:0": Link("../../devices/virtual/powercap/intel-rapl/intel-rapl:0"),
        f"{z}/name": "package-0\n",
        f"{z}/energy_uj": "999000000\n",
        f"{z}/max_energy_range_uj": "1000000000\n",
    }
    root = write_tree(tmp_path, tree)
    clock = FakeClock()
    tm = Telemetry(root, clock=clock)
    tm.sample_once()
    (root / z / "energy_uj").write_text("3000000\n")  # wrapped: 1 J to the top + 3 J
    clock.t += 2.0
    s = tm.sample_once()
    (rail,) = s.rails.values()
    assert rail.energy_j == pytest.approx(4.0) and rail.power_w == pytest.approx(2.0)
    assert s.total_power_w == pytest.approx(2.0)


def test_estimator_marks_rails_estimated(tmp_path: Path) -> None:
    seen: list[Snapshot] = []

    def estimator(snap: Snapshot) -> Mapping[str, float]:
        seen.append(snap)
        f = snap.domains["cluster4"].freq_hz or 0
        return {"cluster4": f / 1e9, "gpu": 0.5, "total": 3.0}

    clock = FakeClock()
    tm = Telemetry(write_tree(tmp_path, rk3588_tree()), clock=clock, estimator=estimator)
    tm.sample_once()
    clock.t += 1.0
    s = tm.sample_once()
    assert seen[-1].rails == {} and seen[-1].domains["cluster4"].freq_hz == 816_000_000
    assert s.rails["cluster4"].power_w == pytest.approx(0.816) and s.rails["cluster4"].source == "estimated"
    assert s.rails["cluster4"].energy_j == pytest.approx(0.816)
    assert s.total_power_w == pytest.approx(3.0)
    assert tm.statistics().estimated_power


def test_without_an_estimator_unmeasured_rails_read_none(tmp_path: Path) -> None:
    root = write_tree(tmp_path, rk3588_tree())
    clock = FakeClock()
    tm = Telemetry(root, clock=clock)
    tm.sample_once()
    clock.t += 1.0
    s = tm.sample_once()
    assert set(s.rails) == {r.name for r in tm.platform.power_rails} and "board" in s.rails
    assert all(r.source == "estimated" and r.power_w is None and r.energy_j is None for r in s.rails.values())
    assert s.total_power_w is None and tm.energy_j() == {}


def test_for_platform_gives_the_soc_model_only_where_no_sensor_measures(tmp_path: Path) -> None:
    rk = discover(write_tree(tmp_path / "rk", rk3588_tree()))
    estimator = power_estimator_for(rk)
    assert estimator is not None
    tm = Telemetry(rk.root, platform=rk, clock=FakeClock(), estimator=estimator)
    assert tm.sample_once().rails["vdd_cpu_big0"].power_w > 0  # type: ignore[operator]
    assert power_estimator_for(discover(write_tree(tmp_path / "orin", orin_nx_tree()))) is None  # INA3221 measures
    assert power_estimator_for(replace(rk, soc="pentium")) is None  # no model of that SoC: nothing made up
    (tmp_path / "empty").mkdir()
    assert power_estimator_for(discover(tmp_path / "empty")) is None  # no SoC at all


def test_bad_parameters(tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match="period_s"):
        Telemetry(tmp_path, period_s=0)
    with pytest.raises(PlatformError, match="capacity"):
        Telemetry(tmp_path, capacity=0)
    tm = Telemetry(tmp_path)
    with pytest.raises(RuntimeStateError, match="no telemetry sample"):
        tm.latest()


def test_sample_tolerates_vanished_files(tmp_path: Path) -> None:
    root = write_tree(tmp_path, rk3588_tree())
    tm = Telemetry(root, clock=FakeClock())
    (root / "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu/load").unlink()
    (root / "sys/devices/virtual/thermal/thermal_zone3/temp").write_text("")
    s = tm.sample_once()
    assert s.domains["gpu"].utilisation is None and s.zones["littlecore-thermal"].temp_c is None


@pytest.mark.anyio
async def test_async_sampling_task(tmp_path: Path) -> None:
    root = write_tree(tmp_path, rk3588_tree())
    async with Telemetry(root, period_s=0.01, capacity=50) as tm:
        first = tm.latest()  # taken before the body runs
        (root / "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq").write_text("1800000\n")
        with anyio.fail_after(5):
            while True:
                snap = await tm.wait_sample()
                if snap.domains["cluster0"].freq_hz == 1_800_000_000:
                    break
        assert snap.time_s > first.time_s
        with pytest.raises(RuntimeStateError):
            async with tm:
                pass
    n = tm.statistics().samples
    await anyio.sleep(0.05)
    assert tm.statistics().samples == n  # the task ended with the block
    with pytest.raises(RuntimeStateError):
        await tm.wait_sample()


@pytest.mark.anyio
async def test_body_error_propagates_and_stops_sampling(tmp_path: Path) -> None:
    tm = Telemetry(write_tree(tmp_path, rk3588_tree()), period_s=0.01)
    with pytest.raises(KeyError):
        async with tm:
            raise KeyError("boom")
    n = tm.statistics().samples
    await anyio.sleep(0.03)
    assert tm.statistics().samples == n


@pytest.fixture
def boards() -> Any:
    """The twin's board builders (imported per test: a broken twin module fails only these tests)."""
    import hetsched.testing._boards as boards

    return boards


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx", "orin-agx", "orin-nano"])
def test_telemetry_on_twin_boards(tmp_path: Path, boards: Any, soc: str) -> None:
    root = boards.build_board_tree(tmp_path, soc)
    tm = Telemetry(root, clock=FakeClock())
    s = tm.sample_once()
    assert s.soc == soc
    assert all(d.freq_hz is not None and d.freq_hz in d.available_hz for d in s.domains.values() if d.kind != "memory")
    assert any(z.temp_c is not None for z in s.zones.values())
    if soc != "rk3588":
        assert s.total_power_w is not None and s.total_power_w >= 0
        assert all(r.source == "measured" for r in s.rails.values())


@pytest.mark.anyio
async def test_outer_cancellation_closes_cleanly(tmp_path: Path) -> None:
    tm = Telemetry(write_tree(tmp_path, rk3588_tree()), period_s=0.005)
    with anyio.fail_after(30):  # a bound only: the test waits for samples, not for time
        with anyio.CancelScope() as scope:
            async with tm:
                await tm.wait_sample()  # the periodic task runs (however loaded the machine is)
                await tm.wait_sample()
                scope.cancel()  # an outer cancellation while the sampler is running
                await anyio.sleep(10)
    assert scope.cancelled_caught
    n = tm.statistics().samples
    assert n >= 2
    await anyio.sleep(0.03)  # the sampler stopped with the block: no sample after it
    assert tm.statistics().samples == n


# -- on a live twin ----------------------------------------------------------------------------


@pytest.fixture
def live() -> Any:
    import hetsched._twin.live as live

    return live


def test_live_twin_load_shows_in_telemetry(tmp_path: Path, live: Any) -> None:
    twin = live.LiveTwin("orin-nx", tmp_path, noise=False)
    twin.write_once()
    tm = Telemetry(tmp_path, clock=FakeClock())
    before = tm.sample_once()
    twin.report_utilisation("cluster0", 1.0)
    twin.report_utilisation("gpu", 1.0)
    twin.advance(10.0)
    after = tm.sample_once()
    assert all(after.cpu_utilisation[c] > 0.9 for c in (0, 1, 2, 3))
    assert all(after.cpu_utilisation[c] < 0.5 for c in (4, 5, 6, 7))
    assert after.domains["cluster0"].utilisation is not None and after.domains["cluster0"].utilisation > 0.9
    assert after.domains["gpu"].utilisation is not None and after.domains["gpu"].utilisation > 0.9
    assert after.rails["VDD_IN"].power_w > before.rails["VDD_IN"].power_w  # type: ignore[operator]
    assert after.zones["gpu-thermal"].temp_c > before.zones["gpu-thermal"].temp_c  # type: ignore[operator]


def test_live_twin_follows_clock_writes(tmp_path: Path, live: Any) -> None:
    from hetsched._platform import cpufreq, devfreq

    twin = live.LiveTwin("rk3588", tmp_path, noise=False)
    twin.write_once()
    fs = SysfsRoot(tmp_path)
    tm = Telemetry(fs, clock=FakeClock())
    big = next(p for p in cpufreq.read_policies(fs) if p.policy == 4)
    cpufreq.set_max_khz(fs, big, 1200000)
    twin.report_utilisation("cluster4", 1.0)
    twin.advance(1.0)
    s = tm.sample_once()
    assert s.domains["cluster4"].max_hz == 1_200_000_000
    assert s.domains["cluster4"].freq_hz is not None and s.domains["cluster4"].freq_hz <= 1_200_000_000

    gpu = next(d for d in devfreq.read_devices(fs) if d.kind == "gpu")
    devfreq.set_governor(fs, gpu, "userspace")
    twin.advance(0.1)  # the kernel creates userspace/set_freq
    devfreq.set_userspace_freq(fs, gpu, 700_000_000)
    twin.advance(0.5)
    s = tm.sample_once()
    assert s.domains["gpu"].governor == "userspace" and s.domains["gpu"].freq_hz == 700_000_000


@pytest.mark.anyio
async def test_telemetry_alongside_running_live_twin(tmp_path: Path, live: Any) -> None:
    async with live.LiveTwin("rk3588", tmp_path, speed=50.0, period_s=0.01, noise=False) as twin:
        twin.report_utilisation("npu", 1.0)
        async with Telemetry(tmp_path, period_s=0.01) as tm:
            with anyio.fail_after(10):
                while True:
                    snap = await tm.wait_sample()
                    npu = snap.domains["npu"].utilisation
                    if npu is not None and npu > 0.9:
                        break
            assert snap.soc == "rk3588"


@pytest.mark.anyio
async def test_first_sample_permission_error_is_raised_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from hetsched import SysfsPermissionError

    tm = Telemetry(write_tree(tmp_path, rk3588_tree()), period_s=0.01)

    def denied(fd: int, n: int) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "read", denied)
    with pytest.raises(SysfsPermissionError, match="proc/stat"):
        async with tm:
            pytest.fail("the body must not run")
