"""Telemetry cost and fast-simulation speed.

Prints progress lines, then one final JSON line:

* ``sample_us``: median wall time of one full :meth:`Telemetry.sample_once` on a
  twin board tree (every clock, load, zone and rail of the board; the slowest
  of the profiles measured is reported; target <= 1000);
* ``sim_seconds_per_wall_second``: simulated board seconds per wall second of
  the twin's fast virtual-time simulation of a loaded board with a trivial
  decision callback every 10 ms of simulated time (target >= 360).

Usage: ``python benchmarks/telemetry.py [--samples N] [--sim-seconds S]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from _labels import host, labelled, measured


def bench_sample(soc: str, samples: int) -> dict[str, Any]:
    from hetsched import Telemetry, discover
    from hetsched.lowlevel import power_estimator_for
    from hetsched.testing import build_board_tree

    with tempfile.TemporaryDirectory(prefix=f"hetsched-bench-{soc}-") as root:
        build_board_tree(root, soc)
        platform = discover(root)
        tm = Telemetry(root, capacity=64, platform=platform, estimator=power_estimator_for(platform))
        for _ in range(20):  # warm caches (dentries, bytecode)
            tm.sample_once()
        times = []
        for _ in range(samples):
            t0 = time.perf_counter_ns()
            tm.sample_once()
            times.append(time.perf_counter_ns() - t0)
        snap = tm.latest()
        reads_per_sample = tm._fs.statistics().reads / tm.statistics().samples
    return {
        "soc": soc,
        "median_us": statistics.median(times) / 1000.0,
        "p90_us": statistics.quantiles(times, n=10)[-1] / 1000.0,
        "domains": len(snap.domains),
        "zones": len(snap.zones),
        "rails": len(snap.rails),
        "reads_per_sample": round(reads_per_sample, 1),
    }


def bench_sim(sim_seconds: float, soc: str = "rk3588") -> dict[str, Any] | None:
    """Simulated seconds per wall second of the twin's fast simulation; None without its API.

    The board is loaded (every domain 85 % busy, so clocks ramp up, it heats and the
    kernel throttles), and a decision callback runs every 10 ms of simulated time. The
    callback is what a governor would do, minus its policy: read the board state and
    act on it (here: if the hottest passive-trip headroom drops under 5 C, cap the big
    cluster one step lower, else release it). A second run also builds the full
    :class:`Snapshot` the governor consumes at every decision.
    """
    try:
        from hetsched import SimBoard
    except ImportError:
        return None

    def run(snapshot_each_tick: bool) -> tuple[float, int]:
        board = SimBoard(soc, seed=1)
        for name in board.domains():
            board.set_utilisation(name, 0.85)
        big = next(n for n, d in board.domains().items() if d.kind == "cpu" and n != "cluster0")
        avail = board.domains()[big].available_hz
        zones = [z.type for z in board.layout.zones if z.passive_trip_c is not None and not z.offline]
        passive = {z.type: z.passive_trip_c for z in board.layout.zones}
        decisions = 0

        def decide(b: SimBoard) -> None:
            nonlocal decisions
            decisions += 1
            if snapshot_each_tick:
                headroom = b.snapshot().hottest_headroom_c()
            else:
                headroom = min(passive[z] - (b.temperature(z) or 0.0) for z in zones) if zones else None
            cur_max = b.user_limits(big)[1]
            k = avail.index(cur_max)
            if headroom is not None and headroom < 5.0 and k > 0:
                b.set_limits(big, max_hz=avail[k - 1])
            elif (headroom is None or headroom > 8.0) and k < len(avail) - 1:
                b.set_limits(big, max_hz=avail[k + 1])

        t0 = time.perf_counter()
        board.idle(sim_seconds, tick_s=0.01, on_tick=decide)
        return time.perf_counter() - t0, decisions

    wall, decisions = run(False)
    wall_snap, _ = run(True)
    return {
        "sim_seconds_per_wall_second": round(sim_seconds / wall, 1),
        "sim_seconds_per_wall_second_with_snapshots": round(sim_seconds / wall_snap, 1),
        "sim_soc": soc,
        "sim_seconds": sim_seconds,
        "sim_decisions": decisions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--sim-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)

    result: dict[str, Any] = {}
    boards = []
    for soc in ("rk3588", "orin-nx", "orin-agx", "orin-nano"):
        row = bench_sample(soc, args.samples)
        boards.append(row)
        print(f"sample {soc:<10} median {row['median_us']:7.1f} us  p90 {row['p90_us']:7.1f} us  "
              f"({row['reads_per_sample']} reads: {row['domains']} domains, {row['zones']} zones, {row['rails']} rails)")
    result["sample_us"] = round(max(r["median_us"] for r in boards), 1)
    result["sample_us_by_soc"] = {r["soc"]: round(r["median_us"], 1) for r in boards}

    sim = bench_sim(args.sim_seconds)
    if sim is None:
        print("sim: hetsched.SimBoard fast-simulation API not available; sim_seconds_per_wall_second omitted")
    else:
        print(f"sim {sim['sim_soc']}: {sim['sim_seconds']:g} board s with a decision every 10 ms: "
              f"{sim['sim_seconds_per_wall_second']:g} board s per wall s "
              f"({sim['sim_seconds_per_wall_second_with_snapshots']:g} when each decision builds a Snapshot)")
        result.update(sim)
    print(json.dumps(labelled(result, board=host(), figures=measured("sampling a twin's tree; sim speed in wall time"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
