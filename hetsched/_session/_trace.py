"""Chrome / Perfetto traces of a session: ``Session(..., trace=PATH)``, ``hetsched run --trace PATH``.

:class:`SessionTrace` turns a session's hook events into Chrome trace events (the JSON format
Perfetto's UI and chrome://tracing load; spec:
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) and hands them
to a :class:`~hetsched._session._trace_writer.TraceWriter`. What a viewer shows, process by process::

    board            counters: freq <domain> (MHz), temp <zone> (C), power <rail> (W), sampled
                     every ``period_s`` when the root has telemetry (hetsched/_session/_trace_counters.py)
    governor         one slice per DVFS phase (name = the phase; args: the clock targets)
    device <name>    a thread per device worker thread: one slice per stage run (name = the
                     stage; args: request id, priority, bound, energy_j where a backend reports
                     it (a twin's modelled figure), error, queued_us, since_request_start_us)
    transfers        a track per channel: one slice per copy segment (a preempted copy is two
                     segments), instants ``preempted`` / ``resumed``, ``mapped`` for zero-copy
    requests         one slice ``request <id>`` per run() request, REQUEST_START..REQUEST_END
    compile          one slice per stage compile, on the compile thread that ran it
    replan           a global instant with the reason

A :class:`~hetsched.Runtime`'s trace (``Runtime(trace=PATH)``) is one file for every session
attached to it: each session has its own process ``requests <session>`` (its requests' lanes and
its re-plans), and its stage slices on the device workers are named ``<session>: <stage>`` with
``args.session`` (request ids are numbered per session: a request is ``(session, id)``).

Timestamps are microseconds since the trace opened, all read from the session's clock
(``EventInfo.time_s`` is ``clock.perf_counter()``; telemetry is stamped with the same clock).
Slices of one track never overlap: a worker thread runs one stage at a time; copies waiting
for a busy channel and requests in flight together go on lanes (``channel X (2)``,
``requests 2``), each lane holding one slice at a time.

Hooks run in device worker threads, compile threads and the event loop: one lock guards the
state here; the writer's buffer has its own. Governor phases are read from the governor of each
:class:`~hetsched.GovernorHooks` (``SessionGovernor.current_phase``; the clock targets from a
:class:`~hetsched.Governor`'s engine) right after the governor's own hooks ran: the main hooks object is
registered after every other hook (it runs last on before-events) and a probe before them
(it runs last on after-events, which unwind in reverse).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import TraceWriteError
from .._events import CompileInfo, EventInfo, Hooks, ReplanInfo
from .._runtime._clock import Clock
from ._governed import GovernorHooks
from ._trace_counters import CounterSampler
from ._trace_writer import TraceStatistics, TraceWriter

if TYPE_CHECKING:
    from .._governor import GovernorEngine, Phase
    from .._runtime._program import StageIO

__all__ = ["SessionTrace", "TraceStatistics"]

PID_BOARD, PID_GOVERNOR, PID_REQUESTS, PID_TRANSFERS, PID_COMPILE, PID_DEVICES = 1, 2, 3, 4, 5, 10
PID_SESSIONS = 1000
"""A runtime's trace: the ``requests <session>`` process of its i-th session is ``PID_SESSIONS + i``."""
_PROCESSES = {PID_BOARD: ("board", 0), PID_GOVERNOR: ("governor", 1), PID_TRANSFERS: ("transfers", 50),
              PID_REQUESTS: ("requests", 60), PID_COMPILE: ("compile", 70)}
_MAX_OPEN_TRANSFERS = 4096
"""Copy segments tracked at once; a cancelled copy never ends, so the oldest are forgotten."""


def _error_text(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    if type(exc).__name__ in ("CancelledError", "Cancelled"):  # asyncio's, trio's: the text names tasks
        return "cancelled"
    return f"{type(exc).__name__}: {exc}"


class _Lanes:
    """Lowest free lane first, so a track fills lane 0 and opens more only under overlap."""

    def __init__(self) -> None:
        self._busy: list[bool] = []

    def take(self) -> int:
        for i, busy in enumerate(self._busy):
            if not busy:
                self._busy[i] = True
                return i
        self._busy.append(True)
        return len(self._busy) - 1

    def give(self, lane: int) -> None:
        if 0 <= lane < len(self._busy):
            self._busy[lane] = False


class SessionTrace:
    """A session's trace (see the module docstring); owned by the session.

    Lifecycle: :meth:`wrap_hooks` when the session is made (the hooks are fixed then),
    :meth:`open` when it opens (blocking), :meth:`sample_forever` in the session's task group,
    :meth:`close` in its shutdown (blocking; every exit path).

    :param path: the trace file.
    :param clock: the session's clock.
    :param root: the sysfs root sampled for counters.
    :param period_s: seconds between counter samples.
    :raises TypeError: ``path`` is not a str or path-like.
    :raises ValueError: ``period_s`` is not positive.
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock, root: str | os.PathLike[str],
                 period_s: float = 0.1):
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"trace must be a file path (str or os.PathLike) or None, got {type(path).__name__}")
        if not period_s > 0:
            raise ValueError(f"trace period_s must be positive, got {period_s!r}")
        self.path = os.fspath(path)
        self.period_s = float(period_s)
        self._clock = clock
        self._root = root
        self._writer = TraceWriter(self.path)
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._governors: list[GovernorHooks] = []
        self._sampler: CounterSampler | None = None
        self._devices: list[str] = []
        self._reset()

    def _reset(self) -> None:
        self._named: set[int] = set()
        self._tracks: dict[tuple[Any, ...], int] = {}
        self._next_tid = 1
        self._device_pids: dict[str, int] = {}
        self._stage_open: dict[int, tuple[float, int | None, str | None, str | None, str]] = {}
        self._compile_open: dict[int, float] = {}
        self._requests: dict[tuple[str | None, int], tuple[float, int, str | None]] = {}
        self._last_end: dict[tuple[str | None, int], float] = {}
        self._req_lanes: dict[str | None, _Lanes] = {}
        self._session_pids: dict[str, int] = {}
        self._chan_lanes: dict[str, _Lanes] = {}
        self._xfers: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._phases: list[tuple[Phase, float, dict[str, float]] | None] = [None] * len(self._governors)

    # -- wiring --------------------------------------------------------------------------------

    def wrap_hooks(self, hooks: Sequence[object]) -> list[object]:
        """``hooks`` with this trace's hook objects around them (see the module docstring);
        the governor of each :class:`hetsched.GovernorHooks` among them gets its phases traced
        (another hook holding a governor does not)."""
        self._governors = [h for h in hooks if isinstance(h, GovernorHooks)]
        self._phases = [None] * len(self._governors)
        probe: list[object] = [_PhaseProbe(self)] if self._governors else []
        return [*probe, *hooks, _TraceHooks(self)]

    def session_hooks(self) -> _TraceHooks:
        """The hooks of one session of a runtime's trace (registered after the session's others);
        its track is named by :meth:`_TraceHooks.label` once the runtime gave it its name."""
        return _TraceHooks(self, session="?")

    def watch_governors(self, hooks: Sequence[GovernorHooks]) -> None:
        """Trace the phases of the governors of ``hooks`` (a runtime's :class:`hetsched.GovernorHooks`),
        polled every ``period_s`` (before :meth:`open`)."""
        self._governors = list(hooks)
        self._phases = [None] * len(self._governors)

    def open(self, devices: Sequence[str]) -> None:
        """Create the file, name the device processes, find the root's telemetry (blocking).

        :raises OSError: the file cannot be created; :class:`TraceWriteError` (an ``OSError``) when
            its first bytes cannot be written (a full disk).
        """
        self._writer.open()
        with self._lock:
            self._t0 = self._clock.perf_counter()
            self._reset()
            self._devices = list(devices)
            for name in devices:
                self._device_pid(name)
        self._sampler = CounterSampler.for_root(self._root, clock=self._clock.perf_counter, pid=PID_BOARD,
                                                to_us=self._us)
        if self._sampler is not None:
            with self._lock:
                self._process(PID_BOARD)
            self._sampler.sample(self._writer.emit)

    @property
    def wants_task(self) -> bool:
        """True when :meth:`sample_forever` has something to do (counters or a governor)."""
        return self._sampler is not None or bool(self._governors)

    async def sample_forever(self) -> None:
        """Sample counters (in a worker thread) and governor phases every ``period_s``, until
        cancelled (the session's task group)."""
        while True:
            await anyio.sleep(self.period_s)
            if self._sampler is not None:
                await anyio.to_thread.run_sync(self._sampler.sample, self._writer.emit)
            if self._governors:
                self.poll_phases()

    def close(self, error: BaseException | None = None) -> None:
        """End what is still open at the session's clock now, write the tail, close the file
        (blocking; idempotent)."""
        with self._lock:
            now = self._clock.perf_counter()
            self._end_phases(now)
            for ident, (start, rid, stage, device, thread) in list(self._stage_open.items()):
                pid = self._device_pid(device)
                self._slice(pid, self._thread_tid(pid, ident, thread), stage or "stage", start, now,
                            {"request_id": rid, "unfinished": True}, cat="stage")
            for (channel, label), (start, lane, _) in list(self._xfers.items()):
                self._slice(PID_TRANSFERS, self._lane_tid(channel, lane), label.rpartition("#")[0] or label,
                            start, now, {"channel": channel, "unfinished": True})
            for (session, rid), (start, lane, prio) in list(self._requests.items()):
                pid = self._requests_pid(session)
                self._slice(pid, self._request_tid(lane, pid), f"request {rid}", start, now,
                            {"request_id": rid, "session": session, "priority": prio, "unfinished": True})
            self._stage_open.clear()
            self._xfers.clear()
            self._requests.clear()
        if self._sampler is not None:
            self._sampler.sample(self._writer.emit)  # the counter tracks reach the end of the trace
        board = dict(self._sampler.other_data()) if self._sampler is not None else None
        self._writer.close({
            "generator": "hetsched", "clock": repr(self._clock), "clock_origin_s": self._t0,
            "ts_unit": "us since clock_origin_s on the session's clock.perf_counter()",
            "trace_period_s": self.period_s, "devices": self._devices, "board": board,
            "session_error": _error_text(error),
        })

    @property
    def failure(self) -> TraceWriteError | None:
        """After :meth:`close`: the error that stopped the file early (a full disk), naming it and
        where it ends; the session raises it as it closes. None: written whole."""
        return self._writer.failure

    def statistics(self) -> TraceStatistics:
        return self._writer.statistics()

    # -- building events (under self._lock) ------------------------------------------------------

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e9) / 1e3

    def _emit(self, ev: dict[str, Any]) -> None:
        self._writer.emit(ev)

    def _process(self, pid: int, name: str | None = None, sort: int | None = None) -> int:
        if pid not in self._named:
            self._named.add(pid)
            pname, psort = _PROCESSES.get(pid, (name or f"process {pid}", sort or pid))
            self._emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
            self._emit({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": psort}})
        return pid

    def _device_pid(self, device: str | None) -> int:
        name = device or "?"
        pid = self._device_pids.get(name)
        if pid is None:
            pid = self._device_pids[name] = PID_DEVICES + len(self._device_pids)
            self._process(pid, f"device {name}", pid)
        return pid

    def _track(self, pid: int, key: tuple[Any, ...], name: str) -> int:
        track = (pid, *key)
        tid = self._tracks.get(track)
        if tid is None:
            tid = self._tracks[track] = self._next_tid
            self._next_tid += 1
            self._process(pid)
            self._emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            self._emit({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return tid

    def _thread_tid(self, pid: int, ident: int, name: str) -> int:
        return self._track(pid, ("thread", ident), name)

    def _lane_tid(self, channel: str, lane: int) -> int:
        return self._track(PID_TRANSFERS, ("channel", channel, lane),
                           f"channel {channel}" + (f" ({lane + 1})" if lane else ""))

    def _request_tid(self, lane: int, pid: int = PID_REQUESTS) -> int:
        return self._track(pid, ("lane", lane), f"requests {lane + 1}")

    def _requests_pid(self, session: str | None) -> int:
        """The process of a session's requests: ``requests`` alone, ``requests <session>`` in a runtime's."""
        if session is None:
            return PID_REQUESTS
        pid = self._session_pids.get(session)
        if pid is None:
            pid = self._session_pids[session] = PID_SESSIONS + len(self._session_pids)
            self._process(pid, f"requests {session}", pid)
        return pid

    def _slice(self, pid: int, tid: int, name: str, start: float, end: float, args: dict[str, Any],
               cat: str | None = None) -> None:
        ts, te = self._us(start), self._us(max(start, end))
        ev: dict[str, Any] = {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": round(te - ts, 3),
                              "args": {k: v for k, v in args.items() if v is not None}}
        if cat:
            ev["cat"] = cat
        self._emit(ev)

    def _instant(self, pid: int, tid: int, name: str, t: float, args: dict[str, Any], scope: str = "t") -> None:
        self._emit({"ph": "i", "s": scope, "name": name, "pid": pid, "tid": tid, "ts": self._us(t),
                    "args": {k: v for k, v in args.items() if v is not None}})

    # -- governor phases --------------------------------------------------------------------------

    def poll_phases(self) -> None:
        """Close the slice of a governor whose phase changed and open the next (any thread)."""
        with self._lock:
            now = self._clock.perf_counter()
            for i, hooks in enumerate(self._governors):
                try:
                    phase = hooks.governor.current_phase
                except Exception:  # a governor closing meanwhile: its last phase ends at close()
                    continue
                cur = self._phases[i]
                if cur is not None and cur[0] == phase:
                    continue
                if cur is not None:
                    self._phase_slice(i, cur, now)
                self._phases[i] = None if phase is None else (phase, now, self._targets(hooks.engine))

    def _end_phases(self, now: float) -> None:
        for i, cur in enumerate(self._phases):
            if cur is not None:
                self._phase_slice(i, cur, now)
            self._phases[i] = None

    def _phase_slice(self, i: int, cur: tuple[Phase, float, dict[str, float]], now: float) -> None:
        phase, start, targets = cur
        tid = self._track(PID_GOVERNOR, ("governor", i), "phase" if i == 0 else f"phase ({i + 1})")
        self._slice(PID_GOVERNOR, tid, str(phase), start, now,  # a Phase (a StrEnum) prints as its value
                    {"targets_mhz": targets or None}, cat="phase")

    @staticmethod
    def _targets(engine: GovernorEngine | None) -> dict[str, float]:
        """The clock targets of a :class:`hetsched.Governor`'s engine (none for another governor)."""
        try:
            current = engine.current if engine is not None else {}
            return {str(k): round(int(v) / 1e6, 3) for k, v in dict(current).items()}
        except Exception:  # read from another thread while the governor writes: a report, never a failure
            return {}


class _TraceHooks(Hooks):
    """The session's hooks that feed a :class:`SessionTrace` (registered after all others)."""

    def __init__(self, trace: SessionTrace, session: str | None = None):
        self._t = trace
        self._poll = trace.poll_phases if trace._governors else None
        self.session = session
        """The session's name in a runtime's trace (None: the trace of one session)."""

    def label(self, session: str) -> None:
        """Name the session these hooks trace (the runtime, when it attaches)."""
        self.session = session

    # compile threads
    def before_compile(self, info: EventInfo) -> None:
        t = self._t
        with t._lock:
            t._compile_open[threading.get_ident()] = info.time_s

    def after_compile(self, info: EventInfo) -> None:
        c: CompileInfo = info.extra  # AFTER_COMPILE's
        t, ident = self._t, threading.get_ident()
        with t._lock:
            start = t._compile_open.pop(ident, info.time_s - (info.elapsed_s or 0.0))
            tid = t._thread_tid(PID_COMPILE, ident, threading.current_thread().name)
            t._slice(PID_COMPILE, tid, f"compile {info.stage}", start, info.time_s, {
                "device": info.device, "index": c.index, "total": c.total, "cached": c.cached, "trial": c.trial or None,
                "error": _error_text(info.error)}, cat="compile")

    # device worker threads
    def before_stage(self, info: EventInfo) -> None:
        t = self._t
        with t._lock:
            t._stage_open[threading.get_ident()] = (info.time_s, info.request_id, info.stage, info.device,
                                                    threading.current_thread().name)
        if self._poll is not None:
            self._poll()

    def after_stage(self, info: EventInfo) -> None:
        t, ident, rid = self._t, threading.get_ident(), info.request_id
        io: StageIO = info.extra  # AFTER_STAGE's
        with t._lock:
            begin = t._stage_open.pop(ident, None)
            start = (begin[0] if begin is not None and begin[1:3] == (rid, info.stage)
                     else info.time_s - (info.elapsed_s or 0.0))
            pid = t._device_pid(info.device)
            tid = t._thread_tid(pid, ident, threading.current_thread().name)
            session = self.session
            args: dict[str, Any] = {
                "request_id": rid, "session": session,
                "priority": info.priority.name if info.priority is not None else None,
                "bound": io.bound, "energy_j": info.energy_j, "error": _error_text(info.error)}
            key = (session, rid) if rid is not None else None
            req = t._requests.get(key) if key is not None else None
            if req is not None and key is not None:
                args["since_request_start_us"] = round((start - req[0]) * 1e6, 3)
                args["queued_us"] = round(max(0.0, start - t._last_end.get(key, req[0])) * 1e6, 3)
                t._last_end[key] = info.time_s
            name = info.stage or "stage"
            t._slice(pid, tid, name if session is None else f"{session}: {name}", start, info.time_s, args,
                     cat="stage")

    # the event loop
    def request_start(self, info: EventInfo) -> None:
        t = self._t
        if info.request_id is None:
            return
        with t._lock:
            lanes = t._req_lanes.setdefault(self.session, _Lanes())
            t._requests[(self.session, info.request_id)] = (
                info.time_s, lanes.take(), info.priority.name if info.priority is not None else None)
        if self._poll is not None:
            self._poll()

    def request_end(self, info: EventInfo) -> None:
        t, rid = self._t, info.request_id
        if rid is None:
            return
        session = self.session
        with t._lock:
            req = t._requests.pop((session, rid), None)
            t._last_end.pop((session, rid), None)
            if req is None:
                return
            start, lane, prio = req
            t._req_lanes[session].give(lane)
            pid = t._requests_pid(session)
            t._slice(pid, t._request_tid(lane, pid), f"request {rid}", start, info.time_s,
                     {"request_id": rid, "session": session, "priority": prio, "energy_j": info.energy_j,
                      "error": _error_text(info.error)}, cat="request")

    def before_transfer(self, info: EventInfo) -> None:
        x = info.extra
        if x is None or x.channel is None:
            return  # a zero-copy mapping: one instant at after_transfer
        with self._t._lock:
            self._open_segment(x, info.time_s)

    def after_transfer(self, info: EventInfo) -> None:
        t, x = self._t, info.extra
        if x is None:
            return
        with t._lock:
            if x.channel is None:
                tid = t._track(PID_TRANSFERS, ("mapped",), "zero-copy mappings")
                t._instant(PID_TRANSFERS, tid, "mapped", info.time_s,
                           {"label": x.label, "src": x.src, "dst": x.dst, "nbytes": x.nbytes})
            else:
                self._close_segment(x, info.time_s, "done")

    def preempted(self, info: EventInfo) -> None:
        t, x = self._t, info.extra
        with t._lock:
            tid = self._close_segment(x, info.time_s, "preempted")
            t._instant(PID_TRANSFERS, tid if tid is not None else t._lane_tid(x.channel, 0), "preempted",
                       info.time_s, {"label": x.label, "offset": x.offset, "nbytes": x.nbytes, "priority": x.priority})

    def resumed(self, info: EventInfo) -> None:
        t, x = self._t, info.extra
        with t._lock:
            lane = self._open_segment(x, info.time_s)
            t._instant(PID_TRANSFERS, t._lane_tid(x.channel, lane), "resumed", info.time_s,
                       {"label": x.label, "offset": x.offset, "nbytes": x.nbytes, "priority": x.priority})

    def _open_segment(self, x: Any, time_s: float) -> int:
        t = self._t
        lanes = t._chan_lanes.setdefault(x.channel, _Lanes())
        if len(t._xfers) >= _MAX_OPEN_TRANSFERS:
            (old_ch, _), (_, old_lane, _) = oldest = next(iter(t._xfers.items()))
            del t._xfers[oldest[0]]
            t._chan_lanes[old_ch].give(old_lane)
        lane = lanes.take()
        t._xfers[(x.channel, x.label)] = (time_s, lane, x.offset)
        return lane

    def _close_segment(self, x: Any, time_s: float, how: str) -> int | None:
        t = self._t
        seg = t._xfers.pop((x.channel, x.label), None)
        if seg is None:
            return None
        start, lane, offset = seg
        t._chan_lanes[x.channel].give(lane)
        tid = t._lane_tid(x.channel, lane)
        head, _, rid = x.label.rpartition("#")
        t._slice(PID_TRANSFERS, tid, head or x.label, start, time_s, {
            "src": x.src, "dst": x.dst, "channel": x.channel, "nbytes": x.nbytes, "bytes": x.offset - offset,
            "priority": x.priority, "request_id": int(rid) if rid.isdigit() else None, "end": how}, cat="transfer")
        return tid

    def replan(self, info: EventInfo) -> None:
        r: ReplanInfo = info.extra  # REPLAN's
        t = self._t
        with t._lock:
            pid = t._requests_pid(self.session)
            t._process(pid)
            t._instant(pid, 0, "replan", info.time_s, {
                "session": self.session, "reason": r.reason, "number": r.number, "moved_units": r.moved_units,
                "quarantined": list(r.quarantined) or None, "seconds": r.seconds}, scope="g")


class _PhaseProbe(Hooks):
    """Registered before every other hook: runs last on after-events, after the governor's."""

    def __init__(self, trace: SessionTrace):
        self._poll: Callable[[], None] = trace.poll_phases

    def after_stage(self, info: EventInfo) -> None:
        self._poll()

    def request_end(self, info: EventInfo) -> None:
        self._poll()
