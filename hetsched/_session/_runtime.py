"""``Runtime``: one per board. It owns what every model on the board shares.

::

    async with hetsched.Runtime(root="/", devices=["big", "npu"], governor=hetsched.Governor(root="/")) as rt:
        async with hetsched.Session("detector.onnx", runtime=rt, slo_s=0.033) as det, \\
                   hetsched.Session("classifier.onnx", runtime=rt) as cls:
            boxes = await det.run(frame, priority=hetsched.Priority.HIGH)
            label = await cls.run(crop, priority=hetsched.Priority.BACKGROUND)
        print(rt.statistics().energy_split_j)

What the runtime owns (opened in ``__aenter__``, closed in ``__aexit__``, also on error and
cancellation):

* the devices (resolved once for the board) and their **device workers**: one set per device,
  however many models are attached, each with one queue holding the stages of every
  session's requests, ordered by priority class, then deadline (``hetsched/_runtime/_tenants.py``);
* the memory domains' **pools** and the **transfer engine** between them;
* the runtime-wide admission limit (``max_in_flight``), besides each session's own;
* the board's **telemetry** (one reader, :meth:`Runtime.sample_states`, for every session's
  re-planning) and the sessions' load as plain data for **joint placement**
  (:meth:`Runtime.reservations`: a session is planned knowing the others' busy shares;
  :meth:`Runtime.replace` re-places every attached session);
* an optional **governor**: one for the board, driven by the phases of every attached session
  (one :class:`~hetsched.GovernorHooks` counts all their requests and stages), and restored when
  the runtime closes, with sessions still attached or not.

A :class:`~hetsched.Session` attaches its model with ``Session(model, runtime=rt)``: it plans,
compiles and re-plans its own stages, and closing it drains and closes only those; the other
sessions keep being served. A Session made without ``runtime=`` opens a private runtime of its
own (today's behaviour). Closing the runtime closes every session still attached first.

Per-session energy: each session's ``statistics().energy_j`` is what its stage runs spent (as
the backends model or measure it); :meth:`Runtime.statistics` gives the board's total (its
measured input rail integrated since the runtime opened, where the root has one: a Jetson, the
orin-nx twin; else the stages' modelled sum, labelled so) and its split by each session's share
of the devices' busy time (``hetsched/_session/_board_energy.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from hetsched.backends import Device, get_backend

from .._devices.resolve import resolve_devices
from .._errors import BufferLeakError, RuntimeStateError
from .._events import HookDispatcher
from .._runtime._buffers import BufferPool, pools_for
from .._runtime._clock import Clock, SystemClock
from .._runtime._domains import Topology
from .._runtime._scheduler import Scheduler
from .._runtime._transfer import TransferEngine, TransferStatistics
from ._board_energy import ENERGY_SAMPLE_PERIOD_S, BoardRailMeter
from ._load_file import PUBLISH_PERIOD_S, LoadPublisher, payload
from ._options import Memory, Scheduling
from ._replace import (
    PlacementSnapshot,
    PlacementState,
    Replacement,
    ReplacementDecision,
    SessionLoad,
    decide_replacement,
)
from ._setup import TransferEvents, make_topology
from ._statistics import BoardSampler

if TYPE_CHECKING:
    from hetsched.policies import DeviceState, Reservation

    from .._runtime._tenants import SchedulerStatistics, Tenant, TenantStatistics
    from ._governed import GovernorHooks
    from ._trace import SessionTrace, _TraceHooks

__all__ = ["Runtime", "RuntimeStatistics", "SessionShare"]


@dataclass(frozen=True)
class SessionShare:
    """One session's part of a :class:`Runtime` (attached now or detached)."""

    name: str
    attached: bool
    busy_s: Mapping[str, float]
    """Per device, the board seconds its stage runs kept the device busy (the backend's
    modelled time where it reports one, else the host's wall time of the run)."""
    busy_share: float
    """Its part of every session's busy seconds, over all devices (0 when nothing ran)."""
    energy_j: float | None
    """Joules its stage runs spent as the backends report them (its ``statistics().energy_j``)."""
    energy_split_j: float | None
    """Its part of the board's energy: :attr:`RuntimeStatistics.energy_j` times :attr:`busy_share`."""
    requests: int
    completed: int
    slo_met: int
    slo_missed: int
    slo_flagged: int


@dataclass(frozen=True)
class RuntimeStatistics:
    """A snapshot of a :class:`Runtime`: its sessions, the board's busy time and energy."""

    sessions: tuple[SessionShare, ...]
    """Every session that attached, in attachment order (detached ones included)."""
    devices: tuple[str, ...]
    worker_threads: int
    """Device worker threads of the board (one set per device, whatever the number of sessions)."""
    busy_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Per device, the busy seconds of every session."""
    energy_j: float | None = None
    """The board's energy since the runtime opened (until it closed): its measured board-input
    rail integrated where the root has one (a Jetson, the orin-nx twin), idle time included;
    elsewhere the sum of every session's stage energy (see :attr:`energy_source`); None where
    neither is known."""
    energy_source: str | None = None
    """``"measured: VDD_IN"`` (the board's rail), ``"modelled"`` (the sum of the stages' modelled
    energy: a twin's power model at the clocks of each run; an RK3588 has no power monitor) or None."""
    energy_split_j: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """:attr:`energy_j` split by each session's share of the devices' busy time; sums to it
    (once anything ran)."""
    stage_energy_j: float | None = None
    """The sum of every session's stage energy (their ``statistics().energy_j``), whatever
    :attr:`energy_source` is."""
    energy_note: str | None = None
    """Why :attr:`energy_j` is not measured (no measured board rail under the root, ...)."""
    transfers: TransferStatistics | None = None
    queued_stages: int = 0
    in_flight: int = 0
    """Slots of the runtime-wide admission limit in use (0 without a limit)."""
    max_in_flight: int | None = None
    governor: Any = None
    """The governor's ``statistics()`` (None without one)."""
    replacements: tuple[str, ...] = ()
    """Every runtime-wide re-placement (attach, detach, load drift or ``replace()``), its reason, in order."""


class _Attached:
    """What the runtime keeps of an attached session."""

    def __init__(self, name: str, tenant: Tenant, energy: Any, priority: int, attached_at: float,
                 rate_hz: float | None = None, expected: Callable[[], Mapping[str, float]] | None = None):
        self.name = name
        self.tenant = tenant
        self.priority = priority
        self.attached_at = attached_at
        self.rate_hz = rate_hz  # the offered requests/s it declared (None: a closed loop, or unknown)
        self.expected = expected  # () -> per device, seconds per request of its installed plan
        self.replan: Any = None  # the session's re-plan (async, reason -> plan), for Runtime.replace()
        self.energy = energy  # () -> joules or None: the session's statistics().energy_j
        self.final: TenantStatistics | None = None
        self.final_energy: float | None = None
        self.closer: Any = None  # the session's close (async, no args), for the runtime's own close


class Runtime:
    """The board's devices, workers, pools, transfer engine and governor, shared by every
    :class:`~hetsched.Session` attached to it (see the module docstring).

    :param devices: device specs or :class:`Device` objects of the board (default: the host's CPU
        clusters); each attached session plans over these (or the subset it names).
    :param root: the filesystem root for hardware discovery and ``dev/dma_heap`` (a twin's root in tests).
    :param clock: the clock every attached session and the scheduler read (default: the system's;
        tests pass a ``VirtualClock``).
    :param scheduling: how the device queues order stages (:class:`hetsched.Scheduling`).
    :param memory: memory domains, pools and transfers (:class:`hetsched.Memory`).
    :param max_in_flight: requests of all sessions admitted at once (None: only each session's own limit).
    :param governor: a :class:`hetsched.Governor` the runtime enters when it opens and exits when it
        closes (restoring every clock it changed), driven by every attached session's phases.
    :param hooks: objects with :class:`hetsched.Hooks` methods for the board's transfer events.
    :param trace: write one Chrome trace event JSON file here for the whole board (see
        ``hetsched/_session/_trace.py``): a process per session for its requests, its stage slices
        on the device workers named by session, transfers, counters, the governor's phases.
    :param publish_load: publish the sessions' load for ``hetsched top`` in a small file under the
        root's ``run/hetsched`` (``hetsched/_session/_load_file.py``), removed when the runtime closes.
    :param replacement: when the runtime re-places its sessions on its own (a session attached
        and measured its load, one detached, the loads drifted: :class:`hetsched.Replacement`);
        None: only when the app calls :meth:`replace`.
    :raises ValueError: ``max_in_flight`` is not positive.
    """

    def __init__(
        self,
        *,
        devices: Sequence[str | Device] | str | None = None,
        root: str | os.PathLike[str] = "/",
        clock: Clock | None = None,
        scheduling: Scheduling = Scheduling(),  # noqa: B008 (frozen: one shared value)
        memory: Memory = Memory(),  # noqa: B008
        max_in_flight: int | None = None,
        governor: Any = None,
        hooks: Sequence[object] = (),
        replacement: Replacement | None = Replacement(),  # noqa: B008 (frozen: one shared value)
        trace: str | os.PathLike[str] | None = None,
        publish_load: bool = False,
    ):
        if max_in_flight is not None and (isinstance(max_in_flight, bool) or max_in_flight < 1):
            raise ValueError(f"Runtime max_in_flight must be >= 1 or None, got {max_in_flight!r}")
        if not isinstance(scheduling, Scheduling):
            raise TypeError(f"scheduling must be a hetsched.Scheduling, got {type(scheduling).__name__}")
        if not isinstance(memory, Memory):
            raise TypeError(f"memory must be a hetsched.Memory, got {type(memory).__name__}")
        if replacement is not None and not isinstance(replacement, Replacement):
            raise TypeError(f"replacement must be a hetsched.Replacement or None, got {type(replacement).__name__}")
        self.replacement = replacement
        self._placement = PlacementState()
        self._replacements: list[str] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._measure_energy = True
        self._publisher: LoadPublisher | None = LoadPublisher(root) if publish_load else None
        self._meter: BoardRailMeter | None = None
        self._device_specs = devices
        self.root = root
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.scheduling = scheduling
        self.memory = memory
        self._max_in_flight = max_in_flight
        self.governor = governor
        self._owns_governor = governor is not None
        self._governor_hooks: GovernorHooks | None = None
        self._trace: SessionTrace | None = None
        self._handed: list[_TraceHooks] = []
        if trace is not None:
            from ._trace import SessionTrace

            self._trace = SessionTrace(trace, clock=self.clock, root=root)
            hooks = self._trace.wrap_hooks(hooks)
        self._dispatch = HookDispatcher(hooks)
        self._devices: list[Device] = []
        self._topology: Topology | None = None
        self.host = "host"
        self._pools: dict[str, BufferPool] = {}
        self._engine: TransferEngine | None = None
        self._scheduler: Scheduler | None = None
        self._attached: list[_Attached] = []
        self._gone: list[_Attached] = []
        self._names = itertools.count(1)
        self._open = False
        self._closing = False
        self._retired_runs = 0
        self._sampler: BoardSampler | None = None
        self._sampler_lock = threading.Lock()

    @classmethod
    def _private(cls, *, devices: Sequence[str | Device] | str | None, root: str | os.PathLike[str],
                 clock: Clock, scheduling: Scheduling, memory: Memory, dispatch: HookDispatcher) -> Runtime:
        """The runtime a Session without ``runtime=`` opens for itself: its transfer events go to
        the session's hooks, and a governor the session was given stays the caller's."""
        rt = cls(devices=devices, root=root, clock=clock, scheduling=scheduling, memory=memory, replacement=None)
        rt._dispatch = dispatch
        rt._measure_energy = False  # its session's own figures; nobody reads the board's
        return rt

    # -- what sessions read -------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def devices(self) -> list[Device]:
        """The board's devices (resolved when the runtime opened)."""
        return list(self._devices)

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            raise RuntimeStateError("Runtime.topology is available inside 'async with Runtime(...)'")
        return self._topology

    @property
    def pools(self) -> Mapping[str, BufferPool]:
        return MappingProxyType(self._pools)

    @property
    def engine(self) -> TransferEngine | None:
        return self._engine

    @property
    def board_scheduler(self) -> Scheduler | None:
        """The board's scheduler once opened (still there after closing, for its counters)."""
        return self._scheduler

    @property
    def scheduler(self) -> Scheduler:
        sch = self._scheduler
        if sch is None or not self._open:
            raise RuntimeStateError("the Runtime is not open: use 'async with Runtime(...)' before attaching")
        return sch

    @property
    def governor_hooks(self) -> GovernorHooks | None:
        """The hooks that drive the runtime's governor from every attached session's events."""
        if self._governor_hooks is None and self.governor is not None:
            from ._governed import GovernorHooks

            self._governor_hooks = GovernorHooks(self.governor)
        return self._governor_hooks

    @property
    def sessions(self) -> tuple[str, ...]:
        """The names of the sessions attached now."""
        return tuple(a.name for a in self._attached)

    def trace_hooks(self) -> _TraceHooks | None:
        """The hooks a session attaching adds to its own (last) so the runtime's trace shows its
        requests on a track of its own (None without ``trace=``); named when it attaches."""
        if self._trace is None:
            return None
        h = self._trace.session_hooks()
        self._handed.append(h)
        return h

    def sample_states(self, devices: Sequence[Device], *, power_budget_w: float | None = None,
                      ) -> Mapping[str, DeviceState] | None:
        """One telemetry sample of the board (blocking; any thread, one at a time): the state of
        each of ``devices`` for a session's policy, or None where the root has no telemetry. One
        reader for every session, so CPU loads and integrated energy span all their samples."""
        with self._sampler_lock:
            if self._sampler is None:
                self._sampler = BoardSampler(self.root)
            return self._sampler.sample(devices, power_budget_w=power_budget_w)

    # -- attaching ----------------------------------------------------------------------------

    def attach(self, name: str | None, *, dispatch: HookDispatcher, costs: Any, learn_costs: bool,
               weight: float, max_in_flight: int | None, slo_s: float | None, energy: Any,
               closer: Any, priority: int = 2, replan: Any = None, rate_hz: float | None = None,
               expected: Callable[[], Mapping[str, float]] | None = None) -> tuple[str, Tenant]:
        """Attach a session (its ``__aenter__``; event loop): a tenant of the board's scheduler.
        Returns the unique name it got (``name``, or ``name#2`` when taken) and the tenant.

        :raises RuntimeStateError: the runtime is not open, or closing.
        """
        sch = self.scheduler
        if self._closing:
            raise RuntimeStateError("the Runtime is closing: no session can attach now")
        base = name or f"session-{next(self._names)}"
        taken = {a.name for a in (*self._attached, *self._gone)}
        unique, k = base, 2
        while unique in taken:
            unique, k = f"{base}#{k}", k + 1
        tenant = sch.attach(unique, dispatch=dispatch, costs=costs, learn_costs=learn_costs, weight=weight,
                            max_in_flight=max_in_flight, slo_s=slo_s)
        for h in dispatch.hooks:  # the runtime trace's hooks it handed this session: name its track
            for mine in self._handed:
                if h is mine:
                    mine.label(unique)
        entry = _Attached(unique, tenant, energy, priority, self.clock.monotonic(), rate_hz, expected)
        entry.closer = closer
        entry.replan = replan
        self._attached.append(entry)
        self._placement = self._placement.with_attach(unique)
        return unique, tenant

    async def detach(self, tenant: Tenant) -> None:
        """The session of ``tenant`` is closing (event loop): wait until its requests are
        finalized (the others keep being served) and keep its last figures."""
        entry = next((a for a in self._attached if a.tenant is tenant), None)
        if entry is None:
            return
        # with the workers stopped (a private runtime closing), its unfinished requests fail
        entry.final = await tenant.scheduler.detach(tenant)
        entry.final_energy = entry.energy()
        self._attached.remove(entry)
        self._gone.append(entry)
        if not self._closing:
            self._placement = self._placement.with_detach(entry.name)

    def reservations(self, *, except_session: str | None = None) -> tuple[Reservation, ...]:
        """The load every attached session (but ``except_session``) puts on the board's devices,
        as plain data for joint placement (``PlacementProblem.reservations``), with its default
        priority and SLO. Any thread.

        Per device, the share of the runtime's time its stages kept the device busy since it
        attached (measured, capped at 1), and at least what its installed plan expects there:
        a session that declared ``rate_hz`` reserves its plan's seconds per request on the device
        x that rate; one that did not (a closed loop, or unknown) is *elastic*
        (``Reservation.elastic``): it takes what the others leave on the devices its plan uses,
        each in proportion to its seconds there (a request in flight is on one device at a time).
        So a session opened right after another sees where the first will run before it has
        run, and closed loops of one class spread over the devices instead of piling onto one.
        """
        from hetsched.policies import Reservation

        now = self.clock.monotonic()
        out: list[Reservation] = []
        for e in list(self._attached):
            if e.name == except_session:
                continue
            share = self._measured_share(e, now)
            expected = dict(e.expected()) if e.expected is not None else {}
            total = sum(expected.values())
            for dev, sec in expected.items():
                want = sec * e.rate_hz if e.rate_hz else (sec / total if total > 0 else 0.0)
                share[dev] = min(1.0, max(share.get(dev, 0.0), want))
            out.append(Reservation(e.name, MappingProxyType(share), e.priority, e.tenant.slo_s,
                                   elastic=e.rate_hz is None))
        return tuple(out)

    @staticmethod
    def _measured_share(e: _Attached, now: float) -> dict[str, float]:
        """Per device, the share of the runtime's time ``e``'s stages kept it busy since it attached (capped at 1)."""
        span = now - e.attached_at
        if span <= 0:
            return {}
        return {dev: min(1.0, sec / span) for dev, sec in e.tenant.statistics().busy_s.items() if sec > 0}

    def placement_snapshot(self) -> PlacementSnapshot:
        """The attached sessions' *measured* loads now (what :func:`decide_replacement` reads: its
        settling and drift are about what was measured, not what the plans expect). Any thread."""
        now = self.clock.monotonic()
        return PlacementSnapshot(now, tuple(
            SessionLoad(e.name, e.attached_at, e.tenant.statistics().completed,
                        MappingProxyType(self._measured_share(e, now)))
            for e in list(self._attached)))

    async def review_placement(self) -> ReplacementDecision | None:
        """Ask the runtime's :class:`hetsched.Replacement` policy whether to re-place now (what its
        placement monitor does every ``period_s``), and re-place if so. Returns the decision
        (None: every plan stays; always None with ``replacement=None``)."""
        if self.replacement is None or not self._open or self._closing:
            return None
        self._placement, decision = decide_replacement(self.replacement, self._placement, self.placement_snapshot())
        if decision is not None:
            await self.replace(decision.trigger.reason, skip=decision.skip)
        return decision

    async def _energy_sampler(self) -> None:
        meter = self._meter
        while meter is not None and meter.measuring:
            await anyio.sleep(ENERGY_SAMPLE_PERIOD_S)
            await anyio.to_thread.run_sync(meter.sample)

    def publish_load(self) -> None:
        """Write the attached sessions' load for ``hetsched top`` now (with ``publish_load=True``;
        blocking: a small file under the root's ``run/hetsched``). Its runtime does it every
        :data:`~hetsched._session._load_file.PUBLISH_PERIOD_S`."""
        pub = self._publisher
        if pub is None or not self._open or self._closing:
            return  # closed: the file was withdrawn
        res = {r.session: r.busy_share for r in self.reservations()}
        st = self.statistics()
        pub.publish(payload(self.clock.monotonic(), [
            (s.name, next((e.priority for e in self._attached if e.name == s.name), 2), res.get(s.name, {}),
             s.busy_share, s.requests, s.completed) for s in st.sessions if s.attached]))

    async def _publish_forever(self, pub: LoadPublisher) -> None:
        while pub.note is None:
            await anyio.to_thread.run_sync(self.publish_load)
            await anyio.sleep(PUBLISH_PERIOD_S)

    async def _placement_monitor(self, config: Replacement) -> None:
        while True:
            await anyio.sleep(config.period_s)
            await self.review_placement()

    async def replace(self, reason: str = "requested", *, skip: frozenset[str] | set[str] = frozenset()) -> None:
        """Re-place every attached session now, one after the other, each planned knowing the
        load the others put on the devices (:meth:`reservations`); requests keep being served
        (each session switches plans as ``Session.replan`` does). A session that finds no new
        plan keeps its own (counted in its ``statistics().replanning.failed``). ``skip``: sessions
        left as they are (a newcomer already placed knowing the others). Counted in
        :attr:`RuntimeStatistics.replacements`.

        :raises RuntimeStateError: the runtime is not open.
        """
        from .._errors import HetschedError

        self.scheduler  # noqa: B018 (raises when not open)
        for e in list(self._attached):
            if e.replan is None or e not in self._attached or e.name in skip:
                continue
            with contextlib.suppress(HetschedError):  # counted by the session; its plan stays
                await e.replan(f"placement: {reason}")
        self._replacements.append(reason)  # once done: every session's re-plan is in its history

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        if self._open:
            raise RuntimeStateError("Runtime is already open")
        self._devices = list(resolve_devices(self._device_specs, root=self.root))
        self._topology, self.host = make_topology(self.memory.topology, self._devices)
        governor_entered = False
        try:
            self._pools = pools_for(self._topology, capacity_bytes=self.memory.pool_capacity_bytes, root=self.root)
            # a custom copy (a DMA wait, a modelled link) may block: never run it on the event loop
            inline = {} if self.memory.copy_fn is None else {"inline_bytes": 0}
            self._engine = TransferEngine(self._topology, self._pools, chunk_bytes=self.memory.chunk_bytes,
                                          copy_fn=self.memory.copy_fn,
                                          hooks=TransferEvents(self._dispatch, self.clock), **inline)
            await self._engine.__aenter__()
            self._scheduler = Scheduler(
                pools=self._pools, topology=self._topology, host=self.host, engine=self._engine,
                priorities=self.scheduling.priorities, aging_s=self.scheduling.aging_s, clock=self.clock,
                order=self.scheduling.order, max_in_flight=self._max_in_flight)
            if self._owns_governor:
                await self.governor.__aenter__()
                governor_entered = True
            if self._trace is not None:
                gov_hooks = self.governor_hooks
                if gov_hooks is not None:
                    self._trace.watch_governors([gov_hooks])
                await anyio.to_thread.run_sync(self._trace.open, [d.name for d in self._devices])
            if self._measure_energy:
                meter = await anyio.to_thread.run_sync(
                    lambda: BoardRailMeter(self.root, clock=self.clock.monotonic))
                if meter.measuring:
                    await anyio.to_thread.run_sync(meter.sample)  # the runtime's opening
                self._meter = meter
            self._scheduler.start(self._devices, worker_cpus)
            measuring = self._meter is not None and self._meter.measuring
            tracing = self._trace is not None and self._trace.wants_task
            if self.replacement is not None or measuring or tracing or self._publisher is not None:
                tg = anyio.create_task_group()
                await tg.__aenter__()
                self._tg = tg
                if self.replacement is not None:
                    tg.start_soon(self._placement_monitor, self.replacement)
                if measuring:
                    tg.start_soon(self._energy_sampler)
                if tracing and self._trace is not None:
                    tg.start_soon(self._trace.sample_forever)
                if self._publisher is not None:
                    tg.start_soon(self._publish_forever, self._publisher)
        except BaseException:
            await self._close_board(governor_entered)
            raise
        self._open = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        leak = await self.aclose()
        if leak is not None and exc is None:
            raise leak
        if exc is None and self._trace is not None and self._trace.failure is not None:
            raise self._trace.failure  # a full disk: the trace is cut where it says

    async def aclose(self) -> BufferLeakError | None:
        """Close every session still attached, then the board (workers, engine, pools, the
        governor's clocks); returns the pools' leak report (``__aexit__`` raises it)."""
        if not self._open:
            return None
        self._closing = True
        try:
            # the most recently attached first, as nested 'async with' blocks would close them (a
            # session's task group is entered inside the runtime's: it is exited here, unshielded)
            for entry in reversed(list(self._attached)):
                if entry.closer is not None:
                    await entry.closer()
        finally:
            try:
                tg, self._tg = self._tg, None
                if tg is not None:  # the placement monitor, the energy sampler: entered in __aenter__
                    tg.cancel_scope.cancel()
                    await tg.__aexit__(None, None, None)
                if self._meter is not None and self._meter.measuring:
                    with anyio.CancelScope(shield=True):  # the board's energy up to the close
                        await anyio.to_thread.run_sync(self._meter.sample)
                if self._trace is not None:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._trace.close)
                if self._publisher is not None:
                    with anyio.CancelScope(shield=True):  # nothing runs on the board any more
                        await anyio.to_thread.run_sync(self._publisher.withdraw)
            finally:
                try:
                    leak = await self._close_board(self._owns_governor)
                finally:
                    self._open = False
                    self._closing = False
        return leak

    async def stop_workers(self) -> None:
        """Stop and join the device workers (part of closing; event loop). Requests still queued
        then fail with :class:`RuntimeStateError` instead of waiting for workers that are gone."""
        sch = self._scheduler
        if sch is None or not sch.workers:
            return
        workers = sch.stop()
        for w in workers:
            await anyio.to_thread.run_sync(w.join)
            self._retired_runs += w.runs
        for t in sch.tenants():
            t.flush_costs()
        sch.fire_deferred()
        for w in workers:
            sch.abort(w.drain(), RuntimeStateError("the runtime stopped its device workers"))

    async def _close_board(self, governor_entered: bool) -> BufferLeakError | None:
        """Stop the workers, then exit what ``__aenter__`` entered in reverse order: the governor
        (restoring every clock it changed), the transfer engine, the pools. Shielded but the
        governor's exit, whose task group was entered here unshielded (it restores
        synchronously, so no cancellation can cut the restore short)."""
        leaks: list[BufferLeakError] = []
        try:
            with anyio.CancelScope(shield=True):
                await self.stop_workers()
        finally:
            try:
                if governor_entered:
                    await self.governor.__aexit__(None, None, None)
            finally:
                if self._engine is not None:
                    engine, self._engine = self._engine, None
                    with anyio.CancelScope(shield=True):
                        await engine.__aexit__(None, None, None)
                for pool in self._pools.values():
                    try:
                        pool.close()
                    except BufferLeakError as err:
                        leaks.append(err)
        if not leaks:
            return None
        labels = [lbl for e in leaks for lbl in e.labels]
        stages = sorted({lbl.split(":", 1)[0] for lbl in labels if lbl is not None})
        return BufferLeakError(f"closed with buffers still referenced, produced by stage(s) {stages}: "
                               + "; ".join(str(e) for e in leaks), labels=labels, stages=stages)

    # -- statistics ---------------------------------------------------------------------------

    def worker_threads(self) -> int:
        sch = self._scheduler
        return sum(w.concurrency for w in sch.unique_workers()) if sch is not None else 0

    def statistics(self) -> RuntimeStatistics:
        """The sessions' shares of the board's busy time and energy (see :class:`RuntimeStatistics`)."""
        entries = [*self._gone, *self._attached]
        shares: list[tuple[_Attached, TenantStatistics, float | None]] = []
        for e in entries:
            ts = e.final if e.final is not None else e.tenant.statistics()
            energy = e.final_energy if e.final is not None else e.energy()
            shares.append((e, ts, energy))
        busy: dict[str, float] = {}
        for _, ts, _ in shares:
            for dev, sec in ts.busy_s.items():
                busy[dev] = busy.get(dev, 0.0) + sec
        total_busy = sum(busy.values())
        energies = [en for _, _, en in shares if en is not None]
        stage_total = sum(energies) if energies else None
        total, source, note = stage_total, "modelled" if stage_total is not None else None, None
        meter = self._meter
        if meter is not None:
            if self._open and not self._closing:
                meter.sample()  # the board's energy up to this call
            if meter.source is not None:
                total, source = meter.energy_j, meter.source
            else:
                note = meter.note or f"the {meter.rail} rail read fewer than two samples so far"
        out: list[SessionShare] = []
        split: dict[str, float] = {}
        for e, ts, en in shares:
            share = sum(ts.busy_s.values()) / total_busy if total_busy > 0 else 0.0
            part = total * share if total is not None else None
            if part is not None:
                split[e.name] = part
            out.append(SessionShare(e.name, e.final is None, MappingProxyType(dict(ts.busy_s)), share, en, part,
                                    ts.requests, ts.completed, ts.slo_met, ts.slo_missed, ts.slo_flagged))
        sch = self._scheduler
        sst: SchedulerStatistics | None = sch.statistics() if sch is not None else None
        gov = self.governor
        return RuntimeStatistics(
            sessions=tuple(out), devices=tuple(d.name for d in self._devices), worker_threads=self.worker_threads(),
            busy_s=MappingProxyType(busy), energy_j=total, energy_source=source,
            energy_split_j=MappingProxyType(split), stage_energy_j=stage_total, energy_note=note,
            transfers=self._engine.statistics() if self._engine is not None else None,
            queued_stages=sst.queued_stages if sst is not None else 0,
            in_flight=sst.admitted if sst is not None else 0, max_in_flight=self._max_in_flight,
            governor=gov.statistics() if gov is not None else None, replacements=tuple(self._replacements))


def worker_cpus(dev: Device) -> Sequence[tuple[int, ...]]:
    """The CPU sets of ``dev``'s worker threads: its backend's choice where it makes one
    (e.g. per-core workers), else one worker pinned to the device's cores."""
    workers = get_backend(dev.backend).hooks.workers
    return workers.worker_cpus(dev) if workers is not None else [tuple(dev.cpus)]

