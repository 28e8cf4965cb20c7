"""The order of the device heaps: the key each pushed stage gets, for every tenant's requests.

One :class:`~hetsched._runtime._scheduler.Scheduler` owns the board's device workers, one heap
per worker group. Every attached :class:`Tenant` (one per session) puts its requests' stages on
those same heaps, so a HIGH request of one model overtakes queued BACKGROUND stages of another.

The heap key of a stage (a float; smaller runs first) is a *class term* plus a *time term*::

    key = priority * aging_s + t          # priority class first, aged as before (aging_s)
    t   = admitted                        # no SLO, one tenant (today's order: FIFO in a class)
        = fair start tag                  # no SLO, several tenants: weighted fair queuing
        = deadline - remaining(stage)     # SLO, Order.LEAST_SLACK: the stage's latest start
        = deadline                        # SLO, Order.EARLIEST_DEADLINE
        = flagged_at + demotion           # SLO that can no longer be met: after those that can

* **Least slack first** (Band's LSF): ``slack = deadline - now - remaining`` where
  ``remaining`` is the estimated time of the request's longest path of stages still to run
  from this one (per-stage estimates: an EWMA of the tenant's measured runs, seeded by the
  cost table or the plan's analytic time). ``now`` is common to every entry of a heap, so the
  latest start ``deadline - remaining`` orders them by slack; the key is computed whenever a
  stage is pushed, so later stages of a request carry their own (smaller) remaining time.
* **Missed SLOs**: when a request is admitted, or a stage of it pushed or popped, with
  negative slack, the request is flagged (counted in ``TenantStatistics.slo_flagged``),
  never dropped, and from then on keyed ``flagged_at + demotion`` with ``demotion = max(max_slo,
  aging_s / 2)`` (``max_slo``: the largest SLO any request has had): every request of its
  class that can still meet an SLO no longer than ``demotion`` goes first, also one admitted
  after it (without aging, ``demotion`` is half the class gap: after everything of its class);
  with aging it still ages, half a class behind, so it is never starved. A popped stage found
  late goes back on the heap once if others wait there. It is counted in ``slo_missed`` if it
  finishes after its deadline (``slo_met`` otherwise), whatever the flag said.
* **Requests without SLO** order by admission, as if their deadline were their admission
  time. With several tenants attached, a request's time term is a *start tag* of weighted
  fair queuing in seconds (Zhang's VirtualClock with each tenant's rate its share of the
  active tenants' weights), kept per tenant and class: ``start = max(now, finish[tenant, class])``,
  ``finish[tenant, class] = start + cost / share``, ``share = weight / sum(weights of the tenants with
  requests of that class in flight)`` and ``cost`` the request's estimated stage seconds. Two backlogged
  tenants of weights 3 and 1 get the device 3:1; a tenant alone keeps admission order (one
  left alone by a detach keeps its tags until real time has caught up with them, so its new
  requests never pass its queued ones).
* **Aging** is today's: a request that waited ``aging_s`` longer than another of the next
  class up goes first; BACKGROUND never starves.
* **FIFO** (``priorities=False``): the key is the admission time, whatever the class or SLO
  (SLOs are still counted).

The key is a hint read when a stage is pushed; two branches of one request pushed at the same
moment from two threads may each see the other's key (both are the same request's anyway).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._program import Program, StageRuntime
    from ._requests import Request
    from ._tenants import Tenant
    from ._workers import DeviceWorkers

__all__ = ["Order", "admit", "estimate", "fair_tag", "flag", "late", "rekey", "remaining"]


class Order(enum.Enum):
    """How requests with an SLO order within a priority class."""

    LEAST_SLACK = "least-slack"
    """Band's LSF: the smallest ``deadline - now - remaining estimated time`` first."""
    EARLIEST_DEADLINE = "earliest-deadline"
    """EDF: the earliest deadline first, whatever is left to run."""


_MIN_COST_S = 1.0e-6
"""A request estimated at nothing still costs this much (fair tags must advance)."""


def admit(tenant: Tenant, req: Request) -> None:
    """Stamp ``req``'s admission now (any thread): its admission time, deadline and heap
    key. A stream calls this when it admits a request it made earlier."""
    sch = tenant.scheduler
    now = sch.monotonic()
    slo = req.deadline - req.admitted if req.deadline is not None else None
    req.admitted = now
    step = sch.step
    if slo is None:
        if sch.shared or tenant.finish_tags:
            req.key = fair_tag(tenant, now, req.priority, req.program) + req.priority * step
        else:
            req.key = now + req.priority * step
        return
    req.deadline = now + slo
    if req.flagged:  # judged at an earlier admission (a stream's request made ahead): judge it anew
        tenant.mark_flagged(req, flagged=False)
    tenant.tracks = True
    sch.saw_slo(slo)
    if not sch.priorities:
        req.key = now
        return
    req.rem = rem = remaining(tenant, req.program)
    left = max(rem.values(), default=0.0)
    if now + left > req.deadline:
        flag(tenant, req, now)  # late from the start
        return
    req.key = (req.deadline - left if sch.order is Order.LEAST_SLACK else req.deadline) + req.priority * step


def estimate(tenant: Tenant, st: StageRuntime) -> float:
    """Estimated seconds of one run of ``st`` (any thread)."""
    est = tenant.estimates.get(st)
    if est is None:
        costs = tenant.costs
        learned = costs.get(st.key, st.device) if costs is not None else None
        est = float(learned) if learned is not None else float(st.analytic_s or 0.0)
    return est


def remaining(tenant: Tenant, program: Program) -> dict[int, float]:
    """Per stage id, the estimated seconds of the longest path of stages from it to the end
    (through its consumers, on shared memory or across a transfer)."""
    rem: dict[int, float] = {}
    by_sid = program.by_sid

    def path(sid: int) -> float:
        got = rem.get(sid)
        if got is not None:
            return got
        rem[sid] = 0.0  # a guard: a plan's stages form a DAG, but never loop on a bad one
        after = 0.0
        for _index, name, _refs, same, remote in program.outs.get(sid, ()):
            consumers = list(same)
            for dom in remote:
                consumers.extend(program.xfers.get((name, dom), (0, ()))[1])
            for c in consumers:
                after = max(after, path(c))
        rem[sid] = total = estimate(tenant, by_sid[sid]) + after
        return total

    for st in program.stages:
        path(st.sid)
    return rem


def fair_tag(tenant: Tenant, now: float, priority: int, program: Program) -> float:
    """The start tag of weighted fair queuing in ``priority``'s class (see the module docstring;
    one finish tag per tenant and class: a tenant's bulk never delays its own urgent requests);
    any thread."""
    cost = max(_MIN_COST_S, sum(estimate(tenant, st) for st in program.stages))
    sch = tenant.scheduler
    tags = tenant.finish_tags
    with sch.fair_lock:
        # alone now (the others detached), its queued requests may carry tags ahead of now: new
        # ones queue behind them until it has caught up, then plain admission order again
        if not sch.shared and max(tags.values(), default=0.0) <= now:
            tags.clear()
            return now
        active = sum(t.weight for t in sch.tenants() if t is tenant or t.live_by_class.get(priority, 0) > 0)
        start = max(now, tags.get(priority, 0.0))
        tags[priority] = start + cost * active / tenant.weight
    return start


def rekey(tenant: Tenant, req: Request, st: StageRuntime) -> None:
    """Key ``req`` for pushing its stage ``st`` (a request with a deadline; any thread):
    its latest start (or deadline), or flagged and demoted once it can no longer make it."""
    if req.flagged:
        return
    sch = tenant.scheduler
    now = sch.monotonic()
    rem = req.rem
    left = rem.get(st.sid, 0.0) if rem is not None else 0.0
    deadline = req.deadline
    assert deadline is not None
    latest = deadline - left
    if now > latest:
        flag(tenant, req, now)
        return
    req.key = (latest if sch.order is Order.LEAST_SLACK else deadline) + req.priority * sch.step


def late(tenant: Tenant, req: Request, st: StageRuntime, worker: DeviceWorkers) -> bool:
    """``st`` of ``req`` was just popped (worker thread): if the request can no longer meet
    its deadline it is flagged, and when other stages wait on ``worker`` it goes back on the
    heap behind those that still can (True: not to run now)."""
    sch = tenant.scheduler
    now = sch.monotonic()
    rem = req.rem
    deadline = req.deadline
    assert deadline is not None
    if now + (rem.get(st.sid, 0.0) if rem is not None else 0.0) <= deadline:
        return False
    flag(tenant, req, now)
    if worker.queued:
        worker.push(req, st)
        return True
    return False


def flag(tenant: Tenant, req: Request, now: float) -> None:
    """``req`` can no longer meet its deadline: flag and demote it (any thread)."""
    sch = tenant.scheduler
    req.key = now + sch.demotion() + req.priority * sch.step
    tenant.mark_flagged(req)
