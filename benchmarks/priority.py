"""Urgent requests under bulk load: HIGH p99 latency with the devices and the link saturated.

Two devices with memory that is *not* shared (``Topology.discrete``): ``host-cpu`` (core 0,
host memory) and ``acc`` (core 1, its own memory domain, like an accelerator behind a board
link). A light model (weights folded, ``benchmarks/_light.py``) is split in two stages, one
per device, at a large activation, so every request moves that tensor across the link.
The link is modelled with the transfer engine's ``rate_limited_copy`` (``--link-mbps``,
256 MB/s by default: the ~1.6 MB activation takes about as long to move as the model takes
to compute), copied in ``--chunk-kib`` chunks.

Load: ``--bg-clients`` tasks issue BACKGROUND requests back to back, so both devices and the
link always have work queued. HIGH requests are issued one at a time at ``--interval-ms``
gaps and their latency (issue to result) is recorded, unloaded and under that load,
alternating in rounds so drift on this shared machine hits both alike. The same runs with
``priorities=False`` (plain FIFO everywhere) give the contrast.

Fields: ``high_p99_ratio`` (HIGH p99 under load / HIGH p99 unloaded, target <= 1.5),
``fifo_high_p99_ratio`` (the same without priorities), ``transfer_preemptions`` (> 0: HIGH
copies took the link from BACKGROUND ones at chunk boundaries, which resumed where they were).

    .venv/bin/python benchmarks/priority.py [--rounds 6] [--high-per-round 25]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from _labels import host, labelled, measured

import hetsched
from hetsched import Device, Priority, Session
from hetsched.lowlevel import Topology, rate_limited_copy
from hetsched.policies import Pinned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _light import folded, random_feeds


def p99(v: list[float]) -> float:
    return float(np.percentile(v, 99))


async def high_latencies(s: Session, feeds: dict[str, np.ndarray], n: int, interval: float, *, load: int,
                         warm: float) -> list[float]:
    lat: list[float] = []
    async with anyio.create_task_group() as tg:

        async def background() -> None:
            while True:
                await s.run(feeds, priority=Priority.BACKGROUND)

        for _ in range(load):
            tg.start_soon(background)
        if load:
            await anyio.sleep(warm)  # queues and the link fill up
        for _ in range(n):
            t0 = time.perf_counter()
            await s.run(feeds, priority=Priority.HIGH)
            lat.append(time.perf_counter() - t0)
            await anyio.sleep(interval)
        tg.cancel_scope.cancel()  # the background requests in flight are cancelled (and clean up)
    return lat


async def main(args: argparse.Namespace) -> dict[str, Any]:
    model = folded(args.model)
    feeds = random_feeds(model)
    cpus = sorted(os.sched_getaffinity(0))
    host = Device(name="host-cpu", cpus=(cpus[0],))
    acc = Device(name="acc", cpus=(cpus[-1],), memory_domain="acc")
    topo = Topology.discrete("host", ["acc"])
    n = len(model.graph.node)
    cut = math.ceil(n * args.cut)

    def place(u: Any) -> str:
        return "host-cpu" if u.id == 0 else "acc"

    memory = hetsched.Memory(topology=topo, chunk_bytes=args.chunk_kib << 10,
                             copy_fn=rate_limited_copy(args.link_mbps * 1e6))
    common = dict(devices=[host, acc], policy=Pinned(place), max_unit_nodes=cut, memory=memory,
                  max_in_flight=args.bg_clients + 4)
    lat: dict[str, dict[str, list[float]]] = {m: {"idle": [], "load": []} for m in ("prio", "fifo")}
    async with Session(model, **common) as prio, Session(model, scheduling=hetsched.Scheduling(priorities=False), **common) as fifo:
        assert [st.device for st in prio.plan.stages] == ["host-cpu", "acc"], prio.plan.table()
        crossing = [v for v in prio.plan.stages[1].inputs if v in prio.plan.stages[0].outputs]
        for s in (prio, fifo):
            for _ in range(3):
                await s.run(feeds, priority=Priority.HIGH)
        interval = args.interval_ms / 1e3
        for r in range(args.rounds):
            for mode, s in (("prio", prio), ("fifo", fifo)) if r % 2 == 0 else (("fifo", fifo), ("prio", prio)):
                lat[mode]["idle"] += await high_latencies(s, feeds, args.high_per_round, interval, load=0, warm=0)
                lat[mode]["load"] += await high_latencies(s, feeds, args.high_per_round, interval,
                                                          load=args.bg_clients, warm=args.warm_s)
        st_p, st_f = prio.statistics(), fifo.statistics()
    assert st_p.transfers is not None and st_f.transfers is not None
    boundary_bytes = st_p.transfers.bytes // max(1, st_p.transfers.transfers)
    ms = {m: {k: round(p99(v) * 1e3, 2) for k, v in d.items()} for m, d in lat.items()}
    med = {m: {k: round(statistics.median(v) * 1e3, 2) for k, v in d.items()} for m, d in lat.items()}
    return {
        "model": args.model,
        "stages": ["host-cpu", "acc"],
        "crossing": crossing,
        "bytes_per_transfer_avg": boundary_bytes,
        "link_mbps": args.link_mbps,
        "chunk_kib": args.chunk_kib,
        "bg_clients": args.bg_clients,
        "high_samples": len(lat["prio"]["load"]),
        "high_p99_ms": ms["prio"],
        "high_median_ms": med["prio"],
        "fifo_high_p99_ms": ms["fifo"],
        "fifo_high_median_ms": med["fifo"],
        "background_completed": st_p.requests_completed - 2 * len(lat["prio"]["load"]) - 3,
        "transfer_suspended_s": round(st_p.transfers.suspended_seconds, 3),
        "fifo_transfer_preemptions": st_f.transfers.preemptions,
        "high_median_ratio": round(med["prio"]["load"] / med["prio"]["idle"], 3),
        "fifo_high_median_ratio": round(med["fifo"]["load"] / med["fifo"]["idle"], 3),
        "high_p99_ratio": round(ms["prio"]["load"] / ms["prio"]["idle"], 3),
        "fifo_high_p99_ratio": round(ms["fifo"]["load"] / ms["fifo"]["idle"], 3),
        "transfer_preemptions": st_p.transfers.preemptions,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--cut", type=float, default=0.25, help="fraction of the nodes in the first (host) stage")
    ap.add_argument("--link-mbps", type=float, default=256.0, help="modelled link rate, MB/s")
    ap.add_argument("--chunk-kib", type=int, default=64)
    ap.add_argument("--bg-clients", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--high-per-round", type=int, default=25)
    ap.add_argument("--interval-ms", type=float, default=15.0)
    ap.add_argument("--warm-s", type=float, default=0.3)
    print(json.dumps(labelled(anyio.run(main, ap.parse_args()), board=host(), figures=measured("wall time"))))
