"""Board trees for tests: a static, consistent snapshot of a twin board's sysfs/procfs."""

from __future__ import annotations

import os
from pathlib import Path

from .._twin.profiles import get_profile
from .._twin.sim import idle_state_into
from .._twin.state import boot_state
from .._twin.tree import BoardTree, OfflineStyle

__all__ = ["BOARD_SOCS", "build_board_tree"]

BOARD_SOCS: tuple[str, ...] = ("rk3588", "orin-nx", "orin-agx", "orin-nano")
"""SoC names :func:`build_board_tree` accepts."""


def build_board_tree(
    root: str | os.PathLike[str],
    soc: str,
    *,
    variant: str | None = None,
    offline_style: OfflineStyle = "-256000",
) -> Path:
    """Write the sysfs/procfs tree of an idle twin ``soc`` under ``root`` and return ``root``.

    The tree is what a freshly booted idle board shows (``sys/``, ``proc/``, ``etc/`` below
    ``root``), rendered by the SoC twin from its profile, so it is consistent: frequencies,
    temperatures and rail powers come from the same model. Layouts follow the kernel ABI and
    the vendor trees ``docs/twin-sysfs.md`` describes (sources in ``docs/sources.md``).

    Args:
        soc: ``"rk3588"``, ``"orin-nx"``, ``"orin-agx"`` or ``"orin-nano"``.
        variant: RK3588 ``"vendor"`` (default) or ``"mainline"`` thermal zones; Orin ``"jp6"``
            (default) or ``"jp5"`` naming (GPU node, zone names, release file).
        offline_style: how fused-off Orin zones (cv0-2 on NX/Nano) read: ``"-256000"``, or
            ``"eagain"`` (an empty ``temp``: a board's read fails with EAGAIN and yields no data).

    Raises:
        UnknownSocError: unknown ``soc`` or ``variant`` (the message lists the known ones).
        TwinError: ``root`` exists and is not a directory.
    """
    profile = get_profile(soc)
    tree = BoardTree(root, profile, variant, offline_style=offline_style)
    state = idle_state_into(profile, tree.variant, boot_state(profile, tree.variant))
    tree.materialise(state)
    return tree.root
