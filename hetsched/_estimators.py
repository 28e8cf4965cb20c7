"""Wiring between the platform layer and the SoC models: which power estimator a board gets.

:class:`hetsched._platform.Telemetry` reads a board and never imports a model; whoever
builds one for a known SoC (``hetsched top``, the governor's board port, benchmarks)
asks :func:`power_estimator_for` and passes the result as ``estimator=``. This module sits
above both layers, so the real-board layer does not depend on the simulator.
"""

from __future__ import annotations

from ._errors import UnknownSocError
from ._platform.discovery import Platform
from ._platform.telemetry import Estimator

__all__ = ["power_estimator_for"]


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
