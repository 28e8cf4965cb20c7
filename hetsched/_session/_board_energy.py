"""The board's energy where the board measures it: its measured input rail, integrated.

A :class:`~hetsched.Runtime` on a root with a *measured* board-input rail (the platform layer's
:data:`~hetsched._platform.power.TOTAL_RAIL_NAMES`: ``VDD_IN`` on a Jetson, real or the
orin-nx twin) integrates it from the runtime's opening to each ``statistics()`` call. A board
without a power monitor (RK3588: its rails, where any, are only estimated) has no such figure:
the runtime's total stays the sum of the stages' modelled energy, labelled ``"modelled"``.

A rail reading is the mean power over the interval that just ended (a sensor's averaging
window, a twin's last period), so each reading stands for the time since the reading before:
``sum(p_i * (t_i - t_prev))`` (the rule of ``hetsched run``'s board energy and the governor's
meter). A reading that is absent (a flaky i2c read) is skipped; a rail that becomes unreadable
ends the measurement (the note says why), never the runtime.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import HetschedError
from .._platform.power import TOTAL_RAIL_NAMES

if TYPE_CHECKING:
    from .._platform.telemetry import Telemetry

__all__ = ["ENERGY_SAMPLE_PERIOD_S", "BoardRailMeter"]

ENERGY_SAMPLE_PERIOD_S = 0.1
"""Seconds between two readings of the board rail by a runtime (besides one at its opening and
one at every ``statistics()`` call)."""


class BoardRailMeter:
    """The measured board-input rail under ``root``, integrated over the readings taken (any
    thread, one reading at a time).

    :param clock: seconds, monotonic, of the board (the runtime's clock).
    :param telemetry: the telemetry class to read the root with (default ``Telemetry``; a test
        passes one that records its snapshots).
    """

    def __init__(self, root: str | os.PathLike[str], *, clock: Callable[[], float],
                 telemetry: type[Telemetry] | None = None) -> None:
        self.rail: str | None = None
        self.note: str | None = None
        self.samples = 0
        self.energy_j = 0.0
        self._tm: Telemetry | None = None
        self._last_t: float | None = None
        self._lock = threading.Lock()
        try:
            from .._platform.telemetry import Telemetry

            tm = (telemetry or Telemetry)(root, clock=clock)
        except HetschedError as exc:
            self.note = f"the root's board could not be read: {exc}"
            return
        rails = [r for r in tm.platform.rails if r.is_total and r.source == "measured"]
        if not rails:
            names = ", ".join(sorted(TOTAL_RAIL_NAMES - {"board", "total"}))
            self.note = (f"no measured board-input rail under {root} ({names}): "
                         f"{'its rails are only estimated (no power monitor)' if tm.platform.rails else 'it has no power rails'}")
            return
        self.rail = rails[0].name
        self._tm = tm

    @property
    def source(self) -> str | None:
        """``"measured: VDD_IN"`` once two readings integrated, else None."""
        return f"measured: {self.rail}" if self.rail is not None and self.samples >= 2 else None

    def sample(self) -> None:
        """Read the rail now and add its energy since the last reading. Never raises."""
        with self._lock:
            tm = self._tm
            if tm is None or self.rail is None:
                return
            try:
                snap = tm.sample_once()
            except HetschedError as exc:
                self.note = f"the {self.rail} rail became unreadable: {exc}"
                self.rail, self._tm = None, None
                return
            rail = snap.rails.get(self.rail)
            p = None if rail is None else rail.power_w
            if p is None or not math.isfinite(p):
                return
            if self._last_t is not None and snap.time_s > self._last_t:
                self.energy_j += p * (snap.time_s - self._last_t)
            self._last_t = snap.time_s
            self.samples += 1

    @property
    def measuring(self) -> bool:
        return self._tm is not None
