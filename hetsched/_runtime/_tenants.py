"""Tenants: the sessions one scheduler serves at once.

One :class:`~hetsched._runtime._scheduler.Scheduler` owns the board's device workers, one heap
per worker group. Every attached :class:`Tenant` (one per session) puts its requests' stages on
those same heaps, so a HIGH request of one model overtakes queued BACKGROUND stages of another;
the key each stage gets (priority class, aging, least slack or earliest deadline, flagged SLO
misses, weighted fair tags) is ``_order``'s. A tenant holds the session's plans (generations),
its admission limit, its weight and default SLO, and counts its requests, SLOs met and missed
and its busy seconds per device (:class:`TenantStatistics`). :meth:`Tenant.detach` drains only
its requests while the others are served.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._errors import RuntimeStateError
from .._events import HookDispatcher
from ._failover import Failover
from ._generation import Generation
from ._order import Order, admit, remaining
from ._requests import Admission, Request

if TYPE_CHECKING:
    from ._program import Program, StageRuntime
    from ._scheduler import Scheduler
    from ._workers import DeviceWorkers

__all__ = ["DEFAULT_SLO", "NEW_WAITER", "Order", "SchedulerStatistics", "Tenant", "TenantStatistics"]


DEFAULT_SLO: Any = object()
"""``slo_s`` left out of :meth:`Tenant.new_request`: the tenant's default SLO."""
NEW_WAITER: Any = object()
"""``waiter`` left out of :meth:`Tenant.new_request`: a new waiter of the running loop."""



@dataclass(frozen=True)
class TenantStatistics:
    """A snapshot of one tenant (session) of the scheduler."""

    name: str
    weight: float
    slo_s: float | None
    """The default SLO of its requests."""
    max_in_flight: int | None
    requests: int
    """Requests made."""
    completed: int
    failed: int
    cancelled: int
    in_flight: int
    """Requests made and not finalized yet."""
    slo_requests: int
    """Finished requests that had a deadline (``slo_met + slo_missed``)."""
    slo_met: int
    slo_missed: int
    """Finished after their deadline (served, never dropped)."""
    slo_flagged: int
    """Requests found unable to meet their deadline while queued (served after those that could)."""
    stage_runs: int
    busy_s: Mapping[str, float]
    """Seconds each device spent on its stages: the backend's modelled board time where it
    reports one (``last_run_seconds``), else the host's wall time of the run. What a board's
    measured energy is split by."""
    detached: bool


@dataclass(frozen=True)
class SchedulerStatistics:
    """A snapshot of the scheduler across its tenants."""

    tenants: tuple[TenantStatistics, ...]
    """Attached tenants, then the detached ones, in attachment order."""
    busy_s: Mapping[str, float]
    """Per device, the busy seconds of every tenant, attached or detached."""
    admitted: int
    """Slots of the runtime-wide admission limit in use now (0 without a limit)."""
    waiting: int
    """Callers waiting for a runtime-wide slot."""
    max_in_flight: int | None
    queued_stages: int
    order: Order
    priorities: bool


class Tenant:
    """One session's share of a :class:`~hetsched._runtime._scheduler.Scheduler` (made by
    :meth:`Scheduler.attach`): its plans, admission, request statistics and the order keys of
    its requests. Thread-safe where noted; everything else runs on the scheduler's loop."""

    def __init__(self, scheduler: Scheduler, name: str, *, dispatch: HookDispatcher, costs: Any,
                 learn_costs: bool, weight: float, max_in_flight: int | None, slo_s: float | None):
        if not weight > 0:
            raise ValueError(f"tenant {name!r}: weight must be positive, got {weight!r}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"tenant {name!r}: max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        if slo_s is not None and not slo_s > 0:
            raise ValueError(f"tenant {name!r}: slo_s must be positive or None, got {slo_s!r}")
        self.name = name
        self.scheduler = scheduler
        self.dispatch = dispatch
        self.costs = costs
        self.learn = learn_costs
        self.weight = float(weight)
        self.max_in_flight = max_in_flight
        self.slo_s = slo_s
        self.generation: Generation | None = None
        """The plan new requests use (see ``_generation``)."""
        self.stages: list[StageRuntime] = []
        self._generations = itertools.count()
        self._live: dict[int, Generation] = {}
        self.failover: Failover | None = None
        """Device failure handling (set by the session; None: a failing stage fails its request)."""
        self._limiter = Admission(max_in_flight) if max_in_flight is not None else None
        self._lock = threading.Lock()
        self.estimates: dict[StageRuntime, float] = {}
        """Per stage, an EWMA of its run time (updated by the stage runner, any thread)."""
        self.tracks = slo_s is not None
        """Its stage estimates are kept up to date: it has had a request with an SLO, or
        shares the scheduler with other tenants (fair tags)."""
        self.busy: dict[str, float] = {}
        """Per device, busy seconds (updated by the stage runner under its lock)."""
        self.stage_runs = 0
        self.finish_tags: dict[int, float] = {}
        """Per priority class, its last fair-queuing finish tag (``_order.fair_tag``)."""
        self.requests = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.live = 0
        self.live_by_class: dict[int, int] = {}
        """Requests made and not finalized, per priority class (whose weights share a class)."""
        self.slo_met = 0
        self.slo_missed = 0
        self.slo_flagged = 0
        self._requests: set[Request] = set()
        """Requests made and not finalized (what :meth:`detach` waits for)."""
        self.detaching = False
        self.detached = False
        self._drained: list[Any] = []
        """Waiters of :meth:`detach` calls (resolved when the last request ends)."""

    def __repr__(self) -> str:
        return f"Tenant({self.name!r}, weight={self.weight}, slo_s={self.slo_s})"

    # -- plans ----------------------------------------------------------------------------

    def set_stages(self, stages: list[StageRuntime], output_source: Mapping[str, int | None],
                   on_drained: Callable[[Generation], None] | None = None) -> Generation:
        """Install a plan's stages: requests made from now on use them (any admitted before
        finish on theirs). The previous plan retires: ``on_drained(old)`` runs once its last
        request is gone (in that request's thread); the owner closes its stages, then calls
        :meth:`forget` (default: it is just forgotten).
        Requests parked for a plan without a quarantined device start over on this one if it
        leaves out every quarantined device (see ``Failover.installed``)."""
        sch = self.scheduler
        gen = Generation(next(self._generations), stages, output_source, sch.topology, sch.host)
        old, self.generation = self.generation, gen
        self.stages = stages
        self._live[gen.number] = gen
        if old is not None:
            self.flush_costs(old.stages)
            old.retire(on_drained if on_drained is not None else self.forget)
        if self.failover is not None:
            for req in self.failover.installed(frozenset(st.device for st in stages)):
                self.restart(req, counted=True)
        return gen

    def live_generations(self) -> list[Generation]:
        """The current plan's generation and the retired ones not closed yet."""
        return list(self._live.values())

    def forget(self, gen: Generation) -> None:
        """``gen``'s stages are closed: it is no longer live (any thread)."""
        self._live.pop(gen.number, None)

    def program(self, wanted: Sequence[str], fed: Sequence[str]) -> Program:
        """The current plan's program for requests asking ``wanted`` with inputs ``fed``."""
        gen = self.generation
        if gen is None:
            raise RuntimeStateError(f"tenant {self.name!r} has no stages (no plan installed)")
        return gen.program(wanted, fed)

    def learn_from(self, st: StageRuntime, samples: list[float]) -> None:
        for elapsed in samples:  # the same moving average as one update per run, just later
            self.costs.update(st.key, st.device, elapsed, analytic_s=st.analytic_s)
        st.learned += len(samples)

    def flush_costs(self, stages: Sequence[StageRuntime] | None = None) -> None:
        """Fold the stage times not yet learned into the cost table; ``stages`` default to the
        current plan's."""
        lock = self.scheduler.runner.lock
        for st in self.stages if stages is None else stages:
            with lock:
                samples, st.samples = st.samples, []
            if samples and self.costs is not None:
                self.learn_from(st, samples)

    def restart(self, req: Request, counted: bool = False) -> None:
        """Start ``req`` over on the current plan (any thread): it was parked after a device
        failure and nothing of it runs any more. Waits instead while a plan without a
        quarantined device is coming; a request closed meanwhile (cancelled) is let go."""
        failover = self.failover
        with req.lock:
            if req.closed:
                req.parked = False
                req.finalize_locked()
                return
        if failover is not None and not counted and not failover.take(req):
            return  # parked until the new plan is installed (set_stages) or found impossible
        gen = self.generation
        assert gen is not None
        wanted = tuple(name for name, _ in req.program.wanted)
        program = gen.program(wanted, req.program.fed)
        with req.lock:
            if req.closed:
                req.parked = False
                req.finalize_locked()
                return
            req.rebind_locked(program)
            req.retries += 1
            if req.deadline is not None:
                req.rem = remaining(self, program)
        sch = self.scheduler
        if req.done:
            sch.wake(req)
            return
        sch.push_initial(req)

    def fail_parked(self, parked: Sequence[tuple[Request, BaseException | None]]) -> None:
        """Fail requests that were waiting to start over (no plan could replace their device,
        or the session is closing); any thread."""
        for req, error in parked:
            with req.lock:
                req.parked = False
                if req.closed:
                    req.finalize_locked()
                    continue
                req.error = error or RuntimeStateError("the session stopped before the request could start over")
                req.closed = True
                req.finalize_locked()
            self.scheduler.wake(req)

    # -- admission ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.detaching:
            raise RuntimeStateError(f"tenant {self.name!r} is detached (or detaching) from the scheduler: "
                                    "it takes no new requests")

    async def acquire(self, priority: int) -> None:
        """One admission slot: the tenant's (``max_in_flight``, first come first served), then
        the runtime's (the most urgent waiter first: class, aged by ``aging_s`` as on the heaps).
        Waits only when there is no room.

        :raises RuntimeStateError: the tenant is detached.
        """
        self._check_open()
        limiter = self._limiter
        if limiter is not None and not limiter.try_acquire():
            await limiter.acquire()
        glob = self.scheduler.admission
        if glob is not None and not glob.try_acquire():
            try:
                sch = self.scheduler
                await glob.acquire(sch.monotonic() + priority * sch.step)
            except BaseException:
                if limiter is not None:
                    limiter.release()
                raise

    def try_acquire(self) -> bool:
        """One admission slot if both limits have room now (never waits)."""
        if self.detaching:
            return False
        limiter = self._limiter
        if limiter is not None and not limiter.try_acquire():
            return False
        glob = self.scheduler.admission
        if glob is not None and not glob.try_acquire():
            if limiter is not None:
                limiter.release()
            return False
        return True

    def release(self, slots: int = 1) -> None:
        """Give ``slots`` admission slots back (event loop)."""
        limiter, glob = self._limiter, self.scheduler.admission
        for _ in range(slots):
            if glob is not None:
                glob.release()
            if limiter is not None:
                limiter.release()

    @property
    def slots_in_use(self) -> int:
        limiter = self._limiter
        return limiter.active if limiter is not None else 0

    # -- requests -------------------------------------------------------------------------

    def new_request(self, rid: int, priority: int, program: Program, feeds: Mapping[str, Any], *,
                    copy_out: bool = True, waiter: Any = NEW_WAITER, slo_s: Any = DEFAULT_SLO,
                    admit_now: bool | None = None) -> Request:
        """A request of this tenant (any thread). ``slo_s``: its SLO (None: none; left out: the
        tenant's default). ``admit_now`` (default: unless ``waiter`` is None, a stream's request
        made ahead): stamp its admission now; else the maker calls :meth:`admit` when it admits
        it (its fair-share charge, deadline and key are taken then, once).

        :raises RuntimeStateError: the tenant is detached.
        :raises ValueError: ``slo_s`` is not positive.
        """
        if self.detaching:
            self._check_open()
        slo = self.slo_s if slo_s is DEFAULT_SLO else slo_s
        if slo is not None and not slo > 0:
            raise ValueError(f"slo_s must be positive or None, got {slo!r}")
        sch = self.scheduler
        req = Request(rid, priority, 0.0, program, feeds, sch.new_waiter() if waiter is NEW_WAITER else waiter,
                      copy_out, self)
        with self._lock:
            self.requests += 1
            self.live += 1
            self.live_by_class[priority] = self.live_by_class.get(priority, 0) + 1
            self._requests.add(req)
        if slo is not None:
            req.deadline = float(slo)  # admitted at 0.0 until admit(): deadline - admitted is the SLO
        elif not sch.shared and not self.finish_tags:  # the common case, inline: admission order
            req.admitted = now = sch.monotonic()
            req.key = now + priority * sch.step
            return req
        if admit_now if admit_now is not None else waiter is not None:
            self.admit(req)
        else:
            req.key = sch.monotonic() + priority * sch.step  # until admit(): pushed anyway, FIFO from here
        return req

    def admit(self, req: Request) -> None:
        """Stamp ``req``'s admission now (any thread): its admission time, deadline and heap
        key (see ``_order``). A stream calls this when it admits a request it made earlier."""
        admit(self, req)

    def mark_flagged(self, req: Request, flagged: bool = True) -> None:
        """``req`` is judged unable to meet its deadline (or, re-admitted, judged anew): counted
        once however many threads find it late at once (any thread)."""
        with self._lock:
            if req.flagged != flagged:
                req.flagged = flagged
                self.slo_flagged += 1 if flagged else -1

    def request_ended(self, req: Request) -> None:
        """``req`` is finalized for good (any thread, under its lock): count it; the last one
        of a detaching tenant wakes :meth:`detach`."""
        deadline = req.deadline
        with self._lock:
            self.live -= 1
            self.live_by_class[req.priority] -= 1
            self._requests.discard(req)
            if req.error is not None:
                self.failed += 1
            elif req.done:
                self.completed += 1
                if deadline is not None:
                    finished = req.finished_at
                    if finished is not None and finished <= deadline:
                        self.slo_met += 1
                    else:
                        self.slo_missed += 1
            else:
                self.cancelled += 1
            waiters: list[Any] = []
            if self.live == 0 and self._drained:
                waiters, self._drained = self._drained, []
        for waiter in waiters:
            self.scheduler.resolve_soon(waiter)

    # -- detaching ------------------------------------------------------------------------

    async def detach(self) -> TenantStatistics:
        """Stop taking requests and wait until every request of this tenant is finalized
        (its buffers back in the pools); the other tenants keep being served. Returns the
        tenant's last statistics. Its plans' stages are the owner's to close afterwards
        (:meth:`live_generations`). Event loop; idempotent.

        Once the scheduler's workers have stopped (a runtime closing with sessions attached),
        requests of this tenant that can no longer finish (queued, or made and never admitted)
        fail with :class:`~hetsched.RuntimeStateError` instead of being waited for.
        """
        sch = self.scheduler
        self.detaching = True
        while True:
            with self._lock:
                if self.live <= 0:
                    break
                waiter = sch.new_waiter()
                self._drained.append(waiter)
            if sch.stopped:
                self._fail_unfinished()
            await sch.wait_on(waiter)
        self.flush_costs()
        sch.forget_tenant(self)
        self.detached = True
        return self.statistics()

    def _fail_unfinished(self) -> None:
        """Fail every request of this tenant that has not finished (the workers stopped)."""
        with self._lock:
            left = list(self._requests)
        sch = self.scheduler
        for req in left:
            with req.lock:
                if req.done or req.closed:
                    continue
                req.error = RuntimeStateError(f"the scheduler stopped before a request of {self.name!r} could finish")
                req.closed = True
                if not req.running:
                    req.finalize_locked()
            if req.event is not None or req.sink is not None:
                sch.wake(req)

    def queued(self) -> int:
        """Stages of this tenant's requests queued on the device heaps now (a snapshot)."""
        return sum(1 for w in self.scheduler.unique_workers() for entry in list(w._heap) if entry[2].tenant is self)

    @property
    def loop_thread(self) -> int:
        """The thread id of the scheduler's event loop."""
        return self.scheduler.loop_thread

    def statistics(self) -> TenantStatistics:
        lock = self.scheduler.runner.lock
        with lock:
            busy = dict(self.busy)
            runs = self.stage_runs
        with self._lock:
            return TenantStatistics(
                name=self.name, weight=self.weight, slo_s=self.slo_s, max_in_flight=self.max_in_flight,
                requests=self.requests, completed=self.completed, failed=self.failed, cancelled=self.cancelled,
                in_flight=self.live, slo_requests=self.slo_met + self.slo_missed, slo_met=self.slo_met,
                slo_missed=self.slo_missed, slo_flagged=self.slo_flagged, stage_runs=runs,
                busy_s=MappingProxyType(busy), detached=self.detached)

    # -- pass-throughs, so that a session can hold just its tenant ------------------------

    async def execute(self, req: Request) -> None:
        await self.scheduler.execute(req)

    def take_outputs(self, req: Request) -> list[tuple[str, Any]]:
        return self.scheduler.take_outputs(req)

    def push_initial(self, req: Request) -> None:
        self.scheduler.push_initial(req)

    def unique_workers(self) -> list[DeviceWorkers]:
        return self.scheduler.unique_workers()
