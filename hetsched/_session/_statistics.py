"""What a session reports: :class:`SessionStatistics`, its energy figures, and the board sampler
that gives the policy each device's state (:class:`BoardSampler`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from hetsched.backends import Device
from hetsched.policies import DeviceState

from .._errors import HetschedError
from .._runtime._buffers import PoolStatistics
from .._runtime._failover import FailoverStatistics
from .._runtime._scheduler import StageRuntime
from .._runtime._tenants import Tenant
from .._runtime._transfer import TransferStatistics
from ._replan import ReplanStatistics
from ._setup import CompileStatistics, compile_counters

if TYPE_CHECKING:
    from .._runtime._buffers import BufferPool
    from ._core import SessionCore
    from ._lifecycle import Lifecycle

__all__ = ["BoardSampler", "SessionStatistics", "energy_fields", "session_statistics"]


@dataclass(frozen=True)
class SessionStatistics:
    """A snapshot of a :class:`Session` (pool and transfer snapshots included)."""

    requests_started: int
    requests_completed: int
    requests_failed: int
    requests_cancelled: int
    in_flight: int
    stage_runs: int
    stages: int
    devices: int
    max_in_flight: int = 0
    """The admission bound (backpressure): more requests wait before starting."""
    peak_in_flight: int = 0
    """Most requests admitted at once so far (never above ``max_in_flight``)."""
    queued_stages: int = 0
    """Ready stages waiting in device queues now."""
    stage_runs_bound: int = 0
    """Stage runs whose outputs were written straight into pool buffers (IO binding)."""
    stage_runs_unbound: int = 0
    """Stage runs whose outputs the backend allocated (dynamic shapes, unbindable types, a full pool)."""
    stage_runs_to_caller: int = 0
    """Runs of stages whose outputs only the caller reads, who wanted arrays to keep: the backend
    allocated them and they were handed over as they were (no pool buffer, no copy)."""
    unbound_stages: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Stages not run in place, with the reason."""
    wakeups_coalesced: int = 0
    """Finished NORMAL/BACKGROUND requests whose caller was woken together with a later one
    (the workers its next request would start on still had queued work; see README, Runtime)."""
    bytes_copied_to_caller: int = 0
    """Bytes of the one documented copy of each output handed to a caller (0 with ``zero_copy``)."""
    bytes_staged: int = 0
    """Bytes of fed arrays copied into host buffers to be transferred to a domain the host does not share."""
    pools: Mapping[str, PoolStatistics] = field(default_factory=lambda: MappingProxyType({}))
    """One snapshot per memory domain's buffer pool."""
    transfers: TransferStatistics | None = None
    """The transfer engine's snapshot (None before the session opened)."""
    compile: CompileStatistics = field(default_factory=CompileStatistics)
    """Conversions, cache hits and conversion seconds of the backends since the session opened,
    and the (unit, device) pairs refused by trying (see ``hetsched/_session/_setup.py``)."""
    energy_j: float | None = None
    """Joules of every stage run so far (plans re-placed away included), where the backends
    report energy; None when none does."""
    energy_source: str | None = None
    """Where :attr:`energy_j` comes from: ``"modelled"`` (a twin's devices and the NPU on a
    twin root: the twin's power model at the clocks of each run), or None."""
    stage_energy_j: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Per stage of the current plan, the joules its runs spent (where reported)."""
    replanning: ReplanStatistics = field(default_factory=ReplanStatistics)
    """Re-plans while serving and why the last one happened."""
    failover: FailoverStatistics | None = None
    """Device failures, re-submitted requests, quarantined devices (None: failover off)."""
    device_busy_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Per device, the board seconds its stage runs kept it busy, where the backends model or
    measure them (a twin's devices: the modelled time of each run at its clocks), plans
    re-placed away included. On a twin, the largest is the pipeline's board time."""
    allocation_failures: int = 0
    """Stage runs whose pool buffers could not be allocated (they ran unbound, still bound after)."""
    worker_states_renewed: int = 0
    """Per-worker stage states (a device context: an RKNN toolkit process) found dead and built
    anew by their worker (see ``hetsched/_runtime/_workers.py``)."""
    slo_s: float | None = None
    """The session's default SLO (None: none)."""
    slo_met: int = 0
    """Finished requests that had an SLO and met it."""
    slo_missed: int = 0
    """Finished requests that had an SLO and finished after it (served, never dropped)."""
    slo_flagged: int = 0
    """Requests found unable to meet their SLO while queued (served after those that could)."""

    @property
    def bytes_copied_same_domain(self) -> int:
        """Bytes copied from a memory domain to itself, over all pools: 0 when zero-copy holds."""
        return sum(p.bytes_copied_same_domain for p in self.pools.values())



def energy_fields(sch: Tenant | None, current: Sequence[StageRuntime], retired_j: float,
                  retired_busy: Mapping[str, float]) -> dict[str, Any]:
    """``energy_j``, ``energy_source``, ``stage_energy_j`` and ``device_busy_s`` of
    :class:`SessionStatistics`, from the stages' own reports (a twin stage's ``statistics()``:
    ``modelled_energy_j``, ``modelled_time_s``) of every plan still open, plus those of the
    plans already closed (``retired_j``, ``retired_busy``)."""
    per_stage: dict[str, float] = {}
    busy = dict(retired_busy)
    stages = [st for gen in sch.live_generations() for st in gen.stages] if sch is not None else list(current)
    now = {id(st) for st in current}
    total = 0.0
    found = retired_j > 0
    for st in stages:
        modelled = st.hooks.modelled
        if modelled is None:
            continue
        snap = modelled.statistics()
        busy[st.device] = busy.get(st.device, 0.0) + float(snap.modelled_time_s)
        energy = float(snap.modelled_energy_j)
        found = True
        total += energy
        if id(st) in now:
            per_stage[st.name] = float(energy)
    return {"energy_j": total + retired_j if found else None, "energy_source": "modelled" if found else None,
            "stage_energy_j": MappingProxyType(per_stage), "device_busy_s": MappingProxyType(busy)}


def session_statistics(life: Lifecycle, core: SessionCore, pools: Mapping[str, BufferPool], *,
                       slo_s: float | None) -> SessionStatistics:
    """The snapshot ``Session.statistics()`` returns, from the session's parts: its core (request
    counters), its lifecycle (plans, compile counters, the adapter's re-plans and energy), its
    tenant of the runtime's scheduler (stage runs, SLOs) and the runtime (the board's counters,
    pools and transfers)."""
    rt = life.runtime
    sch = rt.board_scheduler if rt is not None else None
    tenant = life.tenant
    adapter = life.adapter
    stages = life.stages
    tstats = tenant.statistics() if tenant is not None else None
    return SessionStatistics(
        requests_started=core.started,
        requests_completed=core.completed,
        requests_failed=core.failed,
        requests_cancelled=core.cancelled,
        in_flight=core.in_flight,
        stage_runs=tstats.stage_runs if tstats is not None else 0,
        stages=len(stages),
        devices=len(life.devices) if core.is_open else 0,
        max_in_flight=core.max_in_flight,
        peak_in_flight=core.peak_in_flight,
        queued_stages=sch.queued() if sch is not None else 0,
        stage_runs_bound=sch.stage_runs_bound if sch is not None else 0,
        stage_runs_unbound=sch.stage_runs_unbound if sch is not None else 0,
        stage_runs_to_caller=sch.stage_runs_to_caller if sch is not None else 0,
        wakeups_coalesced=sch.wakeups_coalesced if sch is not None else 0,
        unbound_stages=MappingProxyType({st.name: st.fallback_reason or "" for st in stages if not st.bound}),
        bytes_copied_to_caller=core.bytes_copied + (sch.bytes_to_caller if sch is not None else 0),
        bytes_staged=sch.bytes_staged if sch is not None else 0,
        pools=MappingProxyType({name: p.statistics() for name, p in pools.items()}),
        transfers=rt.engine.statistics() if rt is not None and rt.engine is not None else None,
        compile=compile_counters(life.devices, since=life.compile_base, refused=len(life.refusals)),
        **(adapter.board_figures(stages) if adapter is not None else energy_fields(None, stages, 0.0, {})),
        replanning=adapter.statistics() if adapter is not None else ReplanStatistics(),
        failover=(adapter.failover.statistics() if adapter is not None and adapter.failover is not None else None),
        allocation_failures=sch.allocation_failures if sch is not None else 0,
        worker_states_renewed=sch.states_renewed if sch is not None else 0,
        slo_s=slo_s,
        slo_met=tstats.slo_met if tstats is not None else 0,
        slo_missed=tstats.slo_missed if tstats is not None else 0,
        slo_flagged=tstats.slo_flagged if tstats is not None else 0,
    )


class BoardSampler:
    """Device states from the board under ``root``, one telemetry sample at a time (blocking).

    The telemetry reader is made on the first sample and kept, so CPU loads (``/proc/stat``
    deltas) and integrated energy span samples. A board without power sensors (RK3588) gets
    the SoC's power model (``hetsched._estimators.power_estimator_for``).
    """

    def __init__(self, root: str | os.PathLike[str], *, power_budget_w: float | None = None):
        self.root = root
        self.power_budget_w = power_budget_w
        self._telemetry: Any = None

    def sample(self, devices: Sequence[Device], *, power_budget_w: float | None = None,
               ) -> Mapping[str, DeviceState] | None:
        """The states of ``devices`` now, or None where the root has no telemetry (no thermal
        zone, no clock domain: a host like a CI machine) or could not be read. ``power_budget_w``
        (default: the sampler's) is what the power headroom is measured against."""
        from .._planning.states import device_states

        try:
            if self._telemetry is None:
                from .._estimators import power_estimator_for
                from .._platform.discovery import discover
                from .._platform.telemetry import Telemetry

                platform = discover(self.root)
                self._telemetry = Telemetry(self.root, estimator=power_estimator_for(platform), platform=platform)
            snap = self._telemetry.sample_once()
        except HetschedError:
            return None  # an unreadable board: planning goes on with default states
        if not snap.zones and not snap.domains:
            return None
        budget = power_budget_w if power_budget_w is not None else self.power_budget_w
        return device_states(snap, devices, power_budget_w=budget)
