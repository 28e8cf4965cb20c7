"""Plan generations: the stages of one plan, the requests still running on them, and when they end.

A re-plan while serving installs a new :class:`Generation`; requests admitted from then on
use its programs, requests already admitted finish on the one they started on. A retired
generation whose last request is gone is *drained*: its ``on_drained`` callback runs (in
whichever thread let go of that request) and the owner closes its stages::

    install(g1)         g0.retire()        ... last request of g0 finalized ... on_drained(g0)
    new requests -> g1  g0: no new requests                                    close g0's stages

The count is of requests that hold the generation (made with one of its programs and not
yet finalized); a request re-submitted on a newer plan moves from the old one to the new.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._domains import Topology
from ._program import Program, build_program

if TYPE_CHECKING:
    from ._program import StageRuntime

__all__ = ["Generation"]

_MAX_PROGRAMS = 256
"""Programs cached per generation (a model has few (outputs, inputs) combinations)."""


class Generation:
    """One plan's stages and the programs built from them (thread-safe)."""

    __slots__ = ("_lock", "_programs", "closed", "held", "host", "number", "on_drained", "output_source", "plan",
                 "retired", "stages", "topology")

    def __init__(self, number: int, stages: Sequence[StageRuntime], output_source: Mapping[str, int | None],
                 topology: Topology, host: str):
        self.number = number
        self.stages = list(stages)
        self.output_source = output_source
        self.topology = topology
        self.host = host
        self._programs: dict[tuple[tuple[str, ...], tuple[str, ...]], Program] = {}
        self._lock = threading.Lock()
        self.held = 0
        """Requests holding this generation now."""
        self.retired = False
        self.closed = False
        self.on_drained: Callable[[Generation], None] | None = None
        self.plan: Any = None
        """The plan the stages were made from (set by the owner; the scheduler never reads it)."""

    def program(self, wanted: Sequence[str], fed: Sequence[str]) -> Program:
        """The program of requests asking ``wanted`` with inputs ``fed`` (built once; any thread)."""
        key = (tuple(wanted), tuple(fed))
        prog = self._programs.get(key)
        if prog is None:
            with self._lock:
                prog = self._programs.get(key)
                if prog is None:
                    if len(self._programs) > _MAX_PROGRAMS:
                        self._programs.clear()
                    prog = build_program(self.stages, self.output_source, wanted, fed, self.topology, self.host)
                    prog.generation = self
                    self._programs[key] = prog
        return prog

    def hold(self) -> None:
        with self._lock:
            self.held += 1

    def leave(self) -> None:
        """A request of this generation is gone; the last one of a retired generation drains it."""
        with self._lock:
            self.held -= 1
            drained = self.retired and self.held <= 0 and not self.closed
            if drained:
                self.closed = True
        if drained and self.on_drained is not None:
            self.on_drained(self)

    def retire(self, on_drained: Callable[[Generation], None]) -> None:
        """No new requests from now on; ``on_drained(self)`` once none is left (at once if none is)."""
        with self._lock:
            self.retired = True
            self.on_drained = on_drained
            drained = self.held <= 0 and not self.closed
            if drained:
                self.closed = True
        if drained:
            on_drained(self)
