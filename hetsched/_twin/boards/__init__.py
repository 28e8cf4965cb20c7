"""The twin's board data: one module per board, each built on :mod:`hetsched._twin.schema`."""

from __future__ import annotations

from .orin_agx import orin_agx_profile
from .orin_nano import orin_nano_profile
from .orin_nx import orin_nx_profile
from .rk3588 import rk3588_profile

__all__ = ["orin_agx_profile", "orin_nano_profile", "orin_nx_profile", "rk3588_profile"]
