"""The option objects of :class:`~hetsched.Session` and :class:`~hetsched.Runtime`.

The common arguments stay flat (``model``, ``devices``, ``policy``, ``root``, ``shapes``,
``hooks``, ``governor``, ``trace``, ``clock``, ``max_in_flight``, ...); the rest come in three
frozen groups, as httpx takes ``limits=Limits(...)`` and ``timeout=Timeout(...)``:

* :class:`Scheduling`: how every device's queue orders stages (priorities, aging, the order
  within a priority class). One per board: a :class:`~hetsched.Runtime` takes it, or a
  Session that opens a runtime of its own.
* :class:`Memory`: the memory domains, the pools and the transfer engine between them. One per
  board, like :class:`Scheduling`.
* :class:`Adaptation`: what a session learns and changes while it serves (re-planning, the
  background compile, measured costs, the power budget and device states fed to its policy).
  One per session.

Each validates its fields when made (a wrong value raises ``ValueError`` naming the field, a
wrong type ``TypeError``), so
a bad option fails where it is written, not when the session opens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .._runtime._tenants import Order
from ._replan import Replanning

if TYPE_CHECKING:
    from hetsched.policies import DeviceState

    from .._runtime._domains import Topology
    from .._runtime._transfer import CopyFn

__all__ = ["Adaptation", "Memory", "Scheduling"]


@dataclass(frozen=True)
class Scheduling:
    """How the device queues order the stages of every request (one per board).

    ::

        hetsched.Session(model, scheduling=hetsched.Scheduling(aging_s=0.1))
        hetsched.Runtime(root=root, scheduling=hetsched.Scheduling(priorities=False))  # FIFO, for comparison

    Each device runs the most urgent ready stage next: by priority class first, a waiting
    request gaining one class per ``aging_s`` seconds (so BACKGROUND never starves), then,
    within a class, requests with an SLO by their deadline (``order``), requests without one by
    admission, shared among sessions by their weights (see ``hetsched/_runtime/_tenants.py``).
    """

    priorities: bool = True
    """False: plain FIFO by admission; priorities are then ignored by the device queues and by
    the transfer channels."""
    aging_s: float | None = 0.5
    """Seconds of waiting worth one priority level (a BACKGROUND request that waited
    ``3 * aging_s`` longer than a REALTIME one goes first); None: no aging."""
    order: Order = Order.LEAST_SLACK
    """How requests with an SLO order within a priority class: least slack first (Band's LSF:
    the deadline less the estimated time still to run) or earliest deadline first."""

    def __post_init__(self) -> None:
        if not isinstance(self.priorities, bool):
            raise ValueError(f"Scheduling.priorities must be True or False, got {self.priorities!r}")
        if self.aging_s is not None and not (isinstance(self.aging_s, (int, float)) and math.isfinite(self.aging_s)
                                             and self.aging_s > 0):
            raise ValueError(f"Scheduling.aging_s must be a positive number of seconds or None, got {self.aging_s!r}")
        if not isinstance(self.order, Order):
            raise TypeError(f"Scheduling.order must be a hetsched.Order, got {self.order!r}")


@dataclass(frozen=True)
class Memory:
    """The memory domains, their pools and the transfer engine (one per board).

    ::

        hetsched.Session(model, memory=hetsched.Memory(topology=topo, chunk_bytes=64 << 10))
    """

    topology: Topology | None = None
    """The memory domains and which share DRAM. Default: the host and every device's
    ``memory_domain`` share memory (a unified-memory SoC, or this host), so no tensor is ever
    copied between stages. With domains that do not share memory, tensors crossing them go
    through the transfer engine at the request's priority."""
    chunk_bytes: int = 1 << 20
    """Transfer granularity, i.e. how soon an urgent copy takes a busy channel."""
    copy_fn: CopyFn | None = None
    """The transfer engine's chunk copy (e.g. ``rate_limited_copy`` to model a board link)."""
    pool_capacity_bytes: int | Mapping[str, int | None] | None = None
    """Bound on the bytes each memory domain's pool holds (one value for all, or per domain
    name; default unbounded). A stage that finds its pool full does not wait: that run writes
    into backend-allocated outputs instead (``stage_runs_unbound``); a transfer into a full
    domain waits for room (backpressure)."""

    def __post_init__(self) -> None:
        if isinstance(self.chunk_bytes, bool) or not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ValueError(f"Memory.chunk_bytes must be a positive int, got {self.chunk_bytes!r}")
        if self.copy_fn is not None and not callable(self.copy_fn):
            raise ValueError(f"Memory.copy_fn must be callable or None, got {type(self.copy_fn).__name__}")
        cap = self.pool_capacity_bytes
        if isinstance(cap, Mapping):
            object.__setattr__(self, "pool_capacity_bytes", MappingProxyType(dict(cap)))
        elif cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
            raise ValueError(f"Memory.pool_capacity_bytes must be an int >= 0, a mapping or None, got {cap!r}")


@dataclass(frozen=True)
class Adaptation:
    """What a session learns and changes while it serves (one per session).

    ::

        hetsched.Session(model, adaptation=hetsched.Adaptation(replanning=None))         # the opening plan stays
        hetsched.Session(model, adaptation=hetsched.Adaptation(background_compile=True))  # serve at once
    """

    replanning: Replanning | None = Replanning()  # noqa: RUF009 (a frozen dataclass: one shared value)
    """How the session re-places its model while serving (:class:`hetsched.Replanning`: board
    sampling period, thermal/power thresholds with hysteresis, cost drift factor, failures that
    quarantine a device); None: the plan made at opening stays (and a failing stage fails its
    request, nothing is retried)."""
    background_compile: bool = False
    """Open fast: devices whose backend compiles slowly (the RKNN toolkit starts a process and
    converts or reloads each stage) are left out of the opening plan when the other devices can
    run the whole model, so the session serves at once; the plan with every device is compiled
    in the background and switched to when ready (``Event.REPLAN``, reason ``"background
    compile: ..."``; ``Session.wait_planned`` waits for it)."""
    learn_costs: bool = True
    """Fold every stage run's time into the session's cost table (in batches of 16 runs per
    stage, and whatever is left when the workers stop)."""
    power_budget_w: float | None = None
    """The board power the policy's ``power_headroom`` is measured against (rails where
    measured, the SoC model where estimated); default: the governor's ``power_budget_w`` when a
    governor is given, else no budget (headroom 1)."""
    device_states: Mapping[str, DeviceState] = field(default_factory=lambda: MappingProxyType({}))
    """Utilisation / headroom per device fed to the policy (over what the board sampler reads)."""

    def __post_init__(self) -> None:
        if self.replanning is not None and not isinstance(self.replanning, Replanning):
            raise TypeError("Adaptation.replanning must be a hetsched.Replanning or None, "
                             f"got {type(self.replanning).__name__}")
        if not isinstance(self.background_compile, bool):
            raise ValueError(f"Adaptation.background_compile must be True or False, got {self.background_compile!r}")
        if not isinstance(self.learn_costs, bool):
            raise ValueError(f"Adaptation.learn_costs must be True or False, got {self.learn_costs!r}")
        budget = self.power_budget_w
        if budget is not None and not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            raise ValueError(f"Adaptation.power_budget_w must be a positive number of watts or None, got {budget!r}")
        if not isinstance(self.device_states, Mapping):
            raise ValueError("Adaptation.device_states must be a mapping of device name to DeviceState")
        object.__setattr__(self, "device_states", MappingProxyType(dict(self.device_states)))
