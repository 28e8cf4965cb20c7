"""The SoC twin's figures beside published ones (one row each), by running the simulation.

Every twin figure below is *measured from the fast simulation* (``SimBoard``) under the load the
published figure describes; nothing is copied from the published figure into the result. Each
row names its source by key; ``docs/sources.md`` resolves the keys to public primary sources and
``docs/twin-calibration.md`` explains each comparison.

Prints a table, then one final JSON line with ``rows`` and ``max_rel_error`` (target <= 0.25).

    .venv/bin/python benchmarks/twin_calibration.py
"""

from __future__ import annotations

import json
import sys

from _labels import MODELLED, labelled, twin

from hetsched import PhaseWork, SimBoard, SocProfile, get_profile, rk3588_profile


def _mean_power(board: SimBoard, seconds: float, what: str = "total") -> float:
    e0 = board.statistics()
    board.step(seconds)
    e1 = board.statistics()
    if what == "total":
        return (e1.energy_j - e0.energy_j) / seconds
    raise ValueError(what)


def rk3588_all_cores_rise() -> float:
    """ROCK 5B: board power rise with all 8 cores busy at their top clocks (7-zip-like, 30 s)."""
    b = SimBoard("rk3588", noise=False)
    idle = _mean_power(b, 30.0)
    for name, info in b.domains().items():
        if info.kind == "cpu":
            b.set_frequency(name, info.available_hz[-1])
            b.set_utilisation(name, 1.0)
    busy = _mean_power(b, 30.0)
    return busy - idle


def _em_power(profile: SocProfile, domain: str, hz: int, util: float, seconds: float = 1.0) -> float:
    """Energy-model (dynamic) power of ``domain`` at ``hz`` and ``util``, from the sim's integrator."""
    b = SimBoard(profile, noise=False)
    b.set_frequency(domain, hz)
    b.set_utilisation(domain, util)
    e0 = b.statistics().dynamic_energy_by_domain_j[domain]
    b.step(seconds)
    return (b.statistics().dynamic_energy_by_domain_j[domain] - e0) / seconds


def mali_1ghz() -> float:
    return _em_power(get_profile("rk3588"), "gpu", 1_000_000_000, 1.0)


def a76_core_2g4() -> float:
    # One of cluster4's two cores busy at the 2.4 GHz PVTM bin.
    return _em_power(rk3588_profile(a76_bin_khz=2400000), "cluster4", 2_400_000_000, 0.5)


def a55_core_1g8() -> float:
    return _em_power(get_profile("rk3588"), "cluster0", 1_800_000_000, 0.25)


def orin_nx_idle_vdd_in() -> float:
    b = SimBoard("orin-nx", noise=False)
    e0 = b.statistics().energy_by_rail_j["VDD_IN"]
    b.step(60.0)
    return (b.statistics().energy_by_rail_j["VDD_IN"] - e0) / 60.0


# YOLOv5s INT8 at 320x320 (assumed per-frame work; docs/twin-calibration.md):
#   GPU: ~4.1 GOPs (16.5 GFLOPs at 640 scaled by 1/4) at an effective 2048 ops/cycle (~6 % of
#        the tensor-core peak, typical for a small detector) -> 2.0e6 GPU cycles;
#   DRAM: ~60 MB per frame (7 MB INT8 weights + activations in and out);
#   CPU: letterbox/normalise + NMS ~6.6e6 core cycles on one core -> 1.65e6 cluster cycles of
#        the 4-core cluster (cycles are cluster cycles);
#   fixed: 0.8 ms per frame of launch/synchronisation that no clock speeds up.
YOLO_FRAME = PhaseWork(
    cycles={"gpu": 2.0e6, "cluster0": 1.65e6},
    memory_bytes=60e6,
    fixed_s=0.8e-3,
    overlap=1.0,
)


def orin_nx_yolo_split() -> tuple[float, float, float]:
    """Mean CPU / GPU / DDR power over 60 s of back-to-back YOLOv5s frames in the default 15W mode."""
    b = SimBoard("orin-nx", noise=False)
    prof = b.profile
    mode = next(m for m in prof.nvpmodel if m.id == prof.nvpmodel_default)
    for name, info in b.domains().items():
        if info.kind == "cpu":
            b.set_frequency(name, max(f for f in info.available_hz if f <= mode.cpu_max_hz))
        elif info.kind == "gpu":
            b.set_frequency(name, max(f for f in info.available_hz if f <= mode.gpu_max_hz))
        elif info.kind == "memory":
            cap = mode.emc_max_hz or info.available_hz[-1]
            b.set_frequency(name, max(f for f in info.available_hz if f <= cap))
    b.idle(1.0)
    s0 = b.statistics()
    t0 = b.time_s
    while b.time_s - t0 < 60.0:
        b.execute(YOLO_FRAME)
    s1 = b.statistics()
    dt = b.time_s - t0

    def p(names: list[str]) -> float:
        return sum(s1.energy_by_domain_j[n] - s0.energy_by_domain_j[n] for n in names) / dt

    cpus = [n for n, i in b.domains().items() if i.kind == "cpu"]
    return p(cpus), p(["gpu"]), p(["memory"])


def main() -> int:
    cpu, gpu, ddr = orin_nx_yolo_split()
    rows = [
        ("RK3588 board power rise, 8 cores busy at top clocks (ROCK 5B, W)", rk3588_all_cores_rise(), 6.0,
         "[rock5b-power] Thomas Kaiser, ROCK 5B 7-zip"),
        ("Mali-G610 at 1 GHz fully busy, energy model (W)", mali_1ghz(), 2.15, "[rk-mainline-dts] C=2982 at 850 mV"),
        ("One A76 core at 2.4 GHz, energy model (W)", a76_core_2g4(), 0.998, "[rk-mainline-dts] C=416 at 1000 mV"),
        ("One A55 core at 1.8 GHz, energy model (W)", a55_core_1g8(), 0.370, "[rk-mainline-dts] C=228 at 950 mV"),
        ("Orin NX idle VDD_IN (W; published 3.3-5.8, middle)", orin_nx_idle_vdd_in(), (3.3 + 5.8) / 2,
         "[tegrastats] sample lines"),
        ("Orin NX YOLOv5s INT8: CPU (W)", cpu, 1.2, "[practitioner-yolo]"),
        ("Orin NX YOLOv5s INT8: GPU (W)", gpu, 2.9, "[practitioner-yolo]"),
        ("Orin NX YOLOv5s INT8: DDR (W)", ddr, 1.4, "[practitioner-yolo]"),
    ]
    out = []
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'twin':>7}  {'published':>9}  {'rel.err':>7}")
    for name, value, pub, src in rows:
        err = abs(value - pub) / pub
        print(f"{name:<{width}}  {value:7.3f}  {pub:9.3f}  {err:7.1%}")
        out.append({"figure": name, "twin": round(value, 4), "published": pub, "rel_error": round(err, 4), "source": src})
    max_err = max(r["rel_error"] for r in out)
    print(json.dumps(labelled({"benchmark": "twin_calibration", "rows": out, "max_rel_error": max_err, "target": 0.25},
                              board=twin("rk3588", "orin-nx"), figures=MODELLED + ", against published measurements")))
    return 0 if max_err <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
