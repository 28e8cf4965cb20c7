"""``hetsched run A.onnx B.onnx --rate 30,0 --priority high,background --slo-ms 33,-``: several
models on one board at once (issue 26).

Each model gets an offered load: ``--rate`` requests per second (open loop: request ``k`` is
due at ``k / rate`` and its latency counts from then, queueing included), ``0`` for a closed
loop (the next request as soon as the last one returned); ``--priority`` its requests'
:class:`hetsched.Priority`; ``--slo-ms`` the deadline its latency is judged by (``-``: none).
Each list has one value per model, or one value for all; ``--shape NAME=D0,D1,...`` fixes the
input ``NAME`` of every model that has one. ``--workload FILE`` gives the same as
JSON::

    {"duration_s": 5, "models": [
        {"model": "det.onnx", "rate": 30, "priority": "high", "slo_ms": 33, "shape": {"x": [1, 3, 416, 416]}},
        {"model": "light_squeezenet", "rate": 0, "priority": "background"}]}

The models are attached to one :class:`hetsched.Runtime` (one set of device workers; every
device's queue orders all models' stages by priority class, then deadline) with each model's SLO
as its session's ``slo_s``, and served for ``--duration`` seconds after ``--warmup`` requests
each (and its priority as the session's: joint placement places the urgent models first and
the others knowing their load); ``--independent`` serves them with one private Session each instead (today's way: one
worker set per model). On a twin's devices they share the simulated board
(``hetsched/_twin/contention.py``). Reported per model: ``requests``, ``latency_ms``
percentiles (host wall time), ``slo_satisfaction`` (the fraction of its requests due in the run
that finished within the SLO), ``throughput_rps``, the stage energy (``energy_per_request_j``,
modelled on a twin) and, on simulated devices, ``modelled_ms_per_request`` (the twin's board
time of its stages, the sharing included), and with the Runtime ``board_energy_split_j`` (the
board's energy split by each one's share of the devices' busy time) beside ``board_energy_j``
and ``board_energy_source`` (the measured ``VDD_IN`` rail where the root has one, else the
stages' modelled sum) and ``replacements`` (every time the runtime re-placed the models); and
the threads the serving started (``worker_threads``). ``--trace PATH`` writes the Runtime's trace,
a track per model; under ``--root DIR`` the runtime publishes each model's load for
``hetsched top --root DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from .._events import Priority
from ._common import existing_file, positive_float, random_feeds, resolve_model_arg, select_devices

__all__ = ["ModelLoad", "add_multi_args", "is_multi", "parse_loads", "run_multi"]

DEFAULT_DURATION_S = 5.0
_PRIORITIES = {p.name.lower(): p for p in Priority}


@dataclass(frozen=True)
class ModelLoad:
    """One model's offered load."""

    model: str
    rate_hz: float
    """Requests per second, open loop; 0: one closed loop."""
    priority: Priority
    slo_s: float | None
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Fixed shapes of its inputs (``--shape`` for the inputs it has, or the workload's ``"shape"``)."""


def add_multi_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("more_models", nargs="*", metavar="MODEL",
                   help="more models served at once on the same devices (then --rate/--priority/--slo-ms apply)")
    g = p.add_argument_group("several models at once (hetsched run A.onnx B.onnx ...)")
    g.add_argument("--rate", metavar="R[,R...]",
                   help="requests per second per model, 0 for a closed loop (default 0)")
    g.add_argument("--priority", metavar="P[,P...]",
                   help=f"priority per model: {', '.join(_PRIORITIES)} (default normal)")
    g.add_argument("--slo-ms", metavar="MS[,MS...]", help="latency SLO per model in ms, - for none (default none)")
    g.add_argument("--workload", metavar="FILE", type=existing_file, help="a JSON workload file (models, rates, priorities, SLOs)")
    g.add_argument("--independent", action="store_true",
                   help="serve each model with a private Session (its own workers) instead of one Runtime")
    g.add_argument("--duration", type=positive_float, default=None, metavar="S",
                   help=f"seconds to serve the models for (default {DEFAULT_DURATION_S:g})")


def is_multi(args: argparse.Namespace) -> bool:
    return bool(args.more_models or args.workload or args.rate or args.priority or args.slo_ms
                or args.duration is not None or args.independent)


def _split(value: str | None, n: int, what: str) -> list[str | None]:
    if value is None:
        return [None] * n
    parts: list[str | None] = [v.strip() for v in value.split(",")]
    if len(parts) == 1:
        return parts * n
    if len(parts) != n:
        raise SystemExit(f"hetsched run: {what} has {len(parts)} values for {n} models (give one, or one per model)")
    return list(parts)


def _rate(text: str | float | None, where: str) -> float:
    try:
        rate = float(text) if text is not None else 0.0
    except (TypeError, ValueError):
        raise SystemExit(f"hetsched run: {where}: rate {text!r} is not a number of requests per second") from None
    if not (math.isfinite(rate) and rate >= 0):
        raise SystemExit(f"hetsched run: {where}: rate {text!r} must be a finite number >= 0 (0: closed loop)")
    return rate


def _priority(text: str | None, where: str) -> Priority:
    if text is None:
        return Priority.NORMAL
    p = _PRIORITIES.get(str(text).strip().lower())
    if p is None:
        raise SystemExit(f"hetsched run: {where}: unknown priority {text!r} (one of {', '.join(_PRIORITIES)})")
    return p


def _slo(text: str | float | None, where: str) -> float | None:
    if text is None or text == "-":
        return None
    try:
        ms = float(text)
    except (TypeError, ValueError):
        raise SystemExit(f"hetsched run: {where}: SLO {text!r} is not a number of milliseconds (or -)") from None
    if not (math.isfinite(ms) and ms > 0):
        raise SystemExit(f"hetsched run: {where}: SLO {text!r} must be a finite number of ms > 0 (or -)")
    return ms / 1e3


def _shape_obj(value: object, where: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and v and all(isinstance(d, int) and not isinstance(d, bool)
                                                                   and d > 0 for d in v)
        for k, v in value.items()
    ):
        raise SystemExit(f"hetsched run: {where}: \"shape\" must map input names to lists of positive integers")
    return tuple((k, tuple(v)) for k, v in value.items())


def _from_file(path: str) -> tuple[list[ModelLoad], float | None]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SystemExit(f"hetsched run: --workload {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SystemExit(f"hetsched run: --workload {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) or not data["models"]:
        raise SystemExit(f"hetsched run: --workload {path}: expected an object with a non-empty \"models\" list")
    loads = []
    for i, m in enumerate(data["models"]):
        where = f"--workload {path} models[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("model"), str):
            raise SystemExit(f"hetsched run: {where}: expected an object with a \"model\" path or name")
        unknown = set(m) - {"model", "rate", "priority", "slo_ms", "shape"}
        if unknown:
            raise SystemExit(f"hetsched run: {where}: unknown keys {sorted(unknown)}")
        loads.append(ModelLoad(m["model"], _rate(m.get("rate"), where), _priority(m.get("priority"), where),
                               _slo(m.get("slo_ms"), where), _shape_obj(m.get("shape"), where)))
    duration = data.get("duration_s")
    if duration is not None and not (isinstance(duration, (int, float)) and 0 < duration < math.inf):
        raise SystemExit(f"hetsched run: --workload {path}: duration_s {duration!r} must be a number of seconds > 0")
    return loads, duration


def parse_loads(args: argparse.Namespace) -> tuple[list[ModelLoad], float]:
    """The models and their loads from the command line or ``--workload``; the duration.

    :raises SystemExit: a usage error naming the option and the value.
    """
    if args.workload:
        if args.model or args.more_models or args.rate or args.priority or args.slo_ms:
            raise SystemExit("hetsched run: --workload gives the models and their loads: no MODEL, --rate, "
                             "--priority or --slo-ms with it")
        loads, duration = _from_file(args.workload)
        return loads, args.duration or duration or DEFAULT_DURATION_S
    if not args.model:
        raise SystemExit("hetsched run: give a MODEL (or several), or --workload FILE")
    names = [args.model, *args.more_models]
    n = len(names)
    rates, prios, slos = _split(args.rate, n, "--rate"), _split(args.priority, n, "--priority"), \
        _split(args.slo_ms, n, "--slo-ms")
    loads = [ModelLoad(m, _rate(r, "--rate"), _priority(p, "--priority"), _slo(s, "--slo-ms"))
             for m, r, p, s in zip(names, rates, prios, slos, strict=True)]
    return loads, args.duration or DEFAULT_DURATION_S


def with_shapes(loads: list[ModelLoad], items: Sequence[str]) -> list[ModelLoad]:
    """Each model with the ``--shape`` items naming one of its inputs (its own ``"shape"`` wins);
    then checked: a model left with free dims is a :class:`~hetsched.FreeDimsError` naming them.

    :raises SystemExit: a ``--shape`` item names an input no model has, or is malformed.
    """
    from hetsched import load_model

    from ._common import parse_shapes, require_shapes

    given = parse_shapes(items, "hetsched run")
    used: set[str] = set()
    out = []
    for load in loads:
        path = resolve_model_arg(load.model)
        model = load_model(path, check=False, infer_shapes=False)
        inputs = {i.name for i in model.graph.input}
        shapes = {k: v for k, v in given.items() if k in inputs}
        used |= set(shapes)
        shapes.update(dict(load.shapes))
        require_shapes(path, shapes, f"hetsched run's inputs of {load.model}")
        out.append(dataclasses.replace(load, shapes=tuple(shapes.items())))
    unused = sorted(set(given) - used)
    if unused:
        raise SystemExit(f"hetsched run: --shape {', '.join(unused)}: no model has an input of that name")
    return out


@dataclass
class _Served:
    load: ModelLoad
    latencies: list[float]
    due: int = 0
    """Requests due before the end (open loop: scheduled; closed loop: started)."""
    met: int = 0


async def _drive(session: Any, feeds: dict[str, Any], served: _Served, until: float) -> None:
    """Offer ``served.load`` to ``session`` until ``until`` (perf_counter seconds)."""
    load = served.load

    async def one(due: float) -> None:
        await session.run(feeds, priority=load.priority)
        lat = time.perf_counter() - due
        served.latencies.append(lat)
        if load.slo_s is not None and lat <= load.slo_s:
            served.met += 1

    if load.rate_hz <= 0:
        while time.perf_counter() < until:
            served.due += 1
            await one(time.perf_counter())
        return
    period = 1.0 / load.rate_hz
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        k = 0
        while True:
            due = start + k * period
            if due >= until:
                break
            await anyio.sleep(max(0.0, due - time.perf_counter()))
            served.due += 1
            tg.start_soon(one, due)
            k += 1


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def _model_summary(served: _Served, session: Any, duration: float, energy0: float | None,
                   busy0: float) -> dict[str, Any]:
    lat = served.latencies
    st = session.statistics()
    energy = None if st.energy_j is None or energy0 is None else st.energy_j - energy0
    busy = sum(st.device_busy_s.values()) - busy0  # the stages' modelled board seconds (where modelled)
    modelled = busy / len(lat) * 1e3 if busy > 0 and lat else None
    out: dict[str, Any] = {
        "model": served.load.model, "rate": served.load.rate_hz, "priority": served.load.priority.name.lower(),
        "slo_ms": None if served.load.slo_s is None else served.load.slo_s * 1e3,
        "requests": len(lat), "throughput_rps": len(lat) / duration,
        "latency_ms": {"p50": _pct(lat, 0.50), "p95": _pct(lat, 0.95), "p99": _pct(lat, 0.99)},
        "slo_satisfaction": (served.met / served.due if served.load.slo_s is not None and served.due else None),
        "energy_per_request_j": energy / len(lat) if energy is not None and lat else None,
    }
    if modelled is not None:
        out["modelled_ms_per_request"] = modelled
    return out


def _names(loads: Sequence[ModelLoad]) -> list[str]:
    """A session name per model: its file's stem, numbered where two are alike."""
    stems = [Path(load.model).stem for load in loads]
    return [f"{stem}#{i}" if stems.count(stem) > 1 else stem for i, stem in enumerate(stems)]


async def _serve(args: argparse.Namespace, loads: list[ModelLoad], duration: float) -> dict[str, Any]:
    from hetsched import Runtime, Session

    devices = select_devices(args.devices, args.root)
    threads0 = threading.active_count()
    async with contextlib.AsyncExitStack() as stack:
        rt = None if args.independent else await stack.enter_async_context(
            Runtime(devices=devices, root=args.root or "/", trace=getattr(args, "trace", None),
                    publish_load=bool(args.root)))  # `hetsched top --root DIR` shows each model's load
        names = _names(loads)
        opened: dict[int, tuple[Any, dict[str, Any]]] = {}
        # the most urgent first: each next model is placed knowing the load of those before it
        for i in sorted(range(len(loads)), key=lambda i: loads[i].priority):
            load, name = loads[i], names[i]
            model = resolve_model_arg(load.model)
            session = (Session(model, devices=devices, policy=args.policy, max_unit_nodes=args.max_unit_nodes,
                               root=args.root or "/", name=name, shapes=dict(load.shapes)) if rt is None else
                       Session(model, runtime=rt, policy=args.policy, max_unit_nodes=args.max_unit_nodes,
                               slo_s=load.slo_s, priority=load.priority, name=name, shapes=dict(load.shapes)))
            s = await stack.enter_async_context(session)
            feeds = random_feeds(s.get_inputs(), shapes=dict(load.shapes))
            for _ in range(args.warmup):
                await s.run(feeds, priority=load.priority)
            opened[i] = (s, feeds)
        sessions = [opened[i] for i in range(len(loads))]
        threads = threading.active_count()
        served = [_Served(load, []) for load in loads]
        energy0 = [s.statistics().energy_j for s, _ in sessions]
        busy0 = [sum(s.statistics().device_busy_s.values()) for s, _ in sessions]
        until = time.perf_counter() + duration
        with anyio.move_on_after(duration * 2 + 5):  # open-loop stragglers past the end are cut
            async with anyio.create_task_group() as tg:
                for (s, feeds), sv in zip(sessions, served, strict=True):
                    tg.start_soon(_drive, s, feeds, sv, until)
        out = {
            "mode": "independent sessions" if rt is None else "one runtime",
            "duration_s": duration, "warmup_requests": args.warmup,
            "worker_threads": threads - threads0,
            "models": [_model_summary(sv, s, duration, e0, b0)
                       for sv, (s, _), e0, b0 in zip(served, sessions, energy0, busy0, strict=True)],
        }
        if rt is not None:
            st = rt.statistics()
            split = st.energy_split_j
            for m, name in zip(out["models"], names, strict=True):
                m["board_energy_split_j"] = split.get(name)
            out.update({"board_energy_j": st.energy_j, "board_energy_source": st.energy_source,
                        "board_energy_note": st.energy_note, "replacements": list(st.replacements)})
        return out


def _print(summary: dict[str, Any]) -> None:
    print(f"{len(summary['models'])} models, {summary['mode']}, {summary['duration_s']:g} s "
          f"({summary['worker_threads']} threads started):")
    modelled = any("modelled_ms_per_request" in m for m in summary["models"])
    print(f"{'model':28} {'prio':10} {'rate':>6} {'reqs':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
          f"{'SLO ok':>7} {'req/s':>7} {'mJ/req':>8}" + (f" {'board ms':>9}" if modelled else ""))

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for m in summary["models"]:
        slo = "-" if m["slo_satisfaction"] is None else f"{m['slo_satisfaction'] * 100:.1f}%"
        e = None if m["energy_per_request_j"] is None else m["energy_per_request_j"] * 1e3
        print(f"{Path(m['model']).name[:28]:28} {m['priority']:10} {f(m['rate'], 'g'):>6} {m['requests']:>6} "
              f"{f(m['latency_ms']['p50'], '.2f'):>8} {f(m['latency_ms']['p95'], '.2f'):>8} "
              f"{f(m['latency_ms']['p99'], '.2f'):>8} {slo:>7} {m['throughput_rps']:>7.1f} {f(e, '.3f'):>8}"
              + (f" {f(m.get('modelled_ms_per_request'), '.3f'):>9}" if modelled else ""))
    if modelled:
        print("board ms: the SoC twin's modelled time of one request's stages (a simulator; the sharing of the "
              "board between the models included); latencies are this host's wall time")
    split = {m["model"]: m.get("board_energy_split_j") for m in summary["models"]}
    if any(v is not None for v in split.values()):
        print("energy split by busy share: " + ", ".join(f"{Path(k).name} {v:.3f} J" for k, v in split.items()
                                                         if v is not None))
    if summary.get("board_energy_j") is not None:
        print(f"board energy since the runtime opened: {summary['board_energy_j']:.3f} J "
              f"({summary['board_energy_source']})")
    for reason in summary.get("replacements", ()):
        print(f"re-placed the models: {reason}")


def run_multi(args: argparse.Namespace) -> int:
    """``hetsched run`` with several models (or a workload): serve them at once and report per model."""
    loads, duration = parse_loads(args)
    loads = with_shapes(loads, args.shape)
    summary = anyio.run(_serve, args, loads, duration)
    if args.json:
        print(json.dumps(summary))
    else:
        _print(summary)
    return 0
