"""Several models on one board (issue 26): independent sessions, one Runtime with FIFO queues, one
Runtime with hetsched's scheduler and joint placement, on the rk3588 and orin-nx twins.

The mix (real models, read from the installed wheels as ``benchmarks/real_models.py`` does, and
an embedded one; the input shapes fixed here):

- ``detector``: ddddocr's YOLOX-style detector at 416x416, offered at 30 fps, ``Priority.HIGH``,
  SLO 33 ms;
- ``classifier``: PP-OCR's text-direction classifier (MobileNetV3, 48x192), fed by the
  detector's results (``--per-result`` crops per frame), ``Priority.NORMAL``;
- ``background``: ResNet-50 (the onnx wheel's ``light_resnet50``), ``--background`` sessions of
  it, each one closed loop, ``Priority.BACKGROUND``. The offered load is swept over
  ``--background`` (independent sessions have one worker per session and device, so more
  sessions share a device more ways; a closed loop's extra clients would only queue in its own).

Each model is planned on the twin's devices hetsched uses by default (on the RK3588 without its Mali,
as hetsched's defaults leave it out without ncnn on a hardware Vulkan driver; ``--with-mali`` adds it)
by hetsched's planner (``build_plan``): alone for
the first two modes (as independent sessions place today), jointly for the third (the
detector first with its SLO, then each next model with the earlier ones' reservations, as
``Runtime.reservations`` makes them: their busy share of each device at their offered rate; a
closed loop elastic on the devices it runs on, ``hetsched.policies.Reservation(elastic=True)``, so
the next closed loop of its class goes where something is left and runs a request there for no
more energy, else shares). Serving
is replayed in the twin's *board* time (``benchmarks/_board_replay.py``: each stage's modelled
lone time, memory time and energy from the twin, the twin's contention model for runs in
flight at once), so the figures do not depend on this host's speed. The replay models the
three serving disciplines; it is not a run of the Runtime's code (``"serving"`` in the JSON
says which). **The same mix is also served by the real code** (``--pace K``, default 16: two runs
agreed within 0-9 % on this 2-core host at load average ~10, K = 8 did only at load ~6; 0: replay only): ``Session`` s, one ``hetsched.Runtime`` with FIFO queues (``Scheduling(priorities=False)``) and
one with hetsched's scheduler, on the twin's devices in the sim backend's paced mode
(``benchmarks/_paced_serving.py``: each stage run held K x its modelled board time with the
contention model's sharing, outputs **not computed**; the runtime reads the host clock / K, so
SLOs, aging and estimates are in board seconds), ``--paced-seconds`` board seconds per run, each
load's ``"paced"`` block beside the replay (``"vs_replay"``: relative gaps; ``--repeat 2``:
``"repeat_gap"`` between two runs), and ``"at_load_paced"`` (the real code's targets). The
runtime places each attached session itself (its joint placement, from the load measured at
attach), which may differ from the replay's plans: ``"placement"`` says where it put them. ``worker_threads`` is *measured*: the process's threads after opening the three
models one by one as independent ``Session`` s on the twin's devices, and attached to one
``hetsched.Runtime``.

Fields per board and load: ``slo_satisfaction_high`` (detector requests finished within 33 ms
/ requests whose deadline fell inside the window, finished or not), ``background_throughput`` (background requests per board
second), ``energy_per_request_j`` per model (its stages' modelled joules / completed
requests) and ``board_energy_per_request_j`` (all stage joules / all completed requests),
``p50_ms``/``p95_ms``/``p99_ms`` per model, ``background_throughput_ratio`` (scheduled /
independent at the same load), ``busy_check`` (largest relative gap between a device's busy
time and the sum of its runs' own busy times: 0 when the sharing is consistent), ``dram_bound``
(the most background requests per board second any schedule and placement could serve beside
the open-loop streams: the board's DRAM time they leave over the least DRAM time one background
request needs, :func:`dram_bound`) and ``background_throughput_ratio_bound`` (that over
independent sessions' throughput: the largest ratio any runtime could reach at that load). Targets
(reported, not asserted): ``slo_satisfaction_high >= 0.99`` at the load where independent
sessions fall below it, ``background_throughput_ratio >= 1.3`` there, worker threads
independent of the number of sessions, board energy per request no higher.

    .venv/bin/python benchmarks/multi_model.py [--boards rk3588 orin-nx] [--seconds 20] [--background 1 4 8 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
from _labels import MODELLED, labelled, twin

from hetsched import Device, Priority, Runtime, Session, load_model
from hetsched.backends.sim import stage_model_size, twin_devices
from hetsched.lowlevel import GraphIndex, build_plan, extract_stage, roofline
from hetsched.policies import Reservation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _board_replay import Mode, ModelPlan, Replay, ReplayResult, StagePlan, Stream
from _paced_serving import PacedResult, serve

PACED = ("independent_sessions", "runtime_fifo", "runtime_scheduled")
"""The modes the real code serves on the paced twin (the replay's labels they are compared with)."""

SLO_S = 0.033
MODES = (("independent_sessions", Mode.INDEPENDENT, "alone", False),
         ("runtime_fifo", Mode.RUNTIME_FIFO, "alone", False),
         ("runtime_scheduled_alone_placement", Mode.RUNTIME_SCHEDULED, "alone", True),
         ("runtime_scheduled", Mode.RUNTIME_SCHEDULED, "joint", True),
         ("runtime_scheduled_fair_all_classes", Mode.RUNTIME_SCHEDULED, "joint", False))
"""(label, serving discipline, placement, fair tags among one class's sessions only): the third isolates the
scheduler from joint placement; the last is the scheduler before c4963ae, whose fair shares counted the
sessions of every class (kept to show what that cost the NORMAL classifier)."""


def board_devices(soc: str, with_mali: bool) -> list[Device]:
    """The twin's devices hetsched uses on the board by default: the RK3588's Mali only when asked
    (``--with-mali``), as hetsched's own defaults leave it out without ncnn on a hardware Vulkan driver."""
    return [d for d in twin_devices(soc) if with_mali or not (soc == "rk3588" and d.kind == "gpu")]
TARGETS = {"slo_satisfaction_high": ">= 0.99 where independent sessions fall below it",
           "background_throughput_ratio": ">= 1.3 at that load", "worker_threads": "independent of the sessions",
           "board_energy_per_request_j": "no higher than independent sessions'"}


# (wheel's package, file inside it, the input's fixed shape): read from the installed wheel, never downloaded
WHEELS = {"detector": ("ddddocr", "common_det.onnx", [1, 3, 416, 416]),
          "classifier": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192])}


def wheel_model(package: str, rel: str, shape: list[int]) -> onnx.ModelProto:
    """The ONNX file ``rel`` of the installed ``package`` with its one image input fixed to ``shape``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"multi_model.py: package {package!r} is not installed (pip install {package.replace('_', '-')})")
    model = load_model(Path(next(iter(spec.submodule_search_locations))) / rel)
    inits = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    del inp.type.tensor_type.shape.dim[:]
    for v in shape:
        inp.type.tensor_type.shape.dim.add().dim_value = v
    return load_model(model)


def models() -> dict[str, onnx.ModelProto]:
    return {**{n: wheel_model(*w) for n, w in WHEELS.items()}, "background": load_model("light_resnet50")}


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Seeded random inputs at the model's (fixed) input shapes."""
    rng = np.random.default_rng(0)
    inits = {t.name for t in model.graph.initializer}
    return {i.name: rng.random([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], dtype=np.float32)
            for i in model.graph.input if i.name not in inits}


def streams(background: int, per_result: int, fps: float) -> list[Stream]:
    """The mix with ``background`` background sessions (each one closed loop: the load)."""
    return [Stream("detector", Priority.HIGH, SLO_S, rate_hz=fps),
            Stream("classifier", Priority.NORMAL, fed_by="detector", per_result=per_result),
            *(Stream(f"background{i}" if i else "background", Priority.BACKGROUND, clients=1)
              for i in range(background))]


def model_of(stream: str) -> str:
    return "background" if stream.startswith("background") else stream


def model_plan(plan: Any, devices: Sequence[Device], index: GraphIndex) -> ModelPlan:
    """The twin's figures of each stage of ``plan`` at the top clocks (the twin's devices' defaults):
    lone seconds (the roofline, ``max(FLOPs / peak, bytes / DRAM bandwidth)``, of the FLOPs and bytes
    the twin's stage sizes its runs by (``hetsched.backends.sim.stage_model_size`` of the extracted
    stage: what ``SimStage`` models a run with; the plan's own ``stage_bytes`` can differ: 426 vs 528 MB
    for ResNet-50), plus the launch of the stage call the twin's device carries,
    ``options["launch_s"]``, as the paced twin holds a run), memory seconds, joules (the domain's full
    power x compute seconds, as the twin's stage counts them)."""
    by_name = {d.name: d for d in devices}
    out = []
    for s in plan.stages:
        dev = by_name[s.device]
        flops, nbytes = stage_model_size(extract_stage(index, s))
        t_c, t_m = roofline(dev, flops, nbytes)[1:3]
        domain = dev.options["profile_domain"]
        energy = domain.full_power_w(domain.max_hz) * t_c
        out.append(StagePlan(s.device, max(t_c, t_m) + float(dev.options["launch_s"]), t_m, energy, tuple(s.deps)))
    return ModelPlan(tuple(out))


def reservation(name: str, plan: ModelPlan, stream: Stream, rate_hz: float) -> Reservation:
    """What ``stream`` placed as ``plan`` reserves, as the Runtime reserves an attached session
    (``Runtime.reservations``): its stages' seconds x its offered rate per device; a closed loop (no
    rate) is elastic: it takes what is left on the devices it runs on, each in proportion to its
    seconds there (``Reservation.elastic``: shared with a newcomer of its priority)."""
    share: dict[str, float] = {}
    total = sum(st.alone_s for st in plan.stages)
    for st in plan.stages:
        share[st.device] = min(1.0, share.get(st.device, 0.0) + st.alone_s * (rate_hz or 1.0 / total))
    return Reservation(name, share, priority=stream.priority, slo_s=stream.slo_s, elastic=not rate_hz)


def plans_for(soc: str, nets: Mapping[str, onnx.ModelProto], mix: Sequence[Stream],
              with_mali: bool = False) -> dict[str, Any]:
    devices = board_devices(soc, with_mali)
    indexes = {n: GraphIndex(m) for n, m in nets.items()}
    alone_by_model = {n: model_plan(build_plan(indexes[n], devices), devices, indexes[n]) for n in nets}
    alone = {s.name: alone_by_model[model_of(s.name)] for s in mix}
    joint: dict[str, ModelPlan] = {}
    reserved: list[Reservation] = []
    rates = {s.name: s.rate_hz for s in mix}
    for s in sorted(mix, key=lambda s: s.priority):
        if s.fed_by is not None:
            rates[s.name] = rates[s.fed_by] * s.per_result
        plan = build_plan(indexes[model_of(s.name)], devices, reservations=tuple(reserved), priority=s.priority,
                          slo_s=s.slo_s, rate_hz=rates[s.name] or None)
        joint[s.name] = model_plan(plan, devices, indexes[model_of(s.name)])
        reserved.append(reservation(s.name, joint[s.name], s, rates[s.name]))
    return {"devices": [d.name for d in devices], "alone": alone, "joint": joint}


def dram_bound(soc: str, nets: Mapping[str, onnx.ModelProto], mix: Sequence[Stream], with_mali: bool) -> dict[str, Any]:
    """An upper bound on the background requests per board second *any* schedule and placement can
    serve while the open-loop streams are served at their offered rates: the board's DRAM seconds
    per second (1: one shared bus) less what the open-loop streams need at least, over the least
    one background request needs. A request's least DRAM seconds: its model's bytes (the twin's
    sizing of the whole model, ``stage_model_size``) at the narrowest storage and the full
    bandwidth of the board's devices (``roofline`` with no FLOPs), whichever device runs it. Where
    this bound over independent sessions' background throughput is below 1.3, no runtime can meet
    the ratio target on that twin."""
    devices = board_devices(soc, with_mali)
    least = {}
    for name, net in nets.items():
        nbytes = stage_model_size(net)[1]
        least[name] = min(roofline(d, 0.0, nbytes)[2] for d in devices)
    rates = {s.name: float(s.rate_hz) for s in mix}
    for s in mix:
        if s.fed_by is not None:
            rates[s.name] = rates[s.fed_by] * s.per_result
    used = sum(rates[s.name] * least[model_of(s.name)] for s in mix if not s.clients)
    per_s = max(0.0, 1.0 - used) / least["background"]
    return {"background_per_s": round(per_s, 1), "open_loop_dram_share": round(used, 4),
            "background_dram_ms": round(least["background"] * 1e3, 3)}


def pct(v: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(v, q)) * 1e3, 2) if v else None


def _per_model_energy(r: ReplayResult, mix: Sequence[Stream]) -> dict[str, float | None]:
    """Joules per completed request of each model (the background sessions of one model together)."""
    joules: dict[str, float] = {}
    done: dict[str, int] = {}
    for s in mix:
        m = model_of(s.name)
        joules[m] = joules.get(m, 0.0) + r.streams[s.name].energy_j
        done[m] = done.get(m, 0) + r.streams[s.name].completed
    return {m: round(joules[m] / done[m], 5) if done[m] else None for m in joules}


def summarise(r: ReplayResult, mix: Sequence[Stream]) -> dict[str, Any]:
    per_model: dict[str, Any] = {}
    total_e, total_done = 0.0, 0
    for s in mix:
        x = r.streams[s.name]
        total_e += x.energy_j
        total_done += x.completed
        per_model[s.name] = {
            "requests": x.requests, "completed": x.completed, "throughput_per_s": round(x.completed / r.seconds, 2),
            "p50_ms": pct(x.latencies_s, 50), "p95_ms": pct(x.latencies_s, 95), "p99_ms": pct(x.latencies_s, 99),
            "slo_satisfaction": round(x.slo_met / x.slo_requests, 4) if s.slo_s and x.slo_requests else None,
            "energy_per_request_j": round(x.energy_j / x.completed, 5) if x.completed else None,
        }
    gaps = [abs(r.device_busy_s[d] - r.run_busy_s[d]) / r.device_busy_s[d] for d in r.device_busy_s
            if r.device_busy_s[d] > 0]
    high = [s.name for s in mix if s.priority <= Priority.HIGH]
    background = sum(r.streams[s.name].completed for s in mix if s.priority == Priority.BACKGROUND)
    return {
        "slo_satisfaction_high": per_model[high[0]]["slo_satisfaction"] if high else None,
        "background_throughput": round(background / r.seconds, 2),
        "energy_per_request_j": _per_model_energy(r, mix),
        "board_energy_per_request_j": round(total_e / total_done, 5) if total_done else None,
        "device_busy_share": {d: round(b / r.seconds, 3) for d, b in r.device_busy_s.items() if b > 0},
        "device_workers_modelled": r.workers,
        "busy_check": round(max(gaps, default=0.0), 9),
        "models": per_model,
    }


def summarise_paced(r: PacedResult, mix: Sequence[Stream]) -> dict[str, Any]:
    """The replay's fields for a run of the real code on the paced twin (board seconds = host / K)."""
    per_model: dict[str, Any] = {}
    joules: dict[str, float] = {}
    done: dict[str, int] = {}
    for s in mix:
        x = r.streams[s.name]
        m = model_of(s.name)
        joules[m] = joules.get(m, 0.0) + x.energy_j
        done[m] = done.get(m, 0) + x.completed_all
        per_model[s.name] = {
            "requests": x.requests, "completed": len(x.latencies_s),
            "throughput_per_s": round(len(x.latencies_s) / r.seconds, 2),
            "p50_ms": pct(x.latencies_s, 50), "p95_ms": pct(x.latencies_s, 95), "p99_ms": pct(x.latencies_s, 99),
            "slo_satisfaction": round(x.slo_met / x.slo_requests, 4) if s.slo_s and x.slo_requests else None,
            "energy_per_request_j": round(x.energy_j / x.completed_all, 5) if x.completed_all else None,
        }
    high = [s.name for s in mix if s.priority <= Priority.HIGH]
    background = sum(len(r.streams[s.name].latencies_s) for s in mix if s.priority == Priority.BACKGROUND)
    return {
        "slo_satisfaction_high": per_model[high[0]]["slo_satisfaction"] if high else None,
        "background_throughput": round(background / r.seconds, 2),
        "energy_per_request_j": {m: round(joules[m] / done[m], 5) if done[m] else None for m in joules},
        "board_energy_per_request_j": (round(sum(joules.values()) / sum(done.values()), 5)
                                       if sum(done.values()) else None),
        "worker_threads_measured": r.worker_threads,
        "frame_start_lag_ms": round(r.host_overrun_s * 1e3, 2),
        "placement": {n: d for n, d in r.placement.items() if n in ("detector", "classifier", "background")},
        "background_placement": _placements(r.placement),
        "models": per_model,
    }


def _placements(placement: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """How many background sessions the runtime placed on each set of devices (``"dla:0+cluster0": 5``)."""
    out: dict[str, int] = {}
    for name, devices in placement.items():
        if model_of(name) == "background":
            key = "+".join(dict.fromkeys(devices))
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _rel(a: float | None, b: float | None) -> float | None:
    """``a / b - 1`` rounded (None where either is missing or b is 0)."""
    return round(a / b - 1.0, 4) if a is not None and b else None


def paced_row(soc: str, nets: Mapping[str, onnx.ModelProto], mix: Sequence[Stream], row: dict[str, Any],
              args: argparse.Namespace) -> dict[str, Any]:
    """The three modes served by the real code on the paced twin (``--repeat`` runs each), beside the replay."""
    feeds = {n: feeds_for(m) for n, m in nets.items()}
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        one: dict[str, Any] = {}
        for label in PACED:
            r = anyio.run(lambda label=label: serve(Mode(label), nets, feeds, board_devices(soc, args.with_mali), mix,
                                                    pace=args.pace, seconds=args.paced_seconds))
            one[label] = summarise_paced(r, mix)
        ind, sch = one["independent_sessions"], one["runtime_scheduled"]
        one["background_throughput_ratio"] = (round(sch["background_throughput"] / ind["background_throughput"], 3)
                                              if ind["background_throughput"] else None)
        one["board_energy_per_request_ratio"] = (
            round(sch["board_energy_per_request_j"] / ind["board_energy_per_request_j"], 3)
            if ind["board_energy_per_request_j"] else None)
        runs.append(one)
    out = runs[0]
    keys = ("slo_satisfaction_high", "background_throughput", "board_energy_per_request_j")
    if len(runs) > 1:  # stability: the largest relative gap between two runs of the same case
        out["repeat_gap"] = {label: {k: _rel(runs[1][label][k], runs[0][label][k]) for k in keys} for label in PACED}
        out["repeats"] = [{label: {k: r[label][k] for k in keys} for label in PACED} for r in runs[1:]]
    out["vs_replay"] = {label: {k: _rel(out[label][k], row[label][k]) for k in keys} for label in PACED}
    return out


def _bound_ratio(row: Mapping[str, Any], independent: Mapping[str, Any]) -> float | None:
    """The DRAM bound on background throughput (:func:`dram_bound`) over independent sessions' at that load:
    the largest ``background_throughput_ratio`` any runtime could reach there."""
    got = independent["background_throughput"]
    return round(row["dram_bound"]["background_per_s"] / got, 3) if got else None


def placement(plan: ModelPlan) -> list[str]:
    return [f"{st.device}:{st.alone_s * 1e3:.2f}ms" for st in plan.stages]


def board_case(soc: str, nets: Mapping[str, onnx.ModelProto], args: argparse.Namespace) -> dict[str, Any]:
    loads = []
    for n in args.background:
        mix = streams(n, args.per_result, args.fps)
        plans = plans_for(soc, nets, mix, args.with_mali)
        row: dict[str, Any] = {"background_sessions": n, "dram_bound": dram_bound(soc, nets, mix, args.with_mali)}
        for label, mode, which, per_class in MODES:
            result = Replay(mode, mix, plans[which], plans["devices"], fair_per_class=per_class).run(args.seconds)
            row[label] = summarise(result, mix)
        if args.pace:
            row["paced"] = paced_row(soc, nets, mix, row, args)
        ind, sch = row[Mode.INDEPENDENT.value], row[Mode.RUNTIME_SCHEDULED.value]
        row["background_throughput_ratio"] = (round(sch["background_throughput"] / ind["background_throughput"], 3)
                                              if ind["background_throughput"] else None)
        row["board_energy_per_request_ratio"] = (
            round(sch["board_energy_per_request_j"] / ind["board_energy_per_request_j"], 3)
            if ind["board_energy_per_request_j"] else None)
        loads.append(row)
    below = [r for r in loads if (r[Mode.INDEPENDENT.value]["slo_satisfaction_high"] or 0) < 0.99]
    at = below[0] if below else loads[-1]
    sch = at[Mode.RUNTIME_SCHEDULED.value]
    labels = [m[0] for m in MODES]
    paced: dict[str, Any] | None = None
    if args.pace:  # the real code's figures, at the load where its independent sessions fall below 0.99
        p_below = [r for r in loads if (r["paced"]["independent_sessions"]["slo_satisfaction_high"] or 0) < 0.99]
        p_at = p_below[0] if p_below else loads[-1]
        pr = p_at["paced"]
        paced = {
            "serving": "runtime code, paced twin", "pace": args.pace, "seconds": args.paced_seconds,
            "background_sessions": p_at["background_sessions"], "independent_below_0.99": bool(p_below),
            "slo_satisfaction_high": {m: pr[m]["slo_satisfaction_high"] for m in PACED},
            "background_throughput": {m: pr[m]["background_throughput"] for m in PACED},
            "background_throughput_ratio": pr["background_throughput_ratio"],
            "background_throughput_ratio_bound": _bound_ratio(p_at, pr["independent_sessions"]),
            "board_energy_per_request_j": {m: pr[m]["board_energy_per_request_j"] for m in PACED},
            "worker_threads_measured": {m: pr[m]["worker_threads_measured"] for m in PACED},
            "background_placement": pr["runtime_scheduled"]["background_placement"],
            "vs_replay": pr["vs_replay"], **({"repeat_gap": pr["repeat_gap"]} if "repeat_gap" in pr else {}),
            "met": {"slo_satisfaction_high": (pr["runtime_scheduled"]["slo_satisfaction_high"] or 0) >= 0.99,
                    "background_throughput_ratio": (pr["background_throughput_ratio"] or 0) >= 1.3,
                    "board_energy_per_request": (pr["board_energy_per_request_ratio"] or 9) <= 1.0},
        }
    return {
        **({"at_load_paced": paced} if paced is not None else {}),
        "placement": {which: {n: placement(p) for n, p in plans[which].items() if n in ("detector", "classifier",
                                                                                        "background")}
                      for which in ("alone", "joint")},
        "loads": loads,
        "at_load": {
            "background_sessions": at["background_sessions"],
            "independent_below_0.99": bool(below),
            "slo_satisfaction_high": {m: at[m]["slo_satisfaction_high"] for m in labels},
            "background_throughput": {m: at[m]["background_throughput"] for m in labels},
            "background_throughput_ratio": at["background_throughput_ratio"],
            "background_throughput_ratio_bound": _bound_ratio(at, at[Mode.INDEPENDENT.value]),
            "board_energy_per_request_j": {m: at[m]["board_energy_per_request_j"] for m in labels},
            "energy_per_request_j": sch["energy_per_request_j"],
            "met": {"slo_satisfaction_high": (sch["slo_satisfaction_high"] or 0) >= 0.99,
                    "background_throughput_ratio": (at["background_throughput_ratio"] or 0) >= 1.3,
                    "board_energy_per_request": (at["board_energy_per_request_ratio"] or 9) <= 1.0},
        },
    }


async def _open_all(nets: Mapping[str, onnx.ModelProto], soc: str, with_mali: bool) -> list[int]:
    """Threads of the process after opening each model as an independent Session (and one request each)."""
    counts = [threading.active_count()]
    async with Session(nets["detector"], devices=board_devices(soc, with_mali)) as a:
        await a.run(feeds_for(nets["detector"]))
        counts.append(threading.active_count())
        async with Session(nets["classifier"], devices=board_devices(soc, with_mali)) as b:
            await b.run(feeds_for(nets["classifier"]))
            counts.append(threading.active_count())
            async with Session(nets["background"], devices=board_devices(soc, with_mali)) as c:
                await c.run(feeds_for(nets["background"]))
                counts.append(threading.active_count())
    return counts


def worker_threads(nets: Mapping[str, onnx.ModelProto], soc: str, with_mali: bool) -> dict[str, Any]:
    return {"independent_sessions": anyio.run(_open_all, nets, soc, with_mali),
            "runtime": anyio.run(_open_runtime, nets, soc, with_mali)}


async def _open_runtime(nets: Mapping[str, onnx.ModelProto], soc: str, with_mali: bool) -> list[int]:
    """Threads of the process after opening one Runtime and attaching each model to it."""
    counts = [threading.active_count()]
    async with Runtime(devices=board_devices(soc, with_mali)) as rt:
        sessions = []
        try:
            for name in ("detector", "classifier", "background"):
                s = Session(nets[name], runtime=rt, name=name)
                await s.__aenter__()
                sessions.append(s)
                await s.run(feeds_for(nets[name]))
                counts.append(threading.active_count())
        finally:
            for s in reversed(sessions):
                await s.__aexit__(None, None, None)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--boards", nargs="+", default=["rk3588", "orin-nx"])
    ap.add_argument("--seconds", type=float, default=20.0, help="board seconds replayed per case")
    ap.add_argument("--background", type=int, nargs="+", default=[1, 4, 8, 16],
                    help="background sessions, one closed loop each (the load)")
    ap.add_argument("--per-result", type=int, default=3, help="classifier requests per detector result")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--no-threads", action="store_true", help="skip opening real sessions to count threads")
    ap.add_argument("--pace", type=float, default=16.0,
                    help="also serve each case with the real Session/Runtime code on the twin paced K times slower "
                         "than board time (0: replay only)")
    ap.add_argument("--paced-seconds", type=float, default=3.0, help="board seconds per paced run")
    ap.add_argument("--repeat", type=int, default=1, help="paced runs per case (2: report their gap)")
    ap.add_argument("--with-mali", action="store_true",
                    help="give the RK3588 twin's Mali GPU to the planner (hetsched's defaults leave it out)")
    args = ap.parse_args(argv)
    nets = models()
    result: dict[str, Any] = {"targets": TARGETS,
                              "serving": {"replay": "board-time replay of the three serving disciplines "
                                                    "(benchmarks/_board_replay.py), not a run of the Runtime's code",
                                          "paced": ("runtime code, paced twin: the real Session/Runtime/scheduler "
                                                    f"on twin devices paced {args.pace:g}x board time, outputs not "
                                                    "computed (zeros), latencies = host seconds / K; each open-loop "
                                                    "session given its offered rate (Session(rate_hz=): detector fps, "
                                                    "classifier fps x per-result)"
                                                    if args.pace else None)},
                              "mix": [dataclasses.asdict(s) for s in streams(1, args.per_result, args.fps)],
                              "seconds": args.seconds, "boards": {}}
    for soc in args.boards:
        case = board_case(soc, nets, args)
        if not args.no_threads:
            case["worker_threads"] = worker_threads(nets, soc, args.with_mali)
        result["boards"][soc] = case
        print(json.dumps({soc: case["at_load"]}), file=sys.stderr)
    figures = MODELLED + "; worker_threads measured on this host (threading.active_count)"
    print(json.dumps(labelled(result, board=twin(*args.boards), figures=figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
