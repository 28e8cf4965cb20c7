"""Fast-simulation speed: simulated seconds per wall second of a loaded twin board with a
governor decision (a fresh telemetry snapshot and a pure decision) every 10 ms.

Target >= 360 (an hour of board time in ten seconds). Prints one row per board and a final
JSON line with ``sim_seconds_per_wall_second`` (the worst board).

    .venv/bin/python benchmarks/twin_speed.py [--seconds 600]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _labels import host, labelled, measured

from hetsched import PhaseWork, SimBoard, Snapshot


def decide(snap: Snapshot, step: int) -> dict[str, int]:
    """A stand-in governor decision: pure, from the snapshot only (headroom-driven GPU clock)."""
    headroom = snap.hottest_headroom_c()
    gpu = snap.domains["gpu"]
    avail = gpu.available_hz
    idx = avail.index(gpu.freq_hz) if gpu.freq_hz in avail else len(avail) - 1
    if headroom is not None and headroom < 5.0 and idx > 0:
        idx -= 1
    elif step % 100 == 0:
        idx = (idx + 1) % len(avail)
    return {"gpu": avail[idx]} if avail[idx] != gpu.freq_hz else {}


def run(soc: str, seconds: float) -> float:
    board = SimBoard(soc, seed=1)
    doms = board.domains()
    for name, info in doms.items():
        board.set_frequency(name, info.available_hz[-1])
    cpu = next(n for n, i in doms.items() if i.kind == "cpu")
    phases = (
        PhaseWork(cycles={"gpu": 3e8, cpu: 5e7}, memory_bytes=3e9),  # model: compute + memory
        PhaseWork(cycles={cpu: 8e7}, memory_bytes=2e8, fixed_s=0.01),  # pre/post-processing
        PhaseWork(fixed_s=0.05),  # idle gap
    )
    steps = [0]

    def governor(b: SimBoard) -> None:
        steps[0] += 1
        for dom, hz in decide(b.snapshot(), steps[0]).items():
            b.set_frequency(dom, hz)

    t0 = time.perf_counter()
    while board.time_s < seconds:
        for w in phases:
            board.execute(w, tick_s=0.01, on_tick=governor)
    wall = time.perf_counter() - t0
    return board.time_s / wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600.0)
    args = ap.parse_args()
    rates = {}
    for soc in ("rk3588", "orin-nx"):
        rates[soc] = run(soc, args.seconds)
        print(f"{soc:8s} {rates[soc]:8.0f} simulated s per wall s")
    worst = min(rates.values())
    print(json.dumps(labelled({"benchmark": "twin_speed", "per_board": {k: round(v) for k, v in rates.items()},
                      "sim_seconds_per_wall_second": round(worst), "target": 360},
                              board=host(), figures=measured("simulated seconds per wall second"))))
    return 0 if worst >= 360 else 1


if __name__ == "__main__":
    sys.exit(main())
