"""A governed Session end to end on a live twin: energy per request, deadlines, clock writes.

On an in-process live rk3588 and orin-nx twin (labelled simulators), one frame-paced
inference loop (``light_squeezenet``, one request per frame period, each due within the frame
deadline) runs four ways on the same session and board:

* ``ungoverned``: the twin's kernel governors (what ``hetsched run`` without ``--governor`` gets);
* ``performance``: every cpufreq policy and devfreq device on ``performance``;
* ``governed``: :class:`hetsched.Governor` with ``loop_deadline_s`` = the deadline (what
  ``hetsched run --governor phase --frame-deadline-ms`` does), after its tuning has ended;
* ``frontier``: every accelerator OPP fixed in turn (userspace), the rest as ungoverned: the
  exhaustive, *measured* least energy per request any fixed accelerator clock reaches.

Board time is the session's modelled time, so nothing depends on this host's speed: each
stage advances the twin by its modelled seconds (after the governor's write for the phase
has been applied), each frame's remainder is idle board time, and the governor's clock is
the twin's. ``energy_per_request_j`` is the session's modelled stage energy (``hetsched run
--json``'s figure); ``board_energy_per_request_j`` the twin's rail energy over the frames
(idle included). A deadline is missed when a request's board latency exceeds it. Writes per
domain per second are over the board seconds of the measured (post-tuning) frames.

    .venv/bin/python benchmarks/governed_session.py [--frames 100] [--deadline-ms 33]

Final line: one JSON object; ``summary`` holds the worst case over the boards.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from hetsched import EventInfo, Hooks, LiveTwin, Session
from hetsched.backends.sim import clock_from_root, twin_devices

TARGETS = {
    "energy_vs_ungoverned": "<= 0.9",
    "extra_deadline_misses": "<= 0",
    "max_writes_per_domain_per_s": "<= 4",
}
MODEL = "light_squeezenet"


class BoardTime(Hooks):
    """Drives the twin's board time from the session's modelled work (concurrency 1), and
    forwards the phases to the governor hooks of the case running (``inner``)."""

    def __init__(self, twin: LiveTwin) -> None:
        self.twin = twin
        self.session: Any = None
        self.inner: Hooks | None = None
        self.request_t0 = 0.0
        self.latencies: list[float] = []

    def request_start(self, info: EventInfo) -> None:
        self.request_t0 = self.twin.sim.time_s
        if self.inner is not None:
            self.inner.request_start(info)
        self.twin.advance(0.0)

    def before_stage(self, info: EventInfo) -> None:
        if self.inner is not None:
            self.inner.before_stage(info)
        self.twin.advance(0.0)  # the write for the phase takes effect before the stage reads its clocks

    def after_stage(self, info: EventInfo) -> None:
        stats = self.session.stage_statistics().get(info.stage)
        self.twin.advance(float(getattr(stats, "last_modelled_s", 0.0)))
        if self.inner is not None:
            self.inner.after_stage(info)

    def request_end(self, info: EventInfo) -> None:
        self.latencies.append(self.twin.sim.time_s - self.request_t0)
        if self.inner is not None:
            self.inner.request_end(info)


def _knob_paths(root: Path) -> list[Path]:
    return [*root.glob("sys/devices/system/cpu/cpufreq/policy*/scaling_governor"),
            *root.glob("sys/class/devfreq/*/governor")]


def _devfreq_governor(root: Path, device: str) -> Path | None:
    return next((p for p in root.glob("sys/class/devfreq/*/governor") if device in p.parent.name), None)


async def _frames(s: Any, clock: BoardTime, feeds: dict, n: int, period_s: float, deadline_s: float,
                  gov: Any = None) -> dict[str, Any]:
    twin = clock.twin
    e_session0 = s.statistics().energy_j or 0.0
    e_board0 = twin.statistics().energy_j
    t0 = twin.sim.time_s
    w0 = dict(gov.statistics().writes_by_domain) if gov is not None else {}
    clock.latencies = []
    for _ in range(n):
        start = twin.sim.time_s
        await s.run(feeds)
        rest = period_s - (twin.sim.time_s - start)
        if rest > 0:
            twin.advance(rest)
    board_s = twin.sim.time_s - t0
    out: dict[str, Any] = {
        "energy_per_request_j": ((s.statistics().energy_j or 0.0) - e_session0) / n,
        "board_energy_per_request_j": (twin.statistics().energy_j - e_board0) / n,
        "deadline_misses": sum(1 for t in clock.latencies if t > deadline_s),
        "latency_ms_median": float(np.median(clock.latencies)) * 1e3,
        "board_s": board_s,
    }
    if gov is not None:
        w1 = gov.statistics().writes_by_domain
        out["writes_per_domain_per_s"] = {d: (w1.get(d, 0) - w0.get(d, 0)) / board_s for d in w1}
    return out


async def _board(soc: str, frames: int, deadline_ms: float) -> dict[str, Any]:
    from hetsched import Governor, GovernorConfig, GovernorHooks, Phase

    period_s = deadline_s = deadline_ms / 1e3
    with tempfile.TemporaryDirectory(prefix="hetsched-governed-") as tmp:
        root = Path(tmp)
        twin = LiveTwin(soc, root, noise=False)
        twin.advance(0.0)
        clock = BoardTime(twin)
        devices = twin_devices(soc, clock=clock_from_root(str(root)), root=str(root))
        async with Session(MODEL, devices=devices, root=str(root), hooks=[clock], replanning=None) as s:
            clock.session = s
            first = s.get_inputs()[0]
            shape = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
            feeds = {first.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
            accel = sorted({st.device for st in s.plan.stages})
            res: dict[str, Any] = {"plan": accel}
            await _frames(s, clock, feeds, 10, period_s, deadline_s)  # warm: kernel governors settle
            res["ungoverned"] = await _frames(s, clock, feeds, frames, period_s, deadline_s)

            saved = {p: p.read_bytes() for p in _knob_paths(root)}
            for p in saved:
                p.write_text("performance")
            twin.advance(0.0)
            res["performance"] = await _frames(s, clock, feeds, frames, period_s, deadline_s)
            for p, raw in saved.items():
                p.write_bytes(raw)
            twin.advance(0.0)

            gov = Governor(root, clock=lambda: twin.sim.time_s, handle_signals=False, tick_period_s=0,
                           config=GovernorConfig(loop_deadline_s=deadline_s), workload=MODEL)
            async with gov:
                clock.inner = GovernorHooks(gov)
                tuning = 0
                while not gov.engine.tuning_done or Phase.INFER not in gov.engine.models():
                    await _frames(s, clock, feeds, 20, period_s, deadline_s)
                    tuning += 20
                    if tuning >= 4000:
                        break
                res["governed"] = await _frames(s, clock, feeds, frames, period_s, deadline_s, gov)
                st = gov.statistics()
                res["governed"].update({"tuning_frames": tuning, "tuned": gov.engine.tuning_done,
                                        "locked_domains": list(st.locked_domains),
                                        "clocks": dict(st.phases[Phase.INFER].clocks) if Phase.INFER in st.phases else {}})
            clock.inner = None
            twin.advance(0.0)

            frontier = []
            for dev in accel:
                path = _devfreq_governor(root, dev)
                if path is None:
                    continue
                raw = path.read_bytes()
                levels = [int(x) for x in (path.parent / "available_frequencies").read_text().split()]
                for hz in levels:
                    path.write_text("userspace")
                    twin.advance(0.0)
                    (path.parent / "userspace" / "set_freq").write_text(str(hz))
                    twin.advance(0.0)
                    r = await _frames(s, clock, feeds, max(10, frames // 10), period_s, deadline_s)
                    frontier.append({"device": dev, "hz": hz, **{k: r[k] for k in (
                        "energy_per_request_j", "board_energy_per_request_j", "deadline_misses")}})
                path.write_bytes(raw)
                twin.advance(0.0)
            res["frontier"] = frontier
    return res


def _ratios(res: dict[str, Any]) -> dict[str, Any]:
    un, gv, pf = res["ungoverned"], res["governed"], res["performance"]
    ok = [f for f in res["frontier"] if f["deadline_misses"] <= un["deadline_misses"]]
    best = min((f["energy_per_request_j"] for f in ok), default=None)
    return {
        "energy_vs_ungoverned": gv["energy_per_request_j"] / un["energy_per_request_j"],
        "energy_vs_performance": gv["energy_per_request_j"] / pf["energy_per_request_j"],
        "board_energy_vs_ungoverned": gv["board_energy_per_request_j"] / un["board_energy_per_request_j"],
        "frontier_best_vs_ungoverned": None if best is None else best / un["energy_per_request_j"],
        "extra_deadline_misses": gv["deadline_misses"] - max(un["deadline_misses"], pf["deadline_misses"]),
        "max_writes_per_domain_per_s": max(gv.get("writes_per_domain_per_s", {}).values(), default=0.0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--deadline-ms", type=float, default=33.0)
    ap.add_argument("--boards", default="rk3588,orin-nx")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    boards: dict[str, Any] = {}
    for soc in args.boards.split(","):
        res = anyio.run(_board, soc, args.frames, args.deadline_ms)
        res["ratios"] = _ratios(res)
        boards[soc] = res
        print(f"{soc}: {json.dumps(res['ratios'])}", file=sys.stderr)
    keys = ("energy_vs_ungoverned", "board_energy_vs_ungoverned", "frontier_best_vs_ungoverned",
            "extra_deadline_misses", "max_writes_per_domain_per_s", "energy_vs_performance")
    summary = {k: max((b["ratios"][k] for b in boards.values() if b["ratios"][k] is not None), default=None)
               for k in keys}
    print(json.dumps({"benchmark": "governed_session", "model": MODEL, "frames": args.frames,
                      "deadline_ms": args.deadline_ms, "boards": boards, "summary": summary,
                      "targets": TARGETS, "wall_s": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
