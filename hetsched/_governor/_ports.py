"""Where the governor's decisions go: a board through sysfs, or the fast simulation.

A :class:`ClockPort` is the governor's only contact with a board: it lists the clock
domains, reads the time and a telemetry snapshot, saves and restores every knob it
may touch, writes one domain's frequency and reads back what the domain achieved.

What a port can do beyond that it declares as attributes (read by the governor, never
guessed from the port's class): ``state_dir`` (where the governor publishes its state and
saved knobs: a board's ``run/hetsched``, None for none), ``integrates_samples_by_telemetry``
(its energy counter is the telemetry's trapezoid of the samples the governor takes, so the
governor samples at phase boundaries) and ``settle_s`` (how long a write or read may block
waiting for a clock change; the governor sets 0 inside an event loop). A port subclassing
:class:`ClockPort` inherits the defaults (None, False, 0.0); another declares them itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .._snapshot import Snapshot
from ._points import DomainSpec
from ._state_dir import StateDir

__all__ = ["ClockPort", "SimPort"]


class ClockPort(Protocol):
    """The governor's view of a board (its capabilities: see the module docstring)."""

    soc: str | None
    state_dir: StateDir | None = None
    """The board's governor state directory (lock, state file, saved knobs); None: nothing published."""
    integrates_samples_by_telemetry: bool = False
    """Rail energy is integrated by telemetry over the samples the governor takes (a sysfs board);
    False: the port's snapshots carry their own energy counters (a simulation)."""
    settle_s: float = 0.0
    """Longest a :meth:`write`/:meth:`read` waits for a clock change to show; set to 0 by the
    governor inside an event loop (never block it)."""

    def domains(self) -> Mapping[str, DomainSpec]:
        """The domains the governor may set (name -> spec)."""
        ...

    def now(self) -> float:
        """Seconds on the port's clock (monotonic)."""
        ...

    def sample(self) -> Snapshot | None:
        """A telemetry snapshot now (None if the board cannot be read)."""
        ...

    def save(self) -> Any:
        """Everything :meth:`write` may change, to hand back to :meth:`restore`."""
        ...

    def restore(self, saved: Any) -> None:
        """Put every saved knob back as it was."""
        ...

    def write(self, domain: str, hz: int) -> None:
        """Make ``domain`` run at ``hz`` (validated against its table by the caller)."""
        ...

    def read(self, domain: str) -> int | None:
        """The frequency ``domain`` runs at now, after a bounded wait for a pending change."""
        ...


class SimPort:
    """A :class:`hetsched._twin.sim.SimBoard` (virtual time, no files) as a :class:`ClockPort`."""

    state_dir: StateDir | None = None  # no files: nothing published
    integrates_samples_by_telemetry = False  # the simulation's snapshots count energy themselves
    settle_s = 0.0  # a simulated clock change shows at once

    def __init__(self, board: Any, *, soc: str | None = None) -> None:
        self.board = board
        self.soc = soc if soc is not None else getattr(getattr(board, "profile", None), "name", None)
        specs = {}
        for name, info in board.domains().items():
            # Frequencies below the board's floor (e.g. nvpmodel's CPU minimum) cannot be reached.
            floor = board.limits(name)[0] if hasattr(board, "limits") else 0
            avail = tuple(hz for hz in info.available_hz if hz >= floor) or tuple(info.available_hz)
            specs[name] = DomainSpec(
                name=name,
                kind=info.kind,
                available_hz=avail,
                transition_latency_s=float(info.transition_latency_s),
            )
        self._domains = specs
        self._last_snapshot: Snapshot | None = None

    def domains(self) -> Mapping[str, DomainSpec]:
        return self._domains

    def now(self) -> float:
        return float(self.board.time_s)

    def sample(self) -> Snapshot | None:
        snap: Snapshot = self.board.snapshot()
        return snap

    def save(self) -> dict[str, tuple[int, str | None]]:
        gov = getattr(self.board, "governor", None)
        return {name: (int(self.board.frequency(name)), gov(name) if gov else None) for name in self._domains}

    def restore(self, saved: dict[str, tuple[int, str | None]]) -> None:
        for name, (hz, governor) in saved.items():
            if governor is not None and governor != "userspace":
                self.board.set_governor(name, governor)  # the kernel governor picks again
            else:
                self.board.set_frequency(name, hz)

    def write(self, domain: str, hz: int) -> None:
        self.board.set_frequency(domain, hz)

    def read(self, domain: str) -> int | None:
        return int(self.board.frequency(domain))
