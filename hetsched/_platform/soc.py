"""SoC identity from the device tree and the L4T release file.

* ``proc/device-tree/compatible`` (or ``sys/firmware/devicetree/base/compatible``):
  NUL-separated strings, most specific first, e.g.
  ``"radxa,rock-5b\\0rockchip,rk3588\\0"`` or
  ``"nvidia,p3768-0000+p3767-0000\\0nvidia,p3767-0000\\0nvidia,tegra234\\0"``.
* ``etc/nv_tegra_release``: present on every L4T image.

Orin modules are told apart by their module part number: p3701 = AGX Orin,
p3767-0000/0001 = Orin NX 16/8 GB, p3767-0003/0004/0005 = Orin Nano 8/4 GB.
"""

from __future__ import annotations

from ._fs import SysfsRoot

__all__ = ["identify_soc", "parse_compatible", "read_compatible", "read_model"]

_COMPATIBLE_PATHS = ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible")
_MODEL_PATHS = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")
# Module part numbers (P3767-0000 Orin NX 16GB, -0001 NX 8GB, -0003 Nano 8GB, -0004 Nano 4GB,
# -0005 Nano devkit module) from the Jetson Linux Developer Guide's module table:
# https://docs.nvidia.com/jetson/archives/r36.4/DeveloperGuide/IN/QuickStart.html
_ORIN_NANO_SKUS = ("p3767-0003", "p3767-0004", "p3767-0005")
_ORIN_NX_SKUS = ("p3767-0000", "p3767-0001")


def parse_compatible(raw: str | bytes) -> tuple[str, ...]:
    """``b"radxa,rock-5b\\0rockchip,rk3588\\0"`` -> ``("radxa,rock-5b", "rockchip,rk3588")``."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return tuple(s.strip() for s in text.split("\0") if s.strip())


def identify_soc(compatible: tuple[str, ...], nv_tegra_release: str | None = None) -> str | None:
    """``"rk3588"``, ``"orin-nx"``, ``"orin-agx"``, ``"orin-nano"`` or None (unknown / not an SoC board).

    RK3588S is reported as ``"rk3588"`` (same CPU/GPU/NPU; fewer I/O lanes).
    A tegra234 device tree without a recognised module number, or an
    ``nv_tegra_release`` without a device tree, is not enough to pick an Orin
    profile, so None is returned rather than a guess.
    """
    compat = [c.lower() for c in compatible]
    if any(c in ("rockchip,rk3588", "rockchip,rk3588s") for c in compat):
        return "rk3588"
    joined = " ".join(compat)
    if "tegra234" in joined or nv_tegra_release:
        if "p3701" in joined:
            return "orin-agx"
        if any(sku in joined for sku in _ORIN_NANO_SKUS):
            return "orin-nano"
        if any(sku in joined for sku in _ORIN_NX_SKUS):
            return "orin-nx"
    return None


def read_compatible(fs: SysfsRoot) -> tuple[str, ...]:
    for rel in _COMPATIBLE_PATHS:
        raw = fs.read_bytes(rel)
        if raw:
            return parse_compatible(raw)
    return ()


def read_model(fs: SysfsRoot) -> str | None:
    for rel in _MODEL_PATHS:
        model = fs.read_str(rel)
        if model:
            return model
    return None

