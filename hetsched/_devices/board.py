"""Device specs on a board root: a board's tree that is not the host's ``/`` (a twin's root).

A root whose device tree (``compatible``, ``etc/nv_tegra_release``) names a SoC hetsched has a
twin profile for is a *board root*. Its devices are the twin's simulated devices (given by
:func:`hetsched._estimators.board_twin_devices`, the twin's devices at the tree's clocks: this
module never imports the twin or its backend), whose stages really run on
the host's cores, one core each, round-robin, so they never pin to CPUs the host lacks, except
the RK3588 NPU, which stays the RKNN backend's device (rknn-toolkit2's simulator computes it, the
twin models its time and energy).

Specs on a board root (:func:`board_specs` lists a board's):

- ``clusters`` / ``cpu``: every CPU cluster of the board, one device per cluster (``cluster0``...);
  ``big``, ``little``, ``mid``: the clusters of that rank (on a board whose clusters are all alike,
  as on Orin, ``big`` and ``little`` are all of them and ``mid`` is none);
- ``gpu`` / ``gpu:0``; ``npu``, ``npu:N``, ``npu:0-1``, ``npu:0-2`` (RK3588); ``dla:0``, ``dla:1``
  and ``dla`` (every DLA core; Orin AGX and NX);
- the twin's device and domain names themselves (``cluster4``, ``dla0``);
- ``cpu:LIST`` keeps its meaning everywhere: those host cores, for real.

``None`` (no specs) is the devices the real board has a backend for: every cluster, the GPU, the DLA
cores and the RK3588 NPU when the RKNN toolkit environment exists. Without it the NPU is left out;
:func:`board_device_notes` says so (and a ``hetsched.devices`` log warning is written when the default
list is built), since stages planned onto it could not compile. The RK3588's Mali GPU has no backend on
a real board but ncnn on a hardware Vulkan driver (``hetsched[ncnn]``), so it is a default only where
ncnn finds one (``gpu:ncnn`` and ``gpu`` still name it); otherwise the note says why it was left out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetsched.backends import Device

from .._errors import DeviceSpecError
from .._platform import soc
from .._platform._fs import SysfsRoot

__all__ = [
    "BoardRoot",
    "board_device_notes",
    "board_root",
    "board_soc",
    "board_specs",
    "default_board_devices",
    "resolve_board_spec",
]

log = logging.getLogger("hetsched.devices")

_GPU_SPECS = ("gpu", "gpu:0")
_NPU_SOCS = ("rk3588",)
_MALI_SOCS = ("rk3588",)
"""SoCs whose GPU a real board runs only through ncnn (no other backend targets the Mali)."""


def board_soc(fs: SysfsRoot) -> str | None:
    """The twin profile name of the board whose tree is under ``fs``, or None for the host's
    ``/`` and for a tree that names no SoC hetsched knows."""
    if fs.is_host_root:
        return None
    return soc.identify_soc(soc.read_compatible(fs), fs.read_text("etc/nv_tegra_release"))


@dataclass(frozen=True)
class BoardRoot:
    """A board root's devices: the twin's simulated ones and, on an RK3588, the RKNN NPU's maker."""

    soc: str
    root: str
    twins: tuple[Device, ...]
    npu: Callable[[str], Device] | None
    """``spec -> Device`` of the RKNN backend (None: the board has no NPU the backend targets)."""
    label: str = ""
    """How messages name the board's origin (default: ``under '<root>'``)."""

    @property
    def where(self) -> str:
        return self.label or f"under {self.root!r}"

    @property
    def clusters(self) -> list[Device]:
        return [d for d in self.twins if d.kind == "cpu"]

    @property
    def dla(self) -> list[Device]:
        return [d for d in self.twins if d.kind == "dla"]

    def named(self) -> dict[str, Device]:
        """The twin's devices by device name and by domain name, the twin's own NPU left out
        (on a board root ``npu`` is the RKNN backend's)."""
        out: dict[str, Device] = {}
        for d in self.twins:
            if d.kind == "npu":
                continue
            out[d.name] = d
            if d.domain:
                out.setdefault(d.domain, d)
        return out


TwinDevices = Callable[[str, str, "tuple[int, ...] | None"], Sequence[Device]]
"""``(soc, root, host CPUs) -> devices``: a board root's simulated devices at its tree's clocks."""


def _twins(soc_name: str, root: str, host: tuple[int, ...] | None) -> Sequence[Device]:
    from .._estimators import board_twin_devices  # the one place a root's devices meet the twin

    return board_twin_devices(soc_name, root, host=host)


def board_root(fs: SysfsRoot, *, host: Sequence[int] | None = None,
               npu: Callable[[str, SysfsRoot], Device] | None = None,
               twins: TwinDevices = _twins) -> BoardRoot | None:
    """The board under ``fs`` (None: not a board root, see :func:`board_soc`).

    :param host: host CPUs the twin's stages run on (default: every CPU this process may use).
    :param npu: ``(spec, fs) -> Device`` making the RKNN NPU device (the resolver's).
    :param twins: the board's simulated devices (default: the twin's, through ``_estimators``).
    """
    name = board_soc(fs)
    if name is None:
        return None
    found = tuple(twins(name, str(fs.root), tuple(host) if host else None))
    make = None
    if npu is not None and name in _NPU_SOCS:
        make_npu = npu

        def make(spec: str) -> Device:
            return make_npu(spec, fs)

    return BoardRoot(soc=name, root=str(fs.root), twins=found, npu=make)


def board_specs(board: BoardRoot, npu_specs: Sequence[str] = ()) -> list[str]:
    """Every spec the board accepts (besides ``cpu:LIST``), for error messages and ``--help``."""
    roles = {d.options.get("role") for d in board.clusters}
    out = ["clusters", "cpu", *(r for r in ("big", "little", "mid") if r in roles or (r != "mid" and roles == {"cpu"}))]
    if any(d.kind == "gpu" for d in board.twins):
        out.extend((*_GPU_SPECS, "gpu:ncnn"))
    if board.npu is not None:
        out.extend(npu_specs)
    dla = board.dla
    if dla:
        out.append("dla")
        out.extend(d.name for d in dla)
    out.extend(n for n in board.named() if n not in out)
    return out


def _npu_note(board: BoardRoot) -> str | None:
    if board.npu is None:
        return None
    from .._rknn.env import toolkit_unavailable_reason

    reason = toolkit_unavailable_reason()
    if reason is None:
        return None
    return f"npu: left out of the {board.soc} board's default devices: {reason}"


def _gpu_note(board: BoardRoot) -> str | None:
    """Why the board's GPU is not a default device (None: it is, or the board has none)."""
    if board.soc not in _MALI_SOCS or not any(d.kind == "gpu" for d in board.twins):
        return None
    from hetsched.backends._ncnn_devices import mali_note

    return mali_note(board.soc)


def board_device_notes(root: str | os.PathLike[str] | SysfsRoot) -> list[str]:
    """What the default device list of the board under ``root`` leaves out, and why: the RK3588
    NPU when the RKNN toolkit environment is missing, its Mali GPU without ncnn on a hardware Vulkan
    driver (a real board has no other backend for it); on a real Jetson Orin (the host's ``/``)
    the GPU and DLA cores when the ``tensorrt`` backend cannot run
    (:func:`~hetsched._devices.jetson.jetson_device_notes`). Empty for any other root,
    and when nothing is left out."""
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    board = board_root(fs, npu=lambda _spec, _fs: Device(name="npu"))
    if board is None:
        from .jetson import jetson_device_notes

        return jetson_device_notes(fs)
    return [note for note in (_gpu_note(board), _npu_note(board)) if note]


def default_board_devices(board: BoardRoot) -> list[Device]:
    """Every cluster, the GPU (the RK3588's Mali only where ncnn runs it), the NPU (when its
    toolkit exists) and the DLA cores."""
    gpu_note = _gpu_note(board)
    if gpu_note is not None:
        log.warning("%s", gpu_note)
    out = [*board.clusters, *(d for d in board.twins if d.kind == "gpu" and gpu_note is None)]
    if board.npu is not None:
        note = _npu_note(board)
        if note is None:
            out.append(board.npu("npu"))
        else:
            log.warning("%s", note)
    out.extend(board.dla)
    return out


def resolve_board_spec(spec: str, s: str, board: BoardRoot, npu_specs: Sequence[str]) -> list[Device]:
    """The devices of one spec (``s``: stripped, lower case) on ``board``; ``cpu:LIST`` is the caller's.

    :raises DeviceSpecError: the board has no such device; the message lists its specs.
    """
    clusters = board.clusters
    if s in ("clusters", "cpu"):
        chosen = clusters
    elif s in ("big", "little", "mid"):
        chosen = [d for d in clusters if d.options.get("role") == s]
        if not chosen and s != "mid" and all(d.options.get("role") == "cpu" for d in clusters):
            chosen = clusters  # clusters all alike: each is both big and little
    elif s in _GPU_SPECS:
        chosen = [d for d in board.twins if d.kind == "gpu"]
    elif s == "gpu:ncnn":  # the twin's GPU computed by ncnn on this host's Vulkan device, its time modelled
        from hetsched.backends._ncnn_devices import ncnn_gpu_device

        chosen = [ncnn_gpu_device(spec, base=d) for d in board.twins if d.kind == "gpu"]
    elif s == "dla":
        chosen = board.dla
    elif s in npu_specs:
        chosen = [board.npu(s)] if board.npu is not None else []
    else:
        hit = board.named().get(s)
        chosen = [hit] if hit is not None else []
    if not chosen:
        raise DeviceSpecError(
            f"device spec {spec!r}: the {board.soc} board {board.where} has no such device; its specs: "
            f"{', '.join(board_specs(board, npu_specs))}, or cpu:N, cpu:N-M (host cores)"
        )
    return chosen
