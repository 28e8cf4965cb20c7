"""The placement problem as plain data, and the policy protocol.

A policy is a pure, synchronous function of a :class:`PlacementProblem`: no I/O, no
awaits, so it can be tested on hand-written data and reused by the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from hetsched._errors import PlacementError

__all__ = [
    "DeviceState",
    "Link",
    "Placement",
    "PlacementPolicy",
    "PlacementProblem",
    "Unit",
    "validate_placement",
]


@dataclass(frozen=True, slots=True)
class Unit:
    """A unit subgraph: nodes with the same capable devices (Band's unit subgraph)."""

    id: int
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    candidates: tuple[str, ...]
    """Devices that can run every node of the unit."""
    preds: tuple[int, ...] = ()
    succs: tuple[int, ...] = ()
    flops: float = 0.0
    bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device as a policy sees it. Headrooms are fractions in [0, 1] (1 = fully free/cool)."""

    name: str
    kind: str = "cpu"
    utilisation: float = 0.0
    temp_headroom: float = 1.0
    """(T_max - T) / T_max, T_max being the first passive trip of the device's zone."""
    power_headroom: float = 1.0
    """(P_budget - P) / P_budget."""
    memory_domain: str = "host"


@dataclass(frozen=True, slots=True)
class Link:
    """Cost of moving a tensor between two devices: ``latency_s + bytes * seconds_per_byte``."""

    latency_s: float = 0.0
    seconds_per_byte: float = 0.0

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes * self.seconds_per_byte


@dataclass(frozen=True)
class PlacementProblem:
    """Everything a policy may look at.

    ``units`` are in a topological order. ``cost[(unit_id, device)]`` is the expected
    seconds of the unit on the device (measured where known, else analytic).
    ``edges[(u, v)]`` is the bytes unit ``u`` sends to unit ``v``. ``links[(a, b)]``
    prices a transfer from device ``a`` to device ``b`` (missing pair = free).
    """

    units: tuple[Unit, ...]
    devices: Mapping[str, DeviceState]
    cost: Mapping[tuple[int, str], float]
    edges: Mapping[tuple[int, int], float] = field(default_factory=dict)
    links: Mapping[tuple[str, str], Link] = field(default_factory=dict)

    def transfer_seconds(self, u: int, v: int, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        link = self.links.get((src, dst))
        if link is None:
            return 0.0
        return link.seconds(self.edges.get((u, v), 0.0))


@dataclass(frozen=True)
class Placement:
    """A device per unit, plus the score terms that decided it (for ``Session.plan``)."""

    assignment: Mapping[int, str]
    policy: str = ""
    scores: Mapping[int, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    """``scores[unit][device]`` = named terms (e.g. ``latency_s``, ``util``, ``score``)."""


@runtime_checkable
class PlacementPolicy(Protocol):
    """Anything with ``place(problem) -> Placement`` (or a mapping unit id -> device)."""

    def place(self, problem: PlacementProblem) -> Placement | Mapping[int, str]: ...


def validate_placement(problem: PlacementProblem, result: object, policy_name: str) -> Placement:
    """Check a policy's answer.

    :raises PlacementError: not a placement, an unknown device, an incapable device,
        or a unit left unplaced (each message names the unit and device).
    """
    if isinstance(result, Placement):
        placement = result
    elif isinstance(result, Mapping):
        placement = Placement(assignment=dict(result), policy=policy_name)
    else:
        raise PlacementError(
            f"policy {policy_name!r} returned {type(result).__name__}, expected a Placement or a mapping"
        )
    assignment = placement.assignment
    for unit in problem.units:
        dev = assignment.get(unit.id)
        if dev is None:
            raise PlacementError(
                f"policy {policy_name!r} left unit {unit.id} ({', '.join(unit.nodes[:3])}"
                f"{'...' if len(unit.nodes) > 3 else ''}) unplaced"
            )
        if dev not in problem.devices:
            raise PlacementError(
                f"policy {policy_name!r} placed unit {unit.id} on unknown device {dev!r} "
                f"(devices: {sorted(problem.devices)})"
            )
        if dev not in unit.candidates:
            raise PlacementError(
                f"policy {policy_name!r} placed unit {unit.id} (ops {sorted(set(unit.op_types))}) on "
                f"device {dev!r}, which cannot run it (capable: {list(unit.candidates)})"
            )
    extra = set(assignment) - {u.id for u in problem.units}
    if extra:
        raise PlacementError(f"policy {policy_name!r} placed unknown units {sorted(extra)[:5]}")
    if not placement.policy:
        placement = Placement(dict(assignment), policy_name, placement.scores)
    return placement
