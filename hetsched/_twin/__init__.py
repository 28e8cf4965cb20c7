"""The SoC twin: a clearly labelled *simulator* of RK3588 / Jetson Orin boards.

Nothing here touches real hardware. The twin is made of

* :mod:`~hetsched._twin.profiles` -- board data (OPP tables, energy-model coefficients,
  thermal network, trips, rails) with the sources they were taken from and the figures
  that had to be assumed;
* :mod:`~hetsched._twin.physics` -- pure power / thermal / throttling model (no I/O);
* :mod:`~hetsched._twin.sim` -- the fast virtual-time simulation (:class:`SimBoard`);
* :mod:`~hetsched._twin.tree` -- materialises a board's sysfs/procfs tree under a root;
* :mod:`~hetsched._twin.live` -- :class:`LiveTwin`, a live tree kept updated from the model;
* :mod:`~hetsched._twin.estimate` -- :func:`power_estimator`, rail power from the model for
  boards without sensors (RK3588).
"""

from __future__ import annotations

from .profiles import SocProfile, get_profile, known_socs
from .live import LiveTwin, LiveTwinStatistics
from .estimate import power_estimator
from .sim import DomainInfo, PhaseWork, SimBoard, SimStatistics

__all__ = [
    "DomainInfo",
    "LiveTwin",
    "LiveTwinStatistics",
    "PhaseWork",
    "SimBoard",
    "SimStatistics",
    "SocProfile",
    "get_profile",
    "known_socs",
    "power_estimator",
]
