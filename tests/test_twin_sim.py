"""Fast simulation API: domains, frequency control, roofline execute(), snapshots, determinism."""

from __future__ import annotations

import pytest

from hetsched import TwinError, UnsupportedFrequencyError
from hetsched._snapshot import Snapshot
from hetsched._twin.sim import PhaseWork, SimBoard


def test_domains_describe_the_board() -> None:
    rk = SimBoard("rk3588")
    doms = rk.domains()
    assert list(doms) == ["cluster0", "cluster4", "cluster6", "gpu", "npu", "memory"]
    assert doms["cluster4"].kind == "cpu" and doms["cluster4"].cpus == (4, 5)
    assert doms["gpu"].available_hz == tuple(sorted(doms["gpu"].available_hz))
    assert doms["cluster0"].transition_latency_s == pytest.approx(84e-6)
    nx = SimBoard("orin-nx")
    assert list(nx.domains()) == ["cluster0", "cluster4", "gpu", "memory"]
    assert nx.domains()["memory"].available_hz[-1] == 3_199_000_000


def test_set_frequency_validates_and_reports_achieved() -> None:
    b = SimBoard("rk3588", noise=False)
    with pytest.raises(UnsupportedFrequencyError, match="1500000000"):
        b.set_frequency("cluster4", 1_500_000_000)
    with pytest.raises(TwinError, match="cluster9"):
        b.set_frequency("cluster9", 408_000_000)
    assert b.set_frequency("cluster4", 1_608_000_000) == 1_608_000_000
    assert b.frequency("cluster4") == 1_608_000_000
    assert b.governor("cluster4") == "userspace"
    with pytest.raises(TwinError):
        b.set_utilisation("gpu", 1.5)


def test_kernel_governor_follows_load_until_set() -> None:
    b = SimBoard("rk3588", noise=False)
    assert b.frequency("cluster4") == 408_000_000  # ondemand at idle
    b.set_utilisation("cluster4", 1.0)
    b.step(0.2)
    assert b.frequency("cluster4") == 2_256_000_000  # ondemand: above 80 % load -> max
    b.set_governor("cluster4", "powersave")
    assert b.frequency("cluster4") == 408_000_000
    with pytest.raises(TwinError, match="available"):
        b.set_governor("cluster4", "turbo")


def _pinned(soc: str = "rk3588") -> SimBoard:
    b = SimBoard(soc, noise=False)
    for name, info in b.domains().items():
        b.set_frequency(name, info.available_hz[-1])
    b.step(0.1)  # past every switch latency
    return b


def test_execute_compute_bound_scales_with_core_clock() -> None:
    work = PhaseWork(cycles={"gpu": 5e8})
    b = _pinned()
    t_hi = b.execute(work)
    assert t_hi == pytest.approx(5e8 / 1e9, rel=1e-3)
    b.set_frequency("gpu", 500_000_000)
    b.step(0.1)
    t_lo = b.execute(work)
    assert t_lo == pytest.approx(2 * t_hi, rel=1e-3)
    # Memory clock does not matter for compute-bound work.
    b.set_frequency("memory", 528_000_000)
    b.step(0.1)
    assert b.execute(work) == pytest.approx(t_lo, rel=1e-3)


def test_execute_memory_bound_scales_with_memory_clock_and_overlap() -> None:
    b = _pinned()
    bw = 2_112_000_000 * 16 * 0.7
    mem = PhaseWork(cycles={"cluster4": 1e6}, memory_bytes=bw * 0.5)
    assert b.execute(mem) == pytest.approx(0.5, rel=1e-3)
    b.set_frequency("memory", 1_068_000_000)
    b.step(0.1)
    assert b.execute(mem) == pytest.approx(0.5 * 2112 / 1068, rel=1e-3)
    # overlap 0: serial sum of compute and memory; fixed_s adds independently of clocks.
    serial = PhaseWork(cycles={"cluster4": 2.256e8}, memory_bytes=1_068_000_000 * 16 * 0.7 * 0.1, overlap=0.0, fixed_s=0.05)
    assert b.execute(serial) == pytest.approx(0.1 + 0.1 + 0.05, rel=1e-3)


def test_execute_clock_independent_time_is_exact_after_idle() -> None:
    b = _pinned()
    b.idle(3.7)
    assert b.execute(PhaseWork(fixed_s=0.05)) == pytest.approx(0.05, abs=1e-9)
    assert b.execute(PhaseWork(fixed_s=0.237), tick_s=0.01) == pytest.approx(0.237, abs=1e-9)
    t0 = b.time_s
    assert b.idle(1.25, tick_s=0.1, on_tick=lambda _b: None) == 1.25
    assert b.time_s == pytest.approx(t0 + 1.25)


def test_execute_changes_energy_and_calls_governor_between_ticks() -> None:
    work = PhaseWork(cycles={"gpu": 4e8}, memory_bytes=1e9)
    energies = []
    for hz in (1_000_000_000, 300_000_000):
        b = _pinned()
        b.set_frequency("gpu", hz)
        b.step(0.1)
        e0 = b.statistics().energy_by_domain_j["gpu"]
        b.execute(work)
        energies.append(b.statistics().energy_by_domain_j["gpu"] - e0)
    assert energies[0] > energies[1]  # higher V^2 f costs more energy for the same cycles

    b = _pinned()
    calls: list[float] = []

    def governor(board: SimBoard) -> None:
        calls.append(board.time_s)
        if len(calls) == 5:
            board.set_frequency("gpu", 300_000_000)

    elapsed = b.execute(PhaseWork(cycles={"gpu": 1e8}), tick_s=0.01, on_tick=governor)
    # 50 ms at 1 GHz, then the rest at 300 MHz (after the 1 ms switch latency).
    assert len(calls) == pytest.approx(elapsed / 0.01, abs=1.01)
    assert 0.1 < elapsed < 0.334
    assert b.utilisation("gpu") == 0.0  # work utilisation removed after execute


def test_execute_rejects_bad_work() -> None:
    b = SimBoard("orin-nx")
    with pytest.raises(TwinError, match="npu"):
        b.execute(PhaseWork(cycles={"npu": 1.0}))
    with pytest.raises(TwinError):
        PhaseWork(cycles={"gpu": -1.0})
    with pytest.raises(TwinError):
        PhaseWork(overlap=2.0)
    assert b.execute(PhaseWork()) == 0.0


def test_snapshot_rails_and_sources() -> None:
    rk = SimBoard("rk3588").snapshot()
    assert isinstance(rk, Snapshot) and rk.soc == "rk3588"
    assert rk.rails and all(r.source == "estimated" for r in rk.rails.values())
    assert rk.zones["soc-thermal"].passive_trip_c == 75.0
    assert rk.total_power_w is not None and 1.0 < rk.total_power_w < 2.0
    assert len(rk.cpu_utilisation) == 8
    nx = SimBoard("orin-nx").snapshot()
    assert set(nx.rails) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert all(r.source == "measured" for r in nx.rails.values())
    assert nx.zones["cv0-thermal"].temp_c is None  # fused off on NX
    assert nx.domains["gpu"].kind == "gpu" and nx.domains["cluster4"].cpus == (4, 5, 6, 7)


def _trace(seed: int) -> list[object]:
    b = SimBoard("orin-nx", seed=seed)
    out: list[object] = []
    for k in range(5):
        b.set_utilisation("gpu", k / 5)
        b.execute(PhaseWork(cycles={"gpu": 2e7, "cluster0": 1e7}, memory_bytes=5e7))
        s = b.snapshot()
        out.append((s.time_s, tuple(z.temp_c for z in s.zones.values()), tuple(r.power_w for r in s.rails.values())))
    return out


def test_sim_is_deterministic_by_seed() -> None:
    assert _trace(1) == _trace(1)
    assert _trace(1) != _trace(2)
    quiet = SimBoard("rk3588", noise=False)
    assert quiet.snapshot().zones == quiet.snapshot().zones


def test_statistics_is_frozen() -> None:
    b = SimBoard("orin-nano")
    b.idle(2.0)
    s = b.statistics()
    assert s.time_s == pytest.approx(2.0) and s.energy_j > 0 and s.mean_power_w > 0
    with pytest.raises(AttributeError):
        s.time_s = 0.0  # type: ignore[misc]
