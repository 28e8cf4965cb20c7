"""The two labels every benchmark's final JSON line carries, so no figure loses what it is.

``"board"``: where the figures come from: ``"twin:<soc>"`` (hetsched's SoC twin, a labelled
simulator), several joined by ``+``, or ``"host:<machine>"`` for this machine itself.
``"figures"``: ``"modelled"`` (the twin's modelled board time, power and energy) or
``"measured on <what>"`` (wall time, CPU time or counts read on this host).
"""

from __future__ import annotations

import os
import platform
from typing import Any

MODELLED = "modelled (SoC twin: a simulator calibrated from public data, not a board)"


def host() -> str:
    """``host:<arch>, <n> CPUs, Python <x.y>``: the machine this run measured."""
    return f"host:{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def twin(*socs: str) -> str:
    return "+".join(f"twin:{s}" for s in socs)


def measured(what: str = "") -> str:
    return f"measured on {host().removeprefix('host:')}" + (f" ({what})" if what else "")


def labelled(result: dict[str, Any], *, board: str, figures: str) -> dict[str, Any]:
    """``result`` with ``board`` and ``figures`` first."""
    return {"board": board, "figures": figures, **result}
