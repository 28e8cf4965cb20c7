"""A board-time replay of several models served on one twin board (discrete events, fluid sharing).

The figures are the SoC twin's (a labelled simulator), in *board* seconds, so they do not
depend on how fast this host runs the stages. Each stage's lone time, memory time and energy
come from the twin's own model of that stage (``hetsched._planning.costs.roofline`` at the
top clocks, the launch of a stage call, ``DomainProfile.full_power_w``): what the twin's
simulated stage reports for one run. The sharing between runs in flight at once is the twin's
contention model (``hetsched/_twin/contention.py``): ``n`` runs on one device progress at
``1/n`` of their rate each; a saturated DRAM stretches each run's memory-bound fraction by the
total demand. Here it is applied exactly (the rates change only at events), where a live
session applies it to the overlap it sees on the host.

Three ways to serve (:class:`Mode`):

- ``INDEPENDENT``: one Session per model, as today: each has its own worker per device and its
  own queue (FIFO: each session has one priority), so two sessions' stages run on one device
  *at once* and share it (the twin's processor sharing); each model is placed alone.
- ``RUNTIME_FIFO``: one set of device workers for every model (one stage at a time per
  device), one FIFO queue per device, each model placed alone.
- ``RUNTIME_SCHEDULED``: one set of workers, each device's queue ordered by hetsched's
  scheduler's key (``hetsched/_runtime/_tenants.py``, R's note of 15:27): ``p x aging_s`` plus,
  with an SLO, the latest start ``deadline - remaining`` (remaining: the longest path of stage
  estimates from the stage to the end), or for a request found late (``now + remaining >
  deadline``, at admission or any push) its flag time ``+ max(max SLO, aging_s / 2)``; without
  an SLO, with several sessions, a fair start tag ``max(now, finish[t])``, ``finish[t] += cost x
  W`` (equal weights, ``W`` the sessions with requests in flight, ``cost`` the request's stage
  estimates); one session: its admission time. Not modelled: the re-check at pop. And the models
  placed jointly (each knowing the others' reservations, ``PlacementProblem``).

This is a model of the three serving disciplines on the twin, not a run of hetsched's own
scheduler code: ``benchmarks/multi_model.py`` says so in its JSON line.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Mode", "ModelPlan", "Replay", "ReplayResult", "StagePlan", "Stream", "StreamResult"]

_EPS = 1e-12


class Mode(enum.Enum):
    INDEPENDENT = "independent_sessions"
    RUNTIME_FIFO = "runtime_fifo"
    RUNTIME_SCHEDULED = "runtime_scheduled"


@dataclass(frozen=True)
class StagePlan:
    device: str
    alone_s: float
    """Lone board seconds of one run (roofline + the launch of the stage call)."""
    memory_s: float
    """Of which the memory is the bottleneck (roofline memory time)."""
    energy_j: float
    """Modelled joules of one lone run."""
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelPlan:
    stages: tuple[StagePlan, ...]

    def remaining(self, stage: int) -> float:
        """The longest path of lone stage seconds from ``stage`` to the end of the model."""
        after = [self.remaining(i) for i, st in enumerate(self.stages) if stage in st.deps]
        return self.stages[stage].alone_s + max(after, default=0.0)

    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.device for s in self.stages))

    def seconds(self) -> float:
        return sum(s.alone_s for s in self.stages)


@dataclass(frozen=True)
class Stream:
    """One model's requests: ``rate_hz`` periodic, ``fed_by`` (``per_result`` requests per finished
    request of that stream) or ``clients`` closed loops."""

    name: str
    priority: int
    slo_s: float | None = None
    rate_hz: float = 0.0
    fed_by: str | None = None
    per_result: int = 0
    clients: int = 0


@dataclass
class _Request:
    stream: str
    rid: int
    admitted: float
    deadline: float | None
    plan: ModelPlan
    left: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)
    energy_j: float = 0.0
    flagged_at: float | None = None


@dataclass
class _Run:
    req: _Request
    stage: int
    worker: tuple[str, str]
    remaining: float
    demand: float
    started: float
    busy_s: float = 0.0


@dataclass(frozen=True)
class StreamResult:
    requests: int
    completed: int
    latencies_s: tuple[float, ...]
    slo_requests: int
    """Requests whose deadline fell inside the window (admitted at least one SLO before its end):
    the denominator of the SLO satisfaction, finished or not."""
    slo_met: int
    """Of those, the ones finished by their deadline."""
    energy_j: float


@dataclass(frozen=True)
class ReplayResult:
    seconds: float
    streams: Mapping[str, StreamResult]
    device_busy_s: Mapping[str, float]
    run_busy_s: Mapping[str, float]
    """Per device: the sum of the runs' own busy seconds (equals ``device_busy_s``: the check)."""
    workers: int
    """Device workers the mode has (one per device, or per session and device)."""


class Replay:
    """Serve ``streams`` with per-stream ``plans`` for ``seconds`` of board time in ``mode``."""

    def __init__(self, mode: Mode, streams: Sequence[Stream], plans: Mapping[str, ModelPlan], devices: Sequence[str],
                 *, aging_s: float = 0.5, fair_per_class: bool = False) -> None:
        """:param fair_per_class: a fair tag's share counts only the sessions with requests in flight in
        the request's own priority class (the scheduler counts every class's: ``False``)."""
        self.mode = mode
        self.streams = {s.name: s for s in streams}
        self.plans = plans
        self.devices = tuple(devices)
        self.aging_s = aging_s
        self.fair_per_class = fair_per_class
        self.now = 0.0
        self._seq = itertools.count()
        self._rid = itertools.count()
        self._queues: dict[tuple[str, str], list[tuple[float, int, _Request, int]]] = {}
        self._running: dict[tuple[str, str], _Run] = {}
        self._arrivals: list[tuple[float, int, str]] = []
        self._lat: dict[str, list[float]] = {s.name: [] for s in streams}
        self._req_count = {s.name: 0 for s in streams}
        self._met = {s.name: 0 for s in streams}
        self._admitted: dict[str, list[float]] = {s.name: [] for s in streams}
        self._energy = {s.name: 0.0 for s in streams}
        self._dev_busy = {d: 0.0 for d in devices}
        self._in_flight = {s.name: 0 for s in streams}
        self._finish_tag = {s.name: 0.0 for s in streams}
        self._max_slo = max((s.slo_s for s in streams if s.slo_s), default=0.0)
        self._run_busy = {d: 0.0 for d in devices}

    def _worker(self, stream: str, device: str) -> tuple[str, str]:
        return (stream if self.mode is Mode.INDEPENDENT else "", device)

    def _admit(self, stream: str) -> None:
        s = self.streams[stream]
        plan = self.plans[stream]
        req = _Request(stream, next(self._rid), self.now, self.now + s.slo_s if s.slo_s else None, plan,
                       set(range(len(plan.stages))))
        self._req_count[stream] += 1
        self._in_flight[stream] += 1
        self._admitted[stream].append(self.now)
        for i, st in enumerate(plan.stages):
            if not st.deps:
                self._push(req, i)

    def _key(self, req: _Request, stage: int) -> float:
        if self.mode is not Mode.RUNTIME_SCHEDULED:
            return req.admitted  # FIFO: admission order (a session's own queue, or the runtime's)
        step = self.aging_s
        prio = self.streams[req.stream].priority * step
        if req.deadline is not None:
            remaining = req.plan.remaining(stage)
            if req.flagged_at is None and self.now + remaining > req.deadline + _EPS:
                req.flagged_at = self.now
            if req.flagged_at is not None:  # late: after the class's on-time ones
                return req.flagged_at + max(self._max_slo, step / 2) + prio
            return req.deadline - remaining + prio
        if len(self.streams) < 2:
            return req.admitted + prio
        cls = self.streams[req.stream].priority
        busy = sum(1 for n, k in self._in_flight.items()
                   if k > 0 and (not self.fair_per_class or self.streams[n].priority == cls))
        tag = max(self.now, self._finish_tag[req.stream])
        self._finish_tag[req.stream] = tag + req.plan.seconds() * max(1, busy)
        return tag + prio

    def _push(self, req: _Request, stage: int) -> None:
        w = self._worker(req.stream, req.plan.stages[stage].device)
        heapq.heappush(self._queues.setdefault(w, []), (self._key(req, stage), next(self._seq), req, stage))

    def _dispatch(self) -> None:
        for w, q in self._queues.items():
            if q and w not in self._running:
                _, _, req, stage = heapq.heappop(q)
                st = req.plan.stages[stage]
                demand = min(1.0, st.memory_s / st.alone_s) if st.alone_s > 0 else 0.0
                self._running[w] = _Run(req, stage, w, st.alone_s, demand, self.now)

    def _rates(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Per running worker: (progress rate in lone seconds per board second, device share)."""
        per_dev: dict[str, int] = {}
        for w in self._running:
            per_dev[w[1]] = per_dev.get(w[1], 0) + 1
        demand = sum(r.demand / per_dev[w[1]] for w, r in self._running.items())
        excess = max(0.0, demand - 1.0)
        return {w: (1.0 / (per_dev[w[1]] * (1.0 + r.demand * excess)), 1.0 / per_dev[w[1]])
                for w, r in self._running.items()}

    def _finish(self, run: _Run) -> None:
        req, st = run.req, run.req.plan.stages[run.stage]
        req.energy_j += st.energy_j * (run.busy_s / st.alone_s if st.alone_s > 0 else 1.0)
        self._run_busy[st.device] += run.busy_s
        req.left.discard(run.stage)
        req.done.add(run.stage)
        for i, other in enumerate(req.plan.stages):
            if i in req.left and run.stage in other.deps and all(d in req.done for d in other.deps):
                self._push(req, i)
        if not req.left:
            self._in_flight[req.stream] -= 1
            s = self.streams[req.stream]
            lat = self.now - req.admitted
            self._lat[req.stream].append(lat)
            self._energy[req.stream] += req.energy_j
            if s.slo_s is not None and lat <= s.slo_s + _EPS:
                self._met[req.stream] += 1
            for other in self.streams.values():
                if other.fed_by == req.stream:
                    for _ in range(other.per_result):
                        self._admit(other.name)
            if s.clients:
                self._admit(s.name)

    def _judged(self, stream: str, seconds: float) -> int:
        slo = self.streams[stream].slo_s
        if slo is None:
            return 0
        return sum(1 for t in self._admitted[stream] if t + slo <= seconds)

    def run(self, seconds: float) -> ReplayResult:
        for s in self.streams.values():
            if s.rate_hz > 0:
                heapq.heappush(self._arrivals, (0.0, next(self._seq), s.name))
            for _ in range(s.clients):
                self._admit(s.name)
        while True:
            self._dispatch()
            rates = self._rates()
            t_next = self._arrivals[0][0] if self._arrivals else float("inf")
            for w, r in self._running.items():
                t_next = min(t_next, self.now + r.remaining / rates[w][0])
            t_next = min(t_next, seconds)
            dt = t_next - self.now
            if dt > 0:
                busy_devs = {w[1] for w in self._running}
                for d in busy_devs:
                    self._dev_busy[d] += dt
                for w, r in self._running.items():
                    rate, share = rates[w]
                    r.remaining -= rate * dt
                    r.busy_s += dt * share
            self.now = t_next
            if self.now >= seconds:
                break
            for w in [w for w, r in self._running.items() if r.remaining <= 1e-12 * max(1.0, r.busy_s)]:
                self._finish(self._running.pop(w))
            while self._arrivals and self._arrivals[0][0] <= self.now + _EPS:
                _, _, name = heapq.heappop(self._arrivals)
                self._admit(name)
                heapq.heappush(self._arrivals, (self.now + 1.0 / self.streams[name].rate_hz, next(self._seq), name))
        for r in self._running.values():  # runs cut by the end of the window: their device time so far
            self._run_busy[r.req.plan.stages[r.stage].device] += r.busy_s
        workers = (sum(len(p.devices()) for p in self.plans.values()) if self.mode is Mode.INDEPENDENT
                   else len({d for p in self.plans.values() for d in p.devices()}))
        return ReplayResult(
            seconds,
            {n: StreamResult(self._req_count[n], len(self._lat[n]), tuple(self._lat[n]),
                             self._judged(n, seconds), self._met[n], self._energy[n])
             for n in self.streams},
            dict(self._dev_busy), dict(self._run_busy), workers,
        )
