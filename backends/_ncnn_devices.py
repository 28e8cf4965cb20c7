"""Devices of the ``ncnn`` backend: the GPU a Vulkan driver exposes, through ncnn.

- On a real RK3588 (the host's ``/``): ``gpu`` / ``gpu:0`` is the Mali-G610 through ncnn when
  ``hetsched[ncnn]`` is installed and ncnn finds a Vulkan device; otherwise the spec is refused
  and the default device list leaves the GPU out with a note (:func:`mali_note`).
- On a twin's root: ``gpu:ncnn`` is the twin's GPU computed by ncnn on this host's Vulkan device
  (Mesa's lavapipe in CI), its time, power and heat modelled by the twin as for every twin device.
- Anywhere else: ``gpu:ncnn`` is the host's Vulkan device through ncnn.
"""

from __future__ import annotations

import dataclasses

from hetsched._errors import DeviceSpecError

from ._base import Device
from ._ncnn_convert import ncnn_unavailable_reason, vulkan_devices

__all__ = ["MALI_G610_FLOPS", "mali_note", "ncnn_gpu_device"]

MALI_G610_FLOPS = 4.5e11
"""Prior of the analytic cost model for the RK3588's Mali-G610 MP4 (Arm: 4 cores, 64 fp32 FMA
lanes per core at up to 1 GHz is ~512 GFLOP/s; ncnn reaches less), replaced by measured times."""

_TYPE_FLOPS = {"discrete": 1.0e13, "integrated": 5.0e11, "virtual": 1.0e11, "cpu": 2.0e10}
_MEM_BW = 1.0e10


def hardware_reason() -> str | None:
    reason = ncnn_unavailable_reason()
    if reason is None and all(d.type == "cpu" for d in vulkan_devices()):
        names = ", ".join(d.name for d in vulkan_devices())
        reason = (f"ncnn finds only a software Vulkan device ({names}), no GPU driver (the Mali needs Arm's "
                  "Vulkan driver or Mesa's panvk)")
    return reason


def ncnn_gpu_device(spec: str, *, base: Device | None = None, soc: str | None = None) -> Device:
    """The ``ncnn`` device of ``spec``: ``base`` (a twin's GPU) on the ncnn backend, or the host's
    Vulkan device (on a real board, ``soc`` given: its GPU, never a software Vulkan driver).

    :raises DeviceSpecError: ncnn, pnnx or a Vulkan device is missing (the message says which and
        what to install).
    """
    reason = hardware_reason() if soc is not None else ncnn_unavailable_reason()
    if reason is not None:
        raise DeviceSpecError(f"device spec {spec!r}: the GPU runs through ncnn, which cannot run here: {reason}")
    vk = vulkan_devices()
    default = next((d for d in vk if d.type != "cpu"), vk[0])
    if base is not None:
        return dataclasses.replace(base, backend="ncnn", options={**base.options, "vulkan": default.describe(),
                                                                   "vulkan_device": default.index})
    flops = MALI_G610_FLOPS if soc == "rk3588" else _TYPE_FLOPS.get(default.type, 1.0e11)
    return Device(name="gpu", kind="gpu", backend="ncnn", memory_domain="host", domain="gpu" if soc else None,
                  peak_flops=flops, mem_bandwidth=_MEM_BW,
                  options={"vulkan": default.describe(), "vulkan_device": default.index, "soc": soc})


def mali_note(soc_name: str = "rk3588") -> str | None:
    """Why a real RK3588's default devices leave its Mali GPU out (None: ncnn can run it)."""
    reason = hardware_reason()
    if reason is None:
        return None
    return f"gpu: left out of the {soc_name} board's default devices: {reason}"
