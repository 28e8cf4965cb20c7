"""Pure parsers of the platform layer, on strings recorded from real boards (soc-sysfs.md)."""

from __future__ import annotations

import pytest

from hetsched._platform import cpufreq, devfreq, jetson, power, procstat, rknpu, soc, thermal


class TestCpufreq:
    def test_freq_list_with_trailing_space(self) -> None:
        text = "408000 600000 816000 1008000 1200000 1416000 1608000 1800000 2016000 2208000 2256000 \n"
        got = cpufreq.parse_freq_list(text)
        assert got[0] == 408000 and got[-1] == 2256000 and len(got) == 11

    def test_freq_list_descending_is_sorted(self) -> None:
        text = "1000000000 900000000 800000000 700000000 600000000 500000000 400000000 300000000 \n"
        assert cpufreq.parse_freq_list(text) == tuple(range(300_000_000, 1_000_000_001, 100_000_000))

    def test_freq_list_rejects_garbage(self) -> None:
        with pytest.raises(ValueError, match="not a frequency: 'abc'"):
            cpufreq.parse_freq_list("408000 abc")

    def test_governors(self) -> None:
        text = "interactive conservative ondemand userspace powersave performance schedutil \n"
        assert cpufreq.parse_governors(text) == (
            "interactive",
            "conservative",
            "ondemand",
            "userspace",
            "powersave",
            "performance",
            "schedutil",
        )

    @pytest.mark.parametrize(
        ("text", "cpus"),
        [("0 1 2 3\n", (0, 1, 2, 3)), ("4 5", (4, 5)), ("0-7\n", tuple(range(8))), ("0-3,6-7", (0, 1, 2, 3, 6, 7)), ("5", (5,))],
    )
    def test_cpu_lists(self, text: str, cpus: tuple[int, ...]) -> None:
        assert cpufreq.parse_cpu_list(text) == cpus

    def test_setspeed(self) -> None:
        assert cpufreq.parse_setspeed("<unsupported>\n") is None
        assert cpufreq.parse_setspeed("1608000\n") == 1608000

    def test_cpuinfo_parts(self) -> None:
        text = (
            "processor\t: 0\nBogoMIPS\t: 48.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd05\n\n"
            "processor\t: 4\nCPU part\t: 0xd0b\n\n"
        )
        assert cpufreq.parse_cpuinfo_parts(text) == {0: 0xD05, 4: 0xD0B}
        assert cpufreq.CPU_PARTS[0xD05][0] == "cortex-a55"
        assert cpufreq.parse_cpuinfo_parts("processor : 0\nmodel name : Intel\n") == {}


class TestDevfreq:
    @pytest.mark.parametrize(
        ("text", "want"),
        [("0@300000000Hz\n", (0, 300000000)), ("37@800000000Hz", (37, 800000000)), ("100@1000000000Hz\n", (100, 1000000000))],
    )
    def test_load(self, text: str, want: tuple[int, int]) -> None:
        assert devfreq.parse_load(text) == want

    def test_load_malformed(self) -> None:
        assert devfreq.parse_load("537\n") is None
        assert devfreq.parse_load("") is None

    @pytest.mark.parametrize(
        ("node", "of_name", "kind"),
        [
            ("17000000.gpu", "gpu", "gpu"),  # JP6
            ("17000000.ga10b", "ga10b", "gpu"),  # JP5
            ("57000000.gpu", "gv11b", "gpu"),  # Xavier
            ("fb000000.gpu", None, "gpu"),  # RK3588 without of_node
            ("fdab0000.npu", None, "npu"),
            ("fdab0000.npu", "npu", "npu"),
            ("dmc", None, "memory"),
            ("dmc", "dmc", "memory"),
            ("fdd90000.vop", None, "other"),
            ("fdbd0000.rkvenc-core", "rkvenc-core", "other"),
            ("weird", "gpu\0", "gpu"),  # NUL-terminated of_node string
        ],
    )
    def test_classify(self, node: str, of_name: str | None, kind: str) -> None:
        assert devfreq.classify(node, of_name) == kind


class TestThermal:
    def test_millidegrees(self) -> None:
        assert thermal.parse_temp_c("44384\n") == pytest.approx(44.384)
        assert thermal.parse_temp_c("48125") == pytest.approx(48.125)
        assert thermal.parse_temp_c("-5000\n") == pytest.approx(-5.0)

    def test_fused_off_and_absent(self) -> None:
        assert thermal.parse_temp_c("-256000\n") is None
        assert thermal.parse_temp_c(None) is None
        assert thermal.parse_temp_c("") is None

    def test_short_name(self) -> None:
        assert thermal.zone_short_name("cpu-thermal") == "cpu"
        assert thermal.zone_short_name("CPU-therm") == "CPU"
        assert thermal.zone_short_name("tj") == "tj"


class TestPower:
    def test_mv_ma(self) -> None:
        # Orin NX fixture: VDD_IN 5048 mV x 957 mA
        assert power.power_w_from_mv_ma(5048, 957) == pytest.approx(4.830936)
        assert power.power_w_from_mv_ma(None, 957) is None

    def test_labels(self) -> None:
        assert power.is_connected_label("VDD_IN")
        assert power.is_connected_label("VDD_CPU_GPU_CV")  # contains "N" and "C" but is connected
        assert not power.is_connected_label("NC")
        assert not power.is_connected_label(None)
        assert power.parse_label("VDD_SOC\n") == "VDD_SOC"

    def test_rapl_wrap(self) -> None:
        top = 262143328850
        assert power.energy_delta_uj(1000, 5000, top) == 4000
        assert power.energy_delta_uj(top - 100, 50, top) == 150
        assert power.energy_delta_uj(5000, 1000, None) == 0


class TestJetson:
    def test_gpu_load_permille(self) -> None:
        assert jetson.parse_gpu_load("537\n") == pytest.approx(0.537)
        assert jetson.parse_gpu_load("0") == 0.0
        assert jetson.parse_gpu_load("1000\n") == 1.0
        assert jetson.parse_gpu_load("garbage") is None

    def test_emc_activity_like_jtop(self) -> None:
        # mc_all = pct x rate_kHz: 21330000 at 2133 MHz is 10 %
        assert jetson.emc_utilisation(21330000, 2133000000) == pytest.approx(0.10)
        assert jetson.emc_utilisation(None, 2133000000) is None
        assert jetson.emc_utilisation(5, 0) is None

    def test_release(self) -> None:
        r = jetson.parse_nv_tegra_release(
            "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 2025"
        )
        assert r is not None and r.version == "36.4.3" and r.jetpack == "6"
        r5 = jetson.parse_nv_tegra_release("# R35 (release), REVISION: 4.1, GCID: 1, BOARD: t186ref")
        assert r5 is not None and r5.jetpack == "5"
        assert jetson.parse_nv_tegra_release("hello") is None


class TestRknpu:
    def test_recorded_idle(self) -> None:
        assert rknpu.parse_npu_load("NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\n") == (0.0, 0.0, 0.0)

    def test_busy_and_two_digit(self) -> None:
        assert rknpu.parse_npu_load("NPU load:  Core0: 37%, Core1:100%, Core2:  5%,") == (0.37, 1.0, 0.05)

    def test_single_core_and_garbage(self) -> None:
        assert rknpu.parse_npu_load("NPU load:  45%\n") == ()
        assert rknpu.parse_npu_load(None) == ()

    def test_version(self) -> None:
        assert rknpu.parse_npu_version("RKNPU driver: v0.9.8\n") == "0.9.8"
        assert rknpu.parse_npu_version("0.9.8\n") == "0.9.8"


class TestProcStat:
    STAT1 = (
        "cpu  26716126 25174 7198445 948399047 900582 0 354519 0 0 0\n"
        "cpu0 1000 0 0 9000 0 0 0 0 0 0\n"
        "cpu1 1000 0 0 9000 0 0 0 0 0 0\n"
        "intr 1 2 3\nctxt 5\n"
    )
    STAT2 = (
        "cpu  26716126 25174 7198445 948399047 900582 0 354519 0 0 0\n"
        "cpu0 1050 0 25 9025 0 0 0 0 0 0\n"  # 75 busy of 100
        "cpu1 1000 0 0 9100 0 0 0 0 0 0\n"  # idle
        "intr 1 2 3\n"
    )

    def test_recorded_line(self) -> None:
        t = procstat.parse_proc_stat("cpu0 1673575 1889 461134 59280326 55795 0 10322 0 0 0\n")
        assert t[0].busy == 1673575 + 1889 + 461134 + 10322
        assert t[0].total == t[0].busy + 59280326 + 55795

    def test_deltas(self) -> None:
        u = procstat.utilisation(procstat.parse_proc_stat(self.STAT1), procstat.parse_proc_stat(self.STAT2))
        assert u == {0: pytest.approx(0.75), 1: 0.0}

    def test_guest_not_double_counted(self) -> None:
        # guest (field 9) is inside user already
        a = procstat.parse_proc_stat("cpu0 100 0 0 100 0 0 0 0 50 0\n")
        assert a[0].busy == 100 and a[0].total == 200

    def test_hotplug(self) -> None:
        prev = procstat.parse_proc_stat("cpu0 1 0 0 1 0 0 0 0 0 0\n")
        cur = procstat.parse_proc_stat("cpu0 2 0 0 2 0 0 0 0 0 0\ncpu1 5 0 0 5 0 0 0 0 0 0\n")
        assert set(procstat.utilisation(prev, cur)) == {0}


class TestSoc:
    def test_compatible(self) -> None:
        assert soc.parse_compatible(b"radxa,rock-5b\0rockchip,rk3588\0") == ("radxa,rock-5b", "rockchip,rk3588")

    @pytest.mark.parametrize(
        ("compat", "want"),
        [
            (b"radxa,rock-5b\0rockchip,rk3588\0", "rk3588"),
            (b"xunlong,orangepi-5\0rockchip,rk3588s\0", "rk3588"),
            (b"nvidia,p3768-0000+p3767-0000\0nvidia,p3767-0000\0nvidia,tegra234\0", "orin-nx"),
            (b"nvidia,p3768-0000+p3767-0001\0nvidia,p3767-0001\0nvidia,tegra234\0", "orin-nx"),
            (b"nvidia,p3768-0000+p3767-0003\0nvidia,p3767-0003\0nvidia,tegra234\0", "orin-nano"),
            (b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0", "orin-agx"),
            (b"raspberrypi,5-model-b\0brcm,bcm2712\0", None),
            (b"", None),
        ],
    )
    def test_identify(self, compat: bytes, want: str | None) -> None:
        assert soc.identify_soc(soc.parse_compatible(compat)) == want
