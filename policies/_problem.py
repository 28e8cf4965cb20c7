"""The placement problem as plain data, and the policy protocol.

A policy is a pure, synchronous function of a :class:`PlacementProblem`: no I/O, no
awaits, so it can be tested on hand-written data and reused by the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from hetsched._errors import PlacementError

__all__ = [
    "MAX_RESERVED_SHARE",
    "DeviceState",
    "DeviceStateInputs",
    "Link",
    "Placement",
    "PlacementPolicy",
    "PlacementProblem",
    "Reservation",
    "Unit",
    "validate_placement",
]

MAX_RESERVED_SHARE = 0.95
"""The most of a device's time other sessions are taken to leave unused: a device they keep
busy beyond this (saturated) is priced as if it had 5 % of its time left (20x its cost)."""


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
class DeviceStateInputs:
    """The board readings a :class:`DeviceState` was computed from (``None``: not read / unknown),
    so a plan can show why a device looked hot or busy."""

    time_s: float
    """The snapshot's time (seconds on the sampler's clock)."""
    domain: str | None = None
    """The clock domain whose load gave ``utilisation``."""
    domain_utilisation: float | None = None
    zone: str | None = None
    """The thermal zone whose temperature gave ``temp_headroom``."""
    zone_match: str = "none"
    """``"own"`` (the device's zone), ``"hottest"`` (no zone of its own: the hottest zone's
    headroom, as the SoC shares one die) or ``"none"`` (no zone with a temperature and a trip)."""
    temp_c: float | None = None
    trip_c: float | None = None
    """The passive trip the temperature was held against."""
    power_w: float | None = None
    """The board's total power."""
    power_source: str | None = None
    """``"measured"`` or ``"estimated"`` (the rails ``power_w`` came from)."""
    power_budget_w: float | None = None


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device as a policy sees it. Headrooms are fractions in [0, 1] (1 = fully free/cool)."""

    name: str
    kind: str = "cpu"
    utilisation: float = 0.0
    temp_headroom: float = 1.0
    """``(T_trip - T) / (T_trip - T_ref)`` clamped to [0, 1], ``T_trip`` the lowest passive trip
    of the device's zone (``hetsched._planning.states`` documents ``T_ref``); 0 at or above the trip."""
    power_headroom: float = 1.0
    """``(P_budget - P) / P_budget`` clamped to [0, 1]; 1 without a budget."""
    memory_domain: str = "host"
    inputs: DeviceStateInputs | None = None
    """What the state was computed from, when it came from a board snapshot."""


@dataclass(frozen=True, slots=True)
class Link:
    """Cost of moving a tensor between two devices: ``latency_s + bytes * seconds_per_byte``."""

    latency_s: float = 0.0
    seconds_per_byte: float = 0.0

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes * self.seconds_per_byte


@dataclass(frozen=True, slots=True)
class Reservation:
    """The load another session, already placed on the board, puts on its devices (plain data).

    ``busy_share[device]`` is the fraction of the device's time that session's requests take at
    its offered rate (its stages' seconds per request on the device x requests per second; a
    closed-loop session keeps its devices busy: up to 1.0). ``priority`` is its
    :class:`hetsched.Priority` value (smaller is more urgent), ``slo_s`` its requests' deadline.

    ``elastic``: the session is a closed loop (no offered rate): it keeps the devices it uses
    busy with whatever the others leave (its ``busy_share``: where it runs, each device in
    proportion to its seconds there). A newcomer of the same priority would split those devices
    with it (the scheduler's fair tags within a class) and add nothing to what the board serves
    there, so it is priced as taken, the more the more such sessions share it
    (:meth:`PlacementProblem.contention_factor`).
    """

    session: str
    busy_share: Mapping[str, float]
    priority: int = 2
    slo_s: float | None = None
    elastic: bool = False

    def __post_init__(self) -> None:
        for dev, share in self.busy_share.items():
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not (
                math.isfinite(share) and share >= 0
            ):
                raise PlacementError(
                    f"reservation of session {self.session!r}: busy share {share!r} of device {dev!r} "
                    "must be a finite number >= 0"
                )
        if self.slo_s is not None and not (
            isinstance(self.slo_s, (int, float)) and math.isfinite(self.slo_s) and self.slo_s > 0
        ):
            raise PlacementError(f"reservation of session {self.session!r}: slo_s {self.slo_s!r} must be > 0")
        if not isinstance(self.elastic, bool):
            raise PlacementError(f"reservation of session {self.session!r}: elastic {self.elastic!r} must be a bool")


@dataclass(frozen=True)
class PlacementProblem:
    """Everything a policy may look at.

    ``units`` are in a topological order. ``cost[(unit_id, device)]`` is the expected
    seconds of the unit on the device (measured where known, else analytic).
    ``edges[(u, v)]`` is the bytes unit ``u`` sends to unit ``v``. ``links[(a, b)]``
    prices a transfer from device ``a`` to device ``b`` (missing pair = free).
    ``energy[(unit_id, device)]`` is the joules one run of the unit spends on the device
    (modelled or measured); a missing pair is unknown.

    Joint placement (several models on one board): ``reservations`` are the other sessions'
    loads (:class:`Reservation`), ``priority`` (a :class:`hetsched.Priority` value) and
    ``slo_s`` (the deadline of one request, None: none) this model's. :meth:`contended` prices
    the reservations into ``cost``; the built-in policies place on that, and a model with an
    SLO its placement misses is placed again for latency alone (its deadline before energy
    and headroom).
    """

    units: tuple[Unit, ...]
    devices: Mapping[str, DeviceState]
    cost: Mapping[tuple[int, str], float]
    edges: Mapping[tuple[int, int], float] = field(default_factory=dict)
    links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    energy: Mapping[tuple[int, str], float] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    priority: int = 2
    slo_s: float | None = None
    rate_hz: float | None = None
    """This model's offered requests per second (None: unknown, or a closed loop taking what is left)."""

    def __post_init__(self) -> None:
        if self.rate_hz is not None and (
            isinstance(self.rate_hz, bool) or not isinstance(self.rate_hz, (int, float))
            or not (math.isfinite(self.rate_hz) and self.rate_hz >= 0)
        ):
            raise PlacementError(f"PlacementProblem.rate_hz = {self.rate_hz!r}: must be a finite number >= 0")
        if self.slo_s is not None and (
            isinstance(self.slo_s, bool) or not isinstance(self.slo_s, (int, float))
            or not (math.isfinite(self.slo_s) and self.slo_s > 0)
        ):
            raise PlacementError(f"PlacementProblem.slo_s = {self.slo_s!r}: must be a finite number of seconds > 0")

    def reserved_share(self, device: str, *, lower_priority_weight: float = 0.0, loops: bool = True) -> float:
        """The share of ``device``'s time the other sessions keep it busy *ahead of this model*.

        A scheduler that orders by priority class serves this model before a less urgent
        session's queued stages, so their load counts ``lower_priority_weight`` (default 0:
        they cost it at most the stage in progress, not priced); an equally or more urgent
        session's counts fully (a closed loop's too: it keeps its device busy with what is left;
        ``loops=False`` leaves out the closed loops of this model's priority, :meth:`sharers`).
        """
        total = 0.0
        for r in self.reservations:
            if not loops and r.elastic and r.priority == self.priority:
                continue
            share = r.busy_share.get(device, 0.0)
            total += share if r.priority <= self.priority else share * lower_priority_weight
        return total

    def sharers(self, device: str) -> int:
        """How many closed loops of this model's priority run on ``device`` (elastic reservations
        with a share there): the scheduler's fair tags would give this model ``1 / (sharers + 1)``
        of the device's time they take."""
        return sum(1 for r in self.reservations
                   if r.elastic and r.priority == self.priority and r.busy_share.get(device, 0.0) > 0.0)

    def contention_factor(self, device: str, *, lower_priority_weight: float = 0.0) -> float:
        """How much longer a unit takes on ``device`` for the time others keep it busy:
        ``(sharers + 1) / (1 - share)``, the share capped at :data:`MAX_RESERVED_SHARE` (a device
        shared in time gives this model what the others leave; its cost stretches accordingly).

        A device closed loops of this model's priority keep busy counts as taken (what they add
        to the board's throughput a newcomer there would only split with them), and the more of
        them it has, the more so (:meth:`sharers`): a newcomer goes where something is left, and
        where nothing is, to the device it would share with the fewest for its speed.
        :meth:`contended` prices a unit for which nothing is left where it runs as efficiently
        by :meth:`sharing_factor` instead.
        """
        share = min(self.reserved_share(device, lower_priority_weight=lower_priority_weight), MAX_RESERVED_SHARE)
        return (self.sharers(device) + 1) / (1.0 - share)

    def sharing_factor(self, device: str, *, lower_priority_weight: float = 0.0) -> float:
        """What a unit's time on ``device`` stretches by when this model splits it with the closed
        loops of its priority there: ``(sharers + 1) / (1 - share of the others)`` (its fair part
        of what the others leave, the share capped at :data:`MAX_RESERVED_SHARE`)."""
        share = min(self.reserved_share(device, lower_priority_weight=lower_priority_weight, loops=False),
                    MAX_RESERVED_SHARE)
        return (self.sharers(device) + 1) / (1.0 - share)

    def fits(self, device: str, *, lower_priority_weight: float = 0.0) -> bool:
        """Whether this model's offered load fits on ``device`` beside the reservations ahead of it:
        ``rate_hz x (its units' seconds there) <= (1 - reserved share) / (sharers + 1)``. False
        without an offered rate (a closed loop, or unknown: it takes whatever is left)."""
        if not self.rate_hz:
            return False
        seconds = sum(self.cost.get((u.id, device), 0.0) for u in self.units if device in u.candidates)
        free = 1.0 - self.reserved_share(device, lower_priority_weight=lower_priority_weight)
        return self.rate_hz * seconds <= free / (self.sharers(device) + 1)

    def contention_factors(self, *, lower_priority_weight: float = 0.0) -> dict[str, float]:
        """Per device, the factor :meth:`contended` stretches this model's costs there by."""
        return {d: 1.0 if self.slo_s is None and self.fits(d, lower_priority_weight=lower_priority_weight)
                else self.contention_factor(d, lower_priority_weight=lower_priority_weight) for d in self.devices}

    def contended(self, *, lower_priority_weight: float = 0.0) -> PlacementProblem:
        """This problem with the reservations priced into ``cost`` (each unit's seconds on a
        device times the device's :meth:`contention_factor`) and then dropped, so pricing
        twice changes nothing. Without reservations: ``self``.

        What the pricing stands for depends on the model: with an SLO, the waits behind the
        others' work (its latency); without one, a closed loop's share of what the others leave
        (its throughput, ``1 / (1 - share)`` again); a model without an SLO whose offered load
        :meth:`fits` on a device needs only that capacity there, so that device is not priced
        (no latency to protect: it stays where it is cheapest, energy included).

        A device closed loops of this model's priority keep busy is priced as taken
        (:meth:`contention_factor`) for a unit that has a candidate where nothing of its class
        runs yet and where a run costs no more energy (or either energy is unknown): spreading
        there adds to the board's throughput without raising its joules per request. A unit
        without such a candidate (the others would run it far less efficiently: a CNN's
        convolution on CPU cores beside a busy NPU) is priced by its fair share of the busy
        device instead (:meth:`sharing_factor`). Where no unit of the model could spread that way,
        every device where a run costs more energy than on the busy one is priced as taken too:
        the model shares the efficient device rather than moving part of itself to a slower,
        costlier one (ResNet-50's blocks to the Mali beside the RK3588's busy NPU). Where some can
        (its body to a DLA beside the Orin's busy GPU), its other units go where they are cheapest
        in time (the body's small tail to a CPU cluster)."""
        if not self.reservations:
            return self
        w = lower_priority_weight
        factor = self.contention_factors(lower_priority_weight=w)
        busy = {d for d in self.devices if self.sharers(d)}
        # (a device its offered load fits on is not priced at all: see contention_factors)
        sharing = {d: self.sharing_factor(d, lower_priority_weight=w) for d in busy
                   if self.slo_s is not None or not self.fits(d, lower_priority_weight=w)}
        energy = self.energy
        cost: dict[tuple[int, str], float] = {}
        by_id = {u.id: u for u in self.units} if sharing else {}

        def spreads(unit: Unit, d: str) -> bool:
            """A device where nothing of this class runs runs ``unit`` for no more energy than ``d``."""
            e = energy.get((unit.id, d))
            return any(o not in busy and (e is None or energy.get((unit.id, o)) is None or energy[(unit.id, o)] <= e)
                       for o in unit.candidates if o != d)

        shared = {(u, d) for u, unit in by_id.items() for d in unit.candidates if d in sharing
                  and not spreads(unit, d)}
        # Where no unit that costs energy could spread (the model runs efficiently only on devices
        # its class keeps busy), a device where a run costs more than on the busy one would add to
        # the board's throughput only at its joules per request: priced as taken, as a busy device
        # is, so the model shares rather than moves part of itself there.
        moves = any((u, d) not in shared and energy.get((u, d), 1.0) > 0.0
                    for u, unit in by_id.items() for d in unit.candidates if d in sharing)
        least_busy: dict[int, float] = {}
        if not moves:
            for u, unit in by_id.items():
                known = [energy[(u, d)] for d in unit.candidates if d in sharing and (u, d) in energy]
                if known:
                    least_busy[u] = min(known)
        taken = 1.0 / (1.0 - MAX_RESERVED_SHARE)
        for (u, d), c in self.cost.items():
            f = factor.get(d, 1.0)
            if (u, d) in shared:
                f = sharing[d]
            elif u in least_busy and d not in busy and energy.get((u, d), 0.0) > least_busy[u]:
                f = max(f, taken)
            cost[(u, d)] = c * f
        return replace(self, cost=cost, reservations=())

    def energy_excess_j(self, unit: Unit) -> dict[str, float]:
        """Per candidate of ``unit`` with a known energy: its joules above the least known one.

        Candidates whose energy is unknown get no entry (no term): measuring the excess from
        the cheapest known device keeps an unknown device from looking free next to known ones.
        """
        known = {d: self.energy[(unit.id, d)] for d in unit.candidates if (unit.id, d) in self.energy}
        if not known:
            return {}
        least = min(known.values())
        return {d: e - least for d, e in known.items()}

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
