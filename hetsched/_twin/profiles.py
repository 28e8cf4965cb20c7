"""SoC profiles: the schema re-exported, the boards registry and its lookups.

The dataclasses live in :mod:`~hetsched._twin.schema`; each board's figures in its own module
under :mod:`~hetsched._twin.boards`, every figure with a source key that ``docs/sources.md``
resolves to a public primary source (``docs/twin-calibration.md`` explains the figures).
"""

from __future__ import annotations

from collections.abc import Callable

from .._errors import UnknownSocError
from .boards import orin_agx_profile, orin_nano_profile, orin_nx_profile, rk3588_profile
from .schema import (
    DomainKind,
    DomainProfile,
    NvpModel,
    Opp,
    RailProfile,
    SocProfile,
    TempCap,
    ThermalLayout,
    ThermalNode,
    ThrottleInstance,
    Trip,
    VendorQuirks,
    ZoneProfile,
)

__all__ = [
    "DomainKind",
    "DomainProfile",
    "NvpModel",
    "Opp",
    "RailProfile",
    "SocProfile",
    "TempCap",
    "ThermalLayout",
    "ThermalNode",
    "ThrottleInstance",
    "Trip",
    "VendorQuirks",
    "ZoneProfile",
    "get_profile",
    "known_socs",
    "rk3588_profile",
]

_FACTORIES: dict[str, Callable[[], SocProfile]] = {
    "rk3588": rk3588_profile,
    "orin-nx": orin_nx_profile,
    "orin-agx": orin_agx_profile,
    "orin-nano": orin_nano_profile,
}
_CACHE: dict[str, SocProfile] = {}


def known_socs() -> tuple[str, ...]:
    """Names :func:`get_profile` accepts."""
    return tuple(_FACTORIES)


def get_profile(name: str) -> SocProfile:
    """The profile called ``name`` (``rk3588``, ``orin-nx``, ``orin-agx``, ``orin-nano``).

    Raises:
        UnknownSocError: no such profile; the message lists the known names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _FACTORIES:
        raise UnknownSocError(f"unknown SoC {name!r}; known: {', '.join(_FACTORIES)}")
    prof = _CACHE.get(key)
    if prof is None:
        prof = _CACHE[key] = _FACTORIES[key]()
    return prof
