"""The SoC twin: a clearly labelled *simulator* of RK3588 / Jetson Orin boards.

Nothing here touches real hardware. The twin is made of

* :mod:`~hetsched._twin.schema` -- the profile dataclasses; :mod:`~hetsched._twin.boards` --
  one module of board data per board (OPP tables, energy-model coefficients, thermal
  network, trips, rails, vendor quirks), each figure with a source key that
  ``docs/sources.md`` resolves, and the figures that had to be assumed;
  :mod:`~hetsched._twin.profiles` -- the registry (:func:`get_profile`);
* :mod:`~hetsched._twin.physics` -- pure power / thermal / throttling model (no I/O);
* :mod:`~hetsched._twin.sim` -- the fast virtual-time simulation (:class:`SimBoard`), built on
  ``sim_core`` / ``sim_governors`` / ``sim_thermal``;
* :mod:`~hetsched._twin.tree` -- materialises a board's sysfs/procfs tree under a root
  (``tree_files`` writes, ``tree_rockchip`` / ``tree_tegra`` the vendor parts);
* :mod:`~hetsched._twin.live` -- :class:`LiveTwin`, a live tree kept updated from the model;
* :mod:`~hetsched._twin.estimate` -- :func:`power_estimator`, rail power from the model for
  boards without sensors (RK3588).
"""

from __future__ import annotations

from .estimate import power_estimator
from .live import LiveTwin, LiveTwinStatistics
from .profiles import SocProfile, get_profile, known_socs, rk3588_profile
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
    "rk3588_profile",
]
