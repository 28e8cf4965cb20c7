"""SoC twin physics: power, heat, throttling with hysteresis, energy conservation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hetsched import TwinError, UnknownSocError
from hetsched._twin.physics import (
    EnergyIntegrator,
    PowerAllocator,
    StepWise,
    ThermalNetwork,
    dynamic_power_w,
    leakage_w,
)
from hetsched._twin.profiles import SocProfile, ThermalNode, get_profile, known_socs, rk3588_profile
from hetsched._twin.sim import PhaseWork, SimBoard


def test_energy_model_matches_device_tree_formula() -> None:
    # P[uW] = C * mV^2 * MHz / 1e6 (drivers/opp/of.c); A76 C=416 at 2.4 GHz / 1000 mV -> 998.4 mW.
    assert dynamic_power_w(416, 1000, 2.4e9, 1, 1.0) == pytest.approx(0.9984)
    assert dynamic_power_w(416, 1000, 2.4e9, 2, 0.5) == pytest.approx(0.9984)
    assert dynamic_power_w(416, 1000, 2.4e9, 1, 0.0) == 0.0


def test_leakage_rises_with_temperature_and_voltage() -> None:
    cold = leakage_w(0.1, 900, 1000, 30.0, 0.02)
    hot = leakage_w(0.1, 900, 1000, 80.0, 0.02)
    assert hot > cold * 2.5
    assert leakage_w(0.1, 1000, 1000, 30.0, 0.02) > cold


@pytest.mark.parametrize("soc", known_socs())
def test_more_frequency_means_more_power_and_heat(soc: str) -> None:
    results: list[tuple[float, float, float]] = []
    for pick in (0, -1):
        b = SimBoard(soc, noise=False)
        for name, info in b.domains().items():
            if info.kind == "cpu":
                b.set_frequency(name, info.available_hz[pick])
                b.set_utilisation(name, 1.0)
        b.step(120.0)
        cpu_zone = b.profile.layout().zones[0].type
        temperature = b.temperature(cpu_zone)
        assert temperature is not None
        results.append((b.total_power_w(), temperature, b.statistics().energy_j))
    (p_lo, t_lo, e_lo), (p_hi, t_hi, e_hi) = results
    assert p_hi > p_lo * 1.5
    assert t_hi > t_lo + 3.0
    assert e_hi > e_lo


def test_thermal_network_conserves_energy() -> None:
    nodes = [ThermalNode("pkg", 10.0, 4.0), ThermalNode("core", 0.5, 1.5, parent="pkg")]
    net = ThermalNetwork(nodes, ambient_c=25.0)
    dt, seconds, power = 0.001, 30.0, [1.0, 3.0]
    out = 0.0
    for _ in range(int(seconds / dt)):
        net.step(power, dt)
        out += net.heat_to_ambient_w() * dt
    energy_in = sum(power) * seconds
    assert out + net.stored_heat_j() == pytest.approx(energy_in, rel=0.01)
    # Steady state: all of the power leaves into ambient; the package is P_total * R above ambient.
    net.settle(power, seconds=2000.0, dt=0.5)
    assert net.heat_to_ambient_w() == pytest.approx(4.0, rel=1e-3)
    assert net.temps[0] == pytest.approx(25.0 + 4.0 * 4.0, rel=1e-3)
    assert net.temps[1] == pytest.approx(net.temps[0] + 3.0 * 1.5, rel=1e-3)


def test_energy_integrator_exact_for_piecewise_constant_and_trapezoid() -> None:
    e = EnergyIntegrator()
    e.add(2.0, 1.5)
    e.add(4.0, 0.5)
    assert e.energy_j == pytest.approx(5.0) and e.mean_power_w == pytest.approx(2.5)
    s = EnergyIntegrator()
    for k in range(11):
        s.add_sample(k * 0.1, 10.0 * k * 0.1)  # P = 10 t over 1 s -> 5 J
    assert s.energy_j == pytest.approx(5.0)


def test_sim_energy_equals_integral_of_power() -> None:
    b = SimBoard("orin-nx", noise=False)
    b.set_frequency("gpu", 918_000_000)
    b.set_utilisation("gpu", 0.7)
    b.set_utilisation("cluster0", 0.4)
    b.step(0.5)  # let the switch latencies pass
    s0 = b.statistics()
    riemann = 0.0
    dt = 0.001
    for _ in range(5000):
        riemann += b.total_power_w() * dt
        b.step(dt)
    s1 = b.statistics()
    assert s1.energy_j - s0.energy_j == pytest.approx(riemann, rel=2e-3)
    # The input rail is the total; domains + static / efficiency reproduce it.
    assert s1.energy_by_rail_j["VDD_IN"] == pytest.approx(s1.energy_j)
    prof = b.profile
    total = (sum(s1.energy_by_domain_j.values()) + prof.board_static_w * s1.time_s) / prof.converter_efficiency
    assert total == pytest.approx(s1.energy_j)
    assert all(s1.dynamic_energy_by_domain_j[d] <= s1.energy_by_domain_j[d] + 1e-12 for d in b.domains())


def test_step_wise_engages_at_trip_and_releases_with_hysteresis() -> None:
    sw = StepWise(85.0, 2.0, [3, 3])
    assert not sw.update(80.0) and sw.states == [0, 0]
    assert sw.update(85.5) and sw.states == [1, 1]
    assert sw.update(86.0) and sw.states == [2, 2]
    assert sw.update(87.0) and sw.states == [3, 3]
    assert not sw.update(88.0) and sw.states == [3, 3]  # at max
    assert not sw.update(84.0) and sw.states == [3, 3]  # below trip but inside hysteresis: held
    assert not sw.update(83.5)
    assert sw.crossed
    assert sw.update(82.9) and sw.states == [2, 2]  # below trip - hyst and falling: release
    assert sw.update(82.0) and sw.update(81.0) and sw.states == [0, 0]


def test_power_allocator_budget_follows_ipa_rules() -> None:
    ipa = PowerAllocator(75.0, 85.0, 2.1)
    assert ipa.budget_w(70.0, 20.0) is None
    assert ipa.budget_w(75.0, 20.0) == pytest.approx(3 * 2.1)  # k_pu * (Tc - Ton) + SP
    assert ipa.budget_w(85.0, 20.0) == pytest.approx(2.1)
    hot = ipa.budget_w(90.0, 20.0)
    assert hot is not None and hot < 2.1 - 5 * ipa.k_po + 1e-9  # k_po plus a negative integral
    granted = PowerAllocator.divvy(3.0, [1.0, 2.0, 3.0], [10.0, 10.0, 0.5])
    assert sum(granted) == pytest.approx(3.0) and granted[2] == pytest.approx(0.5)


def _load_everything(b: SimBoard) -> None:
    for name, info in b.domains().items():
        b.set_frequency(name, info.available_hz[-1])
        b.set_utilisation(name, 1.0)


@pytest.mark.parametrize(("soc", "ambient"), [("rk3588", 35.0), ("orin-nx", 45.0)])
def test_kernel_throttling_engages_and_releases(soc: str, ambient: float) -> None:
    b = SimBoard(soc, ambient_c=ambient, noise=False)
    _load_everything(b)
    b.step(600.0)
    st = b.statistics()
    assert st.throttle_events > 0 and st.throttled_time_s > 0
    capped = [d for d in b.domains() if b.thermal_cap(d) is not None]
    assert capped
    d = capped[0]
    assert b.frequency(d) < b.domains()[d].available_hz[-1]  # the governor's request is overridden
    layout = b.profile.layout()
    passive = min(z.passive_trip_c for z in layout.zones if z.passive_trip_c is not None)
    # The throttle holds the hottest zone near (not far above) the passive trips.
    assert st.peak_temp_c < passive + 12.0
    for name in b.domains():
        b.set_utilisation(name, 0.0)
    b.step(600.0)
    assert all(b.thermal_cap(n) is None for n in b.domains())
    assert b.statistics().throttled_time_s < b.time_s
    assert b.frequency(d) == b.domains()[d].available_hz[-1]  # the userspace request is honoured again


def test_rk3588_vendor_cap_above_85c() -> None:
    # The NPU is not a power_allocator actor: only the OPP-table high-temp limit (soc > 85 C) caps it.
    b = SimBoard("rk3588", ambient_c=75.0, noise=False)
    for name in ("npu", "memory"):
        b.set_frequency(name, b.domains()[name].available_hz[-1])
        b.set_utilisation(name, 1.0)
    b.step(300.0)
    soc = b.temperature("soc-thermal")
    assert soc is not None and soc > 85.0
    assert b.thermal_cap("npu") == 800_000_000 and b.frequency("npu") == 800_000_000
    cap = b.thermal_cap("cluster4")
    assert cap is not None and cap <= 2_208_000_000
    b.set_utilisation("npu", 0.0)
    b.set_utilisation("memory", 0.0)
    b.step(600.0)
    soc = b.temperature("soc-thermal")
    assert soc is not None and soc < 83.0 and b.thermal_cap("npu") is None
    assert b.frequency("npu") == 1_000_000_000


def test_profiles_cite_sources_and_mark_assumptions() -> None:
    for name in known_socs():
        p = get_profile(name)
        assert p.sources and all("reference" in s for s in p.sources)
        assert p.assumed  # every profile needs figures the references lack
        for d in p.domains:
            assert list(d.available_hz) == sorted(d.available_hz)
    rk = get_profile("rk3588")
    assert [d.name for d in rk.domains] == ["cluster0", "cluster4", "cluster6", "gpu", "npu", "memory"]
    assert rk.domain("cluster4").max_hz == 2_256_000_000
    assert rk3588_profile(a76_bin_khz=2400000).domain("cluster6").max_hz == 2_400_000_000
    assert get_profile("orin-nx").domain("cluster0").max_hz == 1_984_000_000
    assert [m.name for m in get_profile("orin-nx").nvpmodel] == ["MAXN", "10W", "15W", "25W"]


def test_unknown_soc_lists_known_names() -> None:
    with pytest.raises(UnknownSocError, match=r"rk3588.*orin-nx"):
        get_profile("exynos")
    with pytest.raises(UnknownSocError, match="vendor"):
        get_profile("rk3588").layout("jp6")
    assert not math.isnan(SimBoard("orin-agx").statistics().peak_temp_c)


# ---------------------------------------------------------------- stalls, EMC voltage, GPU V/f


def _pinned(soc: str, **hz: int) -> SimBoard:
    """A noise-free board with every domain pinned (userspace) at its top clock, or at ``hz``."""
    b = SimBoard(soc, noise=False)
    for name, info in b.domains().items():
        b.set_frequency(name, hz.get(name, info.available_hz[-1]))
    b.idle(0.1)  # let the switch latencies pass
    return b


def _gpu_phase(b: SimBoard, work: PhaseWork) -> tuple[float, float]:
    """(elapsed s, GPU dynamic energy J) of ``work`` on ``b``."""
    e0 = b.statistics().dynamic_energy_by_domain_j["gpu"]
    t = b.execute(work, tick_s=1.0)
    return t, b.statistics().dynamic_energy_by_domain_j["gpu"] - e0


def test_stalled_unit_draws_its_stall_share_of_busy_power() -> None:
    prof = get_profile("orin-nx")
    gpu = prof.domain("gpu")
    b = _pinned("orin-nx")
    f = gpu.max_hz
    work = PhaseWork(cycles={"gpu": 0.2 * f}, memory_bytes=1.5e11)  # 0.2 s of compute under ~2 s of DRAM
    elapsed, e_dyn = _gpu_phase(b, work)
    t_compute = 0.2
    assert elapsed > 1.0  # memory bound
    expected = gpu.full_power_w(f) * (t_compute + gpu.stall_activity * (elapsed - t_compute))
    assert e_dyn == pytest.approx(expected, rel=1e-6)
    # Without a stall share the same phase draws compute power only (the old, too-optimistic model).
    b0 = SimBoard(_with_stall(prof, 0.0), noise=False)
    for name, info in b0.domains().items():
        b0.set_frequency(name, info.available_hz[-1])
    b0.idle(0.1)
    _, e0 = _gpu_phase(b0, work)
    assert e0 == pytest.approx(gpu.full_power_w(f) * t_compute, rel=1e-6)
    assert e_dyn > 3.0 * e0


def _with_stall(prof: SocProfile, share: float) -> SocProfile:
    doms = tuple(replace(d, stall_activity=share) if d.kind != "memory" else d for d in prof.domains)
    return replace(prof, domains=doms)


def test_lowering_the_core_clock_of_a_memory_bound_phase_saves_energy_not_time() -> None:
    gpu = get_profile("orin-nx").domain("gpu")
    work = PhaseWork(cycles={"gpu": 0.1 * gpu.max_hz}, memory_bytes=1.5e11)
    t_hi, e_hi = _gpu_phase(_pinned("orin-nx"), work)
    t_lo, e_lo = _gpu_phase(_pinned("orin-nx", gpu=gpu.min_hz), work)
    assert t_lo == pytest.approx(t_hi, rel=1e-9)  # still memory bound at the lowest clock
    assert e_lo < 0.6 * e_hi  # a stalled core at a lower clock and voltage burns less


def test_the_kernel_counts_stalls_as_busy_so_ondemand_overclocks_memory_bound_phases() -> None:
    b = SimBoard("rk3588", noise=False)  # GPU under simple_ondemand (30/10)
    b.set_frequency("memory", b.domains()["memory"].available_hz[-1])
    gpu = b.domains()["gpu"]
    assert b.frequency("gpu") < gpu.available_hz[-1]
    seen: list[float] = []
    work = PhaseWork(cycles={"gpu": 2e7}, memory_bytes=2e11)  # < 0.1 s of compute under ~8 s of DRAM
    b.execute(work, tick_s=0.05, on_tick=lambda s: seen.append(s.snapshot().domains["gpu"].utilisation or 0.0))
    assert seen and min(seen[5:]) > 0.99  # the load file / devfreq see a fully busy GPU ...
    assert b.time_in_state("gpu").get(gpu.available_hz[-1], 0.0) > 5.0  # ... and it runs at the top clock
    assert b.statistics().dynamic_energy_by_domain_j["gpu"] > 0.0


def test_waiting_on_another_domain_is_idle_not_a_stall() -> None:
    prof = get_profile("rk3588")
    b = _pinned("rk3588")
    f_gpu = prof.domain("gpu").max_hz
    f_cpu = prof.domain("cluster4").max_hz
    work = PhaseWork(cycles={"gpu": 0.1 * f_gpu, "cluster4": 1.0 * f_cpu})  # no DRAM traffic
    elapsed, e_dyn = _gpu_phase(b, work)
    assert elapsed == pytest.approx(1.0, rel=1e-6)
    assert e_dyn == pytest.approx(prof.domain("gpu").full_power_w(f_gpu) * 0.1, rel=1e-6)


def test_stall_activity_is_checked_and_set_per_unit_type() -> None:
    d = get_profile("rk3588").domain("gpu")
    with pytest.raises(TwinError, match="stall_activity"):
        replace(d, stall_activity=1.5)
    for name in known_socs():
        p = get_profile(name)
        assert "domains.*.stall_activity" in p.assumed  # no published per-unit figure: said so
        for dom in p.domains:
            assert (dom.stall_activity > 0.0) == (dom.kind != "memory")
    rk = get_profile("rk3588")
    assert rk.domain("cluster0").stall_activity < rk.domain("cluster4").stall_activity  # in-order A55


def test_orin_dram_energy_per_byte_falls_with_dvfsc_voltage() -> None:
    mem = get_profile("orin-nx").domain("memory")
    volts = {o.freq_hz: o.voltage_mv for o in mem.opps}
    assert volts == {204_000_000: 900.0, 665_600_000: 900.0, 2_133_000_000: 1050.0, 3_199_000_000: 1050.0}
    work = PhaseWork(memory_bytes=2e9)

    def per_byte(hz: int) -> float:
        b = _pinned("orin-nx", memory=hz)
        e0 = b.statistics().dynamic_energy_by_domain_j["memory"]
        b.execute(work, tick_s=1.0)
        return (b.statistics().dynamic_energy_by_domain_j["memory"] - e0) / work.memory_bytes

    assert per_byte(2_133_000_000) == pytest.approx(per_byte(3_199_000_000), rel=1e-9)
    assert per_byte(665_600_000) == pytest.approx(per_byte(2_133_000_000) * (900 / 1050) ** 2, rel=1e-9)


def test_orin_gpu_voltages_lie_on_the_published_ampere_points() -> None:
    for name in ("orin-nx", "orin-agx", "orin-nano"):
        opps = get_profile(name).domain("gpu").opps
        volts = [o.voltage_mv for o in opps]
        assert volts == sorted(volts) and volts[0] > 668.0 and volts[-1] < 875.0
        for o in opps:  # on the line through (210 MHz, 668 mV) and (1740 MHz, 875 mV)
            assert o.voltage_mv == pytest.approx(668.0 + 207.0 * (o.freq_hz - 210e6) / 1530e6, abs=0.06)


def test_background_load_with_a_stalled_share_is_busy_but_draws_less() -> None:
    b = _pinned("rk3588")
    d = get_profile("rk3588").domain("cluster4")
    full = d.full_power_w(d.max_hz)
    b.set_utilisation("cluster4", 0.8)
    p_compute = b.power("cluster4")
    b.set_utilisation("cluster4", 0.8, stalled=0.5)
    assert b.utilisation("cluster4") == pytest.approx(0.8)  # what the kernel sees is unchanged
    assert p_compute - b.power("cluster4") == pytest.approx(full * 0.8 * 0.5 * (1 - d.stall_activity), rel=1e-9)
    with pytest.raises(TwinError, match="stalled"):
        b.set_utilisation("cluster4", 0.5, stalled=1.2)
