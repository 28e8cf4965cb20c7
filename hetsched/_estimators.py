"""Wiring between the real-board side and the SoC models: the one place where they meet.

* Which power estimator a board gets: :class:`hetsched._platform.Telemetry` reads a board and
  never imports a model; whoever builds one for a known SoC (``hetsched top``, the governor's
  board port, benchmarks) asks :func:`power_estimator_for` and passes the result as
  ``estimator=``.
* Which devices a board root (a twin's tree, not the host's ``/``) has:
  :func:`board_twin_devices`, the twin's simulated devices at the tree's clocks, which device
  resolution (``hetsched._devices``) puts into the devices it hands the planner.

This module sits above the platform layer, the twin and the twin's backend (``backends.sim``),
so neither the platform layer, the planner nor the runtime depends on the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._errors import UnknownSocError
from ._platform.discovery import Platform
from ._platform.telemetry import Estimator

if TYPE_CHECKING:
    from hetsched.backends import Device

__all__ = ["board_twin_devices", "power_estimator_for"]


def board_twin_devices(soc: str, root: str, *, host: Sequence[int] | None = None,
                       root_bound: bool = True) -> list[Device]:
    """The twin's simulated devices of SoC ``soc`` at the clocks of the tree under ``root``
    (:func:`hetsched.backends.sim.twin_devices`, ``clock_from_root``).

    :param host: host CPUs their stages really run on (default: every CPU this process may use).
    :param root_bound: their stages report their modelled busy time to a live twin under ``root``
        (False: a device whose figures are only borrowed, e.g. the RKNN NPU's model).
    :raises UnknownSocError: no twin profile for ``soc``.
    """
    # Imported here: the twin and its backend load only for a board root.
    from hetsched.backends.sim import clock_from_root, twin_devices

    return twin_devices(soc, clock=clock_from_root(root), host=tuple(host) if host else None,
                        root=root if root_bound else None)


def power_estimator_for(platform: Platform) -> Estimator | None:
    """The SoC model's estimator when the board lacks power sensors (RK3588) and its SoC is known.

    A board with only measured rails, or an unknown SoC, gets ``None``: nothing is made up,
    and its estimated rails (if any) read ``None``. Never raises.
    """
    if platform.soc is None or not any(r.source == "estimated" for r in platform.power_rails):
        return None
    # Imported here: the twin (physics, profiles) loads only for a board that needs a model.
    from ._twin.estimate import power_estimator

    try:
        return power_estimator(platform.soc)
    except UnknownSocError:
        return None
