"""Contention on the twin: a simulated device is shared in time, DRAM bandwidth between devices.

The SoC twin (a labelled simulator) models one stage run *alone* with a roofline at the
domain's clocks (``hetsched._planning.costs.roofline``): ``t = max(t_compute, t_memory)``.
When several runs are in flight on one board at once (two sessions on the NPU, a detector on
the NPU while a classifier runs on the GPU), this module stretches each of them:

**Device sharing (processor sharing).** A twin device's lone-run figure already uses the whole
device (the RK3588 twin's ``npu`` is its three cores, ``ops_per_cycle = 3 x 2048``; an RKNN
context is bound to cores, so two models on the whole NPU split its cores between them; a
device built on one core, like the RKNN backend's ``npu:1``, is a device of its own and shares
nothing but DRAM with the others). With ``n`` runs in flight on one device, each progresses at
``1/n`` of its lone rate: a run's modelled latency is ``t x n`` while the other stays, and the
device's busy time is the sum of the runs' own (lone) times, not of their latencies. This is
the fluid form of "one stage at a time per device": the same total busy time and the same
mean, without choosing who goes first (that is the scheduler's business, not the board's).

**Memory bandwidth (fair share at saturation).** A run of lone time ``t`` with memory time
``t_m`` demands ``d = t_m / t`` of the DRAM's peak while it progresses at full rate, ``d / n``
while it shares its device. When the demands of every run in flight on the board add up to
``U > 1``, the bus is saturated and each run's memory-bound fraction stretches by ``U``:
``m = 1 + d x (U - 1)``. The stall keeps the device busy (the kernel counts it as load), so a
run's busy time is ``t x m`` and its latency ``t x m x n``. Sources: HaX-CoNN (Dagli and
Belviranli, PPoPP'24; github.com/ismetdagli/HaX-CoNN) measured concurrent DNNs
on Orin/Xavier's GPU + DLA slowing each other through shared DRAM, little while demand is low
(the DLA model slowed 0-3 % beside a GPU model, Table 7), and models the slowdown from each
layer group's memory-throughput demand (PCCS, MICRO'21); below saturation this model adds
nothing (PCCS's sub-saturation regions are not modelled). RK3588: the NPU has 3 cores and
RKNN contexts are per core (rknn_api.h ``rknn_set_core_mask``); the twin's NPU device is the
three-core figure, shared as above.

The overlap is observed on the clock the board's runs are timed on: the host's monotonic
clock for live sessions (two sessions' stages really running at once on the host), an injected
clock in tests and in a board-time replay (``benchmarks/multi_model.py``). Between two
changes of the set of runs in flight the stretch is constant; a run's factors are their
averages over its own interval.

Boards are keyed (:func:`shared_board`) by the twin root a device belongs to, else by the
profile's name: two sessions of one process on ``twin_devices("rk3588")`` share one board.
Sessions in different processes on one root are not seen by each other here (the live twin
still sums their busy reports, so its loads, clocks, temperatures and energy follow the sum).

**Pacing** (:meth:`BoardContention.pace`, the sim backend's paced mode): a caller may hold its
run in flight until the run's modelled progress is done, so that it takes its modelled time
*on the host clock*, dilated by a factor ``K``: a run progresses at ``1 / (n x m)`` lone seconds
per clock second (``n`` runs on its device, ``m`` its DRAM stretch, both as above, changing
whenever another run starts or ends); it ends when its progress reaches ``K x`` its lone time.
The waiter sleeps until its end computed from the rates now and recomputes it at every change
of the set in flight (a condition variable, no polling).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from .._errors import TwinError

__all__ = [
    "BoardContention",
    "BoardContentionStatistics",
    "RunToken",
    "SharedRun",
    "shared_board",
]


@dataclass(frozen=True)
class SharedRun:
    """One run's modelled figures on a shared board (board seconds)."""

    alone_s: float
    """The run's lone time (roofline at the clocks it started at)."""
    latency_s: float
    """Its modelled time with the sharing: ``alone_s x memory_stretch x device_share``."""
    busy_s: float
    """The device time that is its own: ``alone_s x memory_stretch`` (what the device's busy time sums)."""
    memory_s: float
    """Seconds the memory was busy for it: its memory time stretched like its busy time."""
    device_share: float
    """Mean number of runs in flight on its device over its interval (1: alone)."""
    memory_stretch: float
    """Mean stretch of its time from a saturated DRAM (1: no saturation)."""


@dataclass
class RunToken:
    """A run in flight (returned by :meth:`BoardContention.begin`, given to :meth:`~BoardContention.end`)."""

    device: str
    alone_s: float
    memory_s: float
    demand: float
    started: float
    last: float = 0.0
    share_integral: float = 0.0
    stretch_integral: float = 0.0
    progress: float = 0.0
    """Clock seconds of lone-rate work done: the integral of ``1 / (share x stretch)``."""
    open: bool = True


@dataclass(frozen=True)
class BoardContentionStatistics:
    runs: int
    """Runs ended."""
    in_flight: int
    shared_runs: int
    """Runs that had another run on their device at some point."""
    stretched_runs: int
    """Runs slowed by a saturated DRAM at some point."""
    busy_s: dict[str, float] = field(default_factory=dict)
    """Per device: the sum of its runs' busy seconds (board time)."""
    latency_s: dict[str, float] = field(default_factory=dict)
    """Per device: the sum of its runs' modelled latencies."""


class BoardContention:
    """The runs in flight on one twin board and the sharing between them. Thread-safe.

    :param clock: seconds on the clock the runs are timed on (default ``time.monotonic``).
    :param wait: how :meth:`pace` waits: ``wait(condition, seconds)`` with the condition held
        (default ``condition.wait(seconds)``, which sleeps on the host clock: inject one that
        advances ``clock`` in tests with a virtual clock).
    """

    def __init__(self, clock: Callable[[], float] | None = None,
                 wait: Callable[[threading.Condition, float], object] | None = None) -> None:
        self._clock = clock or time.monotonic
        self._wait = wait or (lambda cond, seconds: cond.wait(seconds))
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._active: list[RunToken] = []
        self._runs = 0
        self._shared = 0
        self._stretched = 0
        self._busy: dict[str, float] = {}
        self._latency: dict[str, float] = {}

    def _factors(self) -> tuple[dict[str, int], float]:
        per_device: dict[str, int] = {}
        for r in self._active:
            per_device[r.device] = per_device.get(r.device, 0) + 1
        demand = sum(r.demand / per_device[r.device] for r in self._active)
        return per_device, demand

    def _advance(self, now: float) -> None:
        """Accumulate every run's share and stretch up to ``now`` (the set in flight was constant)."""
        if not self._active:
            return
        per_device, demand = self._factors()
        excess = max(0.0, demand - 1.0)
        for r in self._active:
            dt = now - r.last
            if dt > 0:
                stretch = 1.0 + r.demand * excess
                r.share_integral += dt * per_device[r.device]
                r.stretch_integral += dt * stretch
                r.progress += dt / (per_device[r.device] * stretch)
                r.last = now

    def _rate(self, token: RunToken) -> float:
        """``token``'s progress rate now: lone seconds per clock second."""
        per_device, demand = self._factors()
        return 1.0 / (per_device[token.device] * (1.0 + token.demand * max(0.0, demand - 1.0)))

    def pace(self, token: RunToken, work_s: float) -> None:
        """Block the calling thread until ``token``'s modelled progress reaches ``work_s`` clock
        seconds of lone-rate work (``K x`` its lone time for a run dilated ``K`` times), the
        others' runs starting and ending on the board meanwhile changing its rate.

        :raises TwinError: ``token`` is not in flight on this board, or ``work_s`` is not a finite
            number >= 0.
        """
        if isinstance(work_s, bool) or not isinstance(work_s, (int, float)) or not (0.0 <= work_s < math.inf):
            raise TwinError(f"contention: work_s = {work_s!r} must be a finite number of seconds >= 0")
        with self._changed:
            while True:
                if not token.open or not any(r is token for r in self._active):
                    raise TwinError("contention: pacing a run that is not in flight on this board")
                self._advance(self._clock())
                left = work_s - token.progress
                if left <= 1e-12 * max(1.0, work_s):
                    return
                self._wait(self._changed, left / self._rate(token))

    def begin(self, device: str, alone_s: float, memory_s: float = 0.0) -> RunToken:
        """A run of lone time ``alone_s`` (of which ``memory_s`` memory time) starts on ``device``.

        :raises TwinError: a time that is not a finite number >= 0, or ``memory_s > alone_s``.
        """
        for what, v in (("alone_s", alone_s), ("memory_s", memory_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0.0 <= v < math.inf):
                raise TwinError(f"contention: {what} = {v!r} must be a finite number of seconds >= 0")
        if memory_s > alone_s * (1 + 1e-9):
            raise TwinError(f"contention: memory_s = {memory_s!r} exceeds the run's time {alone_s!r}")
        demand = memory_s / alone_s if alone_s > 0 else 0.0
        with self._lock:
            now = self._clock()
            self._advance(now)
            token = RunToken(device, float(alone_s), float(memory_s), min(1.0, demand), now, now)
            self._active.append(token)
            self._changed.notify_all()  # the others' rates changed: paced waiters recompute their ends
            return token

    def end(self, token: RunToken) -> SharedRun:
        """The run ends: its modelled figures over the interval it was in flight.

        :raises TwinError: the token was already ended, or is not this board's.
        """
        with self._lock:
            if not token.open or not any(r is token for r in self._active):
                raise TwinError("contention: a run ended twice, or on another board")
            self._advance(self._clock())
            span = token.last - token.started
            if span > 0:
                share = token.share_integral / span
                stretch = token.stretch_integral / span
            else:  # no time passed on the clock (a virtual clock not advanced): the state now
                per_device, demand = self._factors()
                share = float(per_device[token.device])
                stretch = 1.0 + token.demand * max(0.0, demand - 1.0)
            token.open = False
            self._active = [r for r in self._active if r is not token]
            self._changed.notify_all()
            busy = token.alone_s * stretch
            run = SharedRun(token.alone_s, busy * share, busy, token.memory_s * stretch, share, stretch)
            self._runs += 1
            self._shared += share > 1.0 + 1e-12
            self._stretched += stretch > 1.0 + 1e-12
            self._busy[token.device] = self._busy.get(token.device, 0.0) + busy
            self._latency[token.device] = self._latency.get(token.device, 0.0) + run.latency_s
            return run

    def statistics(self) -> BoardContentionStatistics:
        with self._lock:
            return BoardContentionStatistics(self._runs, len(self._active), self._shared, self._stretched,
                                             dict(self._busy), dict(self._latency))


_BOARDS: weakref.WeakValueDictionary[str, BoardContention] = weakref.WeakValueDictionary()
"""Boards in use: a board lives while a stage of it does (a test's temporary root leaves nothing behind)."""
_BOARDS_LOCK = threading.Lock()


def shared_board(key: str, *, clock: Callable[[], float] | None = None,
                 wait: Callable[[threading.Condition, float], object] | None = None) -> BoardContention:
    """The process's :class:`BoardContention` of the board ``key`` (a twin root, or ``"soc:<name>"``).

    ``clock``, ``wait``: the clock (and pacing wait) of a board made now (tests inject them before
    the first stage of that board exists).

    :raises TwinError: ``clock`` given for a board that already exists (it keeps its clock).
    """
    with _BOARDS_LOCK:
        board = _BOARDS.get(key)
        if board is None:
            board = _BOARDS[key] = BoardContention(clock, wait)
        elif clock is not None or wait is not None:
            raise TwinError(f"contention: the board {key!r} already exists with its own clock")
        return board
