"""The mix served by hetsched's *real* code (``Session``, ``Runtime``, the scheduler) on paced twin devices.

Every twin device is in the sim backend's paced mode (``hetsched.backends.sim.paced_devices``):
a stage run is held in flight on the host for K x its modelled board time, with the twin's
contention model (runs starting and ending on its device or loading DRAM change its rate), and
its outputs are **not computed** (zeros of the declared shapes: the host's CPU speed does not
enter). The runtime and the sessions read an injected clock that is the host's divided by K
(:class:`BoardClock`), so SLOs, aging and the scheduler's stage estimates (the twin's modelled
seconds) are all in board seconds; latencies and throughput are host seconds / K. What is not
dilated: the runtime's own overhead and the host's scheduling noise, K times smaller in board
time than they are on the host.

Three ways to serve, as the replay's (``_board_replay.Mode``): independent ``Session`` s (each its own
private runtime and workers), one ``hetsched.Runtime`` with FIFO queues
(``Scheduling(priorities=False)``), one ``Runtime`` with hetsched's scheduler (its joint placement:
each session, opened most urgent first, is planned with the others' reservations *measured* at
attach, ``Runtime.reservations``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import onnx
from _board_replay import Mode, Stream

from hetsched import Device, Priority, Runtime, Scheduling, Session
from hetsched.backends.sim import paced_devices


class BoardClock:
    """The host's clocks divided by K: board seconds of a paced twin (a ``hetsched`` ``Clock``)."""

    def __init__(self, pace: float) -> None:
        self.pace = float(pace)

    def monotonic(self) -> float:
        return time.monotonic() / self.pace

    def perf_counter(self) -> float:
        return time.perf_counter() / self.pace


@dataclass
class _Record:
    requests: int = 0
    latencies_s: list[float] = field(default_factory=list)
    slo_requests: int = 0
    slo_met: int = 0
    energy_j: float = 0.0
    completed_all: int = 0
    """Requests the session completed up to its close (the denominator of its energy per request)."""


@dataclass(frozen=True)
class PacedResult:
    seconds: float
    streams: Mapping[str, _Record]
    worker_threads: int
    """``threading.active_count()`` in the middle of the window (measured)."""
    host_overrun_s: float
    """Largest lag of a detector frame's start behind its due time, board seconds (host noise)."""
    placement: Mapping[str, list[str]]


def _model_of(stream: str) -> str:
    return "background" if stream.startswith("background") else stream


async def serve(mode: Mode, nets: Mapping[str, onnx.ModelProto], feeds: Mapping[str, Mapping[str, np.ndarray]],
                board: Sequence[Device], mix: Sequence[Stream], *, pace: float, seconds: float,
                aging_s: float = 0.5) -> PacedResult:
    """Serve ``mix`` for ``seconds`` board seconds in ``mode`` on the twin devices ``board``, paced; return per stream
    the requests admitted in the window, the latencies (board s) of those finished in it, SLO counts
    (requests due in the window) and modelled energy."""
    clock = BoardClock(pace)
    devices = paced_devices(board, pace)
    records = {s.name: _Record() for s in mix}
    sessions: dict[str, Session] = {}
    async with AsyncExitStack() as stack:
        rt = None
        if mode is not Mode.INDEPENDENT:
            rt = await stack.enter_async_context(Runtime(
                devices=devices, clock=clock,
                scheduling=Scheduling(priorities=mode is Mode.RUNTIME_SCHEDULED, aging_s=aging_s)))
        rates = {s.name: float(s.rate_hz) for s in mix}  # each stream's offered requests/s (0: closed loop)
        for s in sorted(mix, key=lambda s: s.priority):  # most urgent first: joint placement sees the earlier
            if s.fed_by is not None:
                rates[s.name] = rates[s.fed_by] * s.per_result
            kw: dict[str, Any] = {"runtime": rt} if rt is not None else {
                "devices": devices, "clock": clock, "scheduling": Scheduling(aging_s=aging_s)}
            sessions[s.name] = await stack.enter_async_context(
                Session(nets[_model_of(s.name)], name=s.name, priority=Priority(s.priority), slo_s=s.slo_s,
                        rate_hz=rates[s.name] or None, **kw))
        for s in mix:  # one request each before the window (first-run setup off the clock)
            await sessions[s.name].run(feeds[_model_of(s.name)])
        t0 = clock.monotonic()
        t_end = t0 + seconds
        overrun = 0.0
        threads = 0

        async def one(name: str) -> None:
            rec = records[name]
            stream = next(x for x in mix if x.name == name)
            start = clock.monotonic()
            rec.requests += 1
            judged = stream.slo_s is not None and start + stream.slo_s <= t_end
            rec.slo_requests += judged  # unfinished at the window's end (cancelled): missed
            await sessions[name].run(feeds[_model_of(name)])
            done = clock.monotonic()
            if done <= t_end:
                rec.latencies_s.append(done - start)
            if judged and stream.slo_s is not None:
                rec.slo_met += done - start <= stream.slo_s
            for other in mix:
                if other.fed_by == name and done <= t_end:
                    for _ in range(other.per_result):
                        tg.start_soon(one, other.name)

        async def periodic(stream: Stream) -> None:
            nonlocal overrun
            period = 1.0 / stream.rate_hz
            for i in range(math.ceil(seconds * stream.rate_hz)):
                due = t0 + i * period
                await anyio.sleep(max(0.0, (due - clock.monotonic()) * pace))
                overrun = max(overrun, clock.monotonic() - due)
                tg.start_soon(one, stream.name)

        async def closed_loop(stream: Stream) -> None:
            while clock.monotonic() < t_end:
                await one(stream.name)

        async def count_threads() -> None:
            nonlocal threads
            await anyio.sleep(seconds * pace / 2)
            threads = threading.active_count()

        async with anyio.create_task_group() as tg:
            tg.start_soon(count_threads)
            for s in mix:
                if s.rate_hz > 0:
                    tg.start_soon(periodic, s)
                for _ in range(s.clients):
                    tg.start_soon(closed_loop, s)
            await anyio.sleep(seconds * pace)
            tg.cancel_scope.cancel()  # requests still in flight at the window's end: not counted
        placement = {n: [st.device for st in sessions[n].plan.stages] for n in sessions}
        for name, sess in sessions.items():
            st = sess.statistics()
            records[name].energy_j = float(st.energy_j or 0.0)
            records[name].completed_all = st.requests_completed
    return PacedResult(seconds, records, threads, overrun, placement)
