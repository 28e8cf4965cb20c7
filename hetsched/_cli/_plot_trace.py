"""Reading a Chrome trace event file (the one ``Session(trace=...)`` writes) into what ``hetsched plot`` draws.

The reader is pure (:func:`parse_trace` takes the decoded JSON) plus a thin loader
(:func:`load_trace`). It follows the trace event format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) as hetsched
writes it, and tolerates the parts a run may lack:

- ``"ph": "M"`` ``process_name`` metadata names processes: ``device <name>`` (one timeline row
  per worker thread), ``transfers`` (one row per channel thread), ``compile`` (one row per compile
  thread), ``governor`` (its ``X`` events are the phases), ``requests`` and ``board`` (not drawn
  as rows). An ``X`` event on a process with
  no metadata is treated as a device's (its row is named ``pid N``).
- ``"ph": "X"`` complete events (``ts``/``dur`` in microseconds); a stage run whose ``args`` carry
  an ``error`` (or ``failed: true``) is a failed run.
- ``"ph": "C"`` counters named ``freq <domain>`` (MHz), ``temp <zone>`` (C), ``power <rail>`` (W);
  the value is the series' own key (``MHz``, ``C``, ``W``) or else the first number in ``args``.
  Other counters are ignored (a host without telemetry has none at all).
- ``"ph": "i"``/``"I"`` instants: ``replan`` (a vertical line labelled with ``args.reason``);
  ``preempted`` on a transfer thread (a tick on its row).
- Passive trip points: ``otherData.board.zones`` (zone -> ``{"passive_trip_c": C}``, what the
  session's trace writes), ``otherData.trips`` (or ``passive_trips``: zone -> C or zone ->
  ``{"passive": C}``), or a ``passive``/``passive_C``/``trip_C`` number in a ``temp`` counter's args.

A trace cut short (the JSON array format without its closing bracket, which the format allows)
is read as far as it goes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched._errors import NotRegularFileError, ProfileError
from hetsched._platform.files import read_regular_file

__all__ = ["Replan", "Row", "Series", "Span", "TraceView", "load_trace", "parse_trace"]

_TRIP_KEYS = ("passive", "passive_C", "passive_c", "passive_trip_c", "trip_C", "trip_c")
_COUNTER_UNITS = {"freq": "MHz", "temp": "C", "power": "W"}


@dataclass(frozen=True)
class Span:
    """One slice on a row: a stage run, a transfer or a governor phase (seconds from the trace's start)."""

    start_s: float
    dur_s: float
    name: str
    failed: bool = False


@dataclass(frozen=True)
class Row:
    """One timeline row: a device's worker thread (``kind="device"``), a transfer channel (``"transfer"``)
    or a compile thread (``"compile"``)."""

    label: str
    kind: str
    spans: tuple[Span, ...]
    marks_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Series:
    """One counter track: a clock domain (MHz), a thermal zone (C) or a rail (W)."""

    name: str
    unit: str
    times_s: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Replan:
    """A re-plan instant and its reason."""

    time_s: float
    label: str


@dataclass(frozen=True)
class TraceView:
    """Everything ``hetsched plot`` draws, on one time axis in seconds from the trace's first event."""

    source: str
    clocks: tuple[Series, ...]
    temps: tuple[Series, ...]
    power: tuple[Series, ...]
    trips_c: tuple[tuple[str, float], ...]
    rows: tuple[Row, ...]
    phases: tuple[Span, ...]
    replans: tuple[Replan, ...]
    end_s: float

    @property
    def stage_runs(self) -> int:
        return sum(len(r.spans) for r in self.rows if r.kind == "device")

    @property
    def failed_runs(self) -> int:
        return sum(1 for r in self.rows if r.kind == "device" for s in r.spans if s.failed)

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device of the trace, idle ones included, in the trace's order."""
        return tuple(dict.fromkeys(r.label.split(" [", 1)[0] for r in self.rows if r.kind == "device"))

    @property
    def busy_devices(self) -> tuple[str, ...]:
        """The devices that ran at least one stage."""
        return tuple(dict.fromkeys(r.label.split(" [", 1)[0] for r in self.rows if r.kind == "device" and r.spans))


def load_trace(path: str | os.PathLike[str]) -> TraceView:
    """Read and parse the trace file at ``path``.

    Raises :class:`ProfileError` naming the file when it does not exist, cannot be read, is not
    JSON (nor a JSON array cut short), or does not hold trace events (see :func:`parse_trace`);
    :class:`NotRegularFileError` when it is a FIFO, a device or a directory (nothing read).
    """
    p = Path(path)
    try:
        text = read_regular_file(p, what="trace file").decode("utf-8")
    except FileNotFoundError as exc:
        raise ProfileError(f"trace file {str(p)!r} does not exist") from exc
    except NotRegularFileError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"trace file {str(p)!r} cannot be read: {exc}") from exc
    return parse_trace(_decode(text, p), source=str(p))


def _decode(text: str, p: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        first = exc
    # The array format may lack its closing bracket (a run killed mid-write); so may an object's list.
    body = text.rstrip().rstrip(",")
    for tail in ("]", "]}"):
        try:
            return json.loads(body + tail)
        except json.JSONDecodeError:
            continue
    raise ProfileError(
        f"trace file {str(p)!r} is not valid JSON: {first.msg} at line {first.lineno} column {first.colno}"
    ) from first


def parse_trace(doc: Any, *, source: str = "<trace>") -> TraceView:
    """Turn a decoded trace (``{"traceEvents": [...]}`` or a bare event list) into a :class:`TraceView`.

    Raises :class:`ProfileError` naming ``source`` when the document holds no event list, an event
    is not an object or has a non-numeric ``ts``/``dur``, or no event has a time at all.
    """
    other: Mapping[str, Any] = {}
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if isinstance(doc.get("otherData"), dict):
            other = doc["otherData"]
    else:
        events = doc
    if not isinstance(events, list):
        raise ProfileError(f"trace file {source!r} has no 'traceEvents' list (not a Chrome trace event file)")
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ProfileError(f"trace file {source!r}: event {i} is not a JSON object: {ev!r:.60}")

    procs: dict[Any, str] = {}
    order: dict[Any, float] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for ev in events:
        if ev.get("ph") == "M" and isinstance(ev.get("args"), dict):
            name = ev["args"].get("name")
            if ev.get("name") == "process_name" and isinstance(name, str):
                procs[ev.get("pid")] = name
            elif ev.get("name") == "process_sort_index" and _finite(ev["args"].get("sort_index")) is not None:
                order[ev.get("pid")] = float(ev["args"]["sort_index"])
            elif ev.get("name") == "thread_name" and isinstance(name, str):
                threads[(ev.get("pid"), ev.get("tid"))] = name

    timed = [(i, ev) for i, ev in enumerate(events) if ev.get("ph") in ("X", "C", "i", "I", "B", "E")]
    if not timed:
        raise ProfileError(f"trace file {source!r} holds no timed events (stage runs, counters or instants) to plot")
    starts = [_number(ev, "ts", i, source) for i, ev in timed]
    t0 = min(starts)
    end = t0
    for (i, ev), ts in zip(timed, starts, strict=True):
        end = max(end, ts + (_number(ev, "dur", i, source) if ev.get("ph") == "X" else 0.0))

    spans: dict[tuple[Any, Any], list[Span]] = {}
    marks: dict[tuple[Any, Any], list[float]] = {}
    phases: list[Span] = []
    replans: list[Replan] = []
    counters: dict[str, dict[str, tuple[list[float], list[float]]]] = {k: {} for k in _COUNTER_UNITS}
    trips: dict[str, float] = dict(_trips_from_other(other))
    for (i, ev), ts in zip(timed, starts, strict=True):
        t = (ts - t0) / 1e6
        ph = ev["ph"]
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        proc = procs.get(ev.get("pid"), "")
        name = str(ev.get("name", ""))
        if ph == "X":
            span = Span(t, _number(ev, "dur", i, source) / 1e6, name, failed=_failed(args))
            if proc == "governor":
                phases.append(span)
            elif proc not in ("requests", "board"):
                spans.setdefault((ev.get("pid"), ev.get("tid")), []).append(span)
        elif ph == "C":
            kind, _, series = name.partition(" ")
            if kind in counters and series:
                value = _counter_value(args, _COUNTER_UNITS[kind])
                if value is not None:
                    ts_list, vs = counters[kind].setdefault(series, ([], []))
                    ts_list.append(t)
                    vs.append(value)
                if kind == "temp":
                    trip = next((_finite(args[k]) for k in _TRIP_KEYS if k in args), None)
                    if trip is not None:
                        trips.setdefault(series, trip)
        elif ph in ("i", "I"):
            if name.lower() in ("replan", "re-plan"):
                reason = args.get("reason") or args.get("trigger") or ""
                replans.append(Replan(t, str(reason) if reason else "(no reason given)"))
            elif name.lower() == "preempted":
                marks.setdefault((ev.get("pid"), ev.get("tid")), []).append(t)

    rows = _rows(spans, marks, procs, threads, order)
    return TraceView(
        source=source,
        clocks=_series(counters["freq"], "MHz"),
        temps=_series(counters["temp"], "C"),
        power=_series(counters["power"], "W"),
        trips_c=tuple(sorted(trips.items())),
        rows=rows,
        phases=tuple(sorted(phases, key=lambda s: s.start_s)),
        replans=tuple(sorted(replans, key=lambda r: r.time_s)),
        end_s=(end - t0) / 1e6,
    )


def _rows(
    spans: dict[tuple[Any, Any], list[Span]],
    marks: dict[tuple[Any, Any], list[float]],
    procs: dict[Any, str],
    threads: dict[tuple[Any, Any], str],
    order: dict[Any, float],
) -> tuple[Row, ...]:
    # Every device process gets a row, idle ones too: "nothing ran there" is part of the picture.
    per_pid: dict[Any, list[Any]] = {pid: [] for pid, name in procs.items() if name.startswith("device ")}
    for pid, tid in spans:
        per_pid.setdefault(pid, []).append(tid)

    def rank(pid: Any) -> tuple[float, str]:
        # The trace's own process_sort_index, else a numeric pid, keeps the writer's device order.
        fallback = float(pid) if isinstance(pid, int | float) and not isinstance(pid, bool) else math.inf
        return order.get(pid, fallback), str(pid)

    by_kind: dict[str, list[Row]] = {"device": [], "transfer": [], "compile": []}
    for pid in sorted(per_pid, key=rank):
        proc = procs.get(pid, f"pid {pid}")
        kind = {"transfers": "transfer", "compile": "compile"}.get(proc, "device")
        tids = sorted(per_pid[pid], key=str) or [None]
        for tid in tids:
            thread = threads.get((pid, tid), f"tid {tid}")
            if kind == "transfer":
                label = thread
            else:
                name = proc.removeprefix("device ")
                # A device with several workers gets one row per worker, named after its thread.
                label = name if len(tids) == 1 else f"{name} [{thread}]"
            by_kind[kind].append(Row(
                label=label,
                kind=kind,
                spans=tuple(sorted(spans.get((pid, tid), ()), key=lambda s: s.start_s)),
                marks_s=tuple(sorted(marks.get((pid, tid), ()))),
            ))
    return (*by_kind["device"], *by_kind["transfer"], *by_kind["compile"])


def _series(table: dict[str, tuple[list[float], list[float]]], unit: str) -> tuple[Series, ...]:
    out = []
    for name in sorted(table):
        ts, vs = table[name]
        order = sorted(range(len(ts)), key=ts.__getitem__)
        out.append(Series(name, unit, tuple(ts[k] for k in order), tuple(vs[k] for k in order)))
    return tuple(out)


def _number(ev: Mapping[str, Any], key: str, index: int, source: str) -> float:
    value = ev.get(key, 0 if key == "dur" else None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(
            f"trace file {source!r}: event {index} ({ev.get('ph')!s} {ev.get('name')!r}) has no numeric {key!r}: {value!r}"
        )
    return float(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _counter_value(args: Mapping[str, Any], unit: str) -> float | None:
    if unit in args:
        return _finite(args[unit])
    return next((v for k, a in args.items() if k not in _TRIP_KEYS and (v := _finite(a)) is not None), None)


def _failed(args: Mapping[str, Any]) -> bool:
    return bool(args.get("error")) or args.get("failed") is True or args.get("status") in ("failed", "error")


def _trips_from_other(other: Mapping[str, Any]) -> list[tuple[str, float]]:
    board = other.get("board")
    table = other.get("trips", other.get("passive_trips"))
    if table is None and isinstance(board, dict):
        table = board.get("zones")
    if not isinstance(table, dict):
        return []
    out = []
    for zone, value in table.items():
        if isinstance(value, dict):
            value = next((value[k] for k in ("passive_trip_c", *_TRIP_KEYS) if k in value), None)
        trip = _finite(value)
        if trip is not None:
            out.append((str(zone), trip))
    return out
