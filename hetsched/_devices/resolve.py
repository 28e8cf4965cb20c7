"""Device specs (``"cpu:0-3"``, ``"big"``, ``"npu:0-1"``) and the host's CPU clusters from sysfs.

On a board root (a twin's tree: see :mod:`hetsched._devices.board`) the specs name the
board's devices instead; on the host's ``/`` they name its cores (and an RK3588's NPU).

This package sits above the planner, the backends and the board models: it asks backends
whether they can run here (the RKNN toolkit, TensorRT, ncnn's Vulkan devices) and gets a board
root's simulated devices from :mod:`hetsched._estimators`, the one place where a root's devices
meet the twin. The planner only ever sees the :class:`Device` objects it returns.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hetsched.backends import Device

from .._errors import DeviceSpecError
from .._platform import devfreq, rknpu, soc
from .._platform._fs import SysfsRoot
from .._platform.affinity import host_cpus
from .._platform.cpufreq import CPU_DIR
from .._platform.discovery import read_clusters
from .board import (
    BoardRoot,
    board_device_notes,
    board_root,
    board_specs,
    default_board_devices,
    resolve_board_spec,
)
from .jetson import default_host_specs, is_gpu_spec, jetson_gpu_devices

__all__ = [
    "NPU_SPECS",
    "CpuCluster",
    "board_device_notes",
    "discover_cpu_clusters",
    "host_cpus",
    "parse_cpulist",
    "resolve_devices",
]

# Priors of the analytic cost model, not measurements: planning only compares devices with
# them, and measured stage times (CostTable) replace them. 8 fp32 FLOPs per cycle is one
# 128-bit fused multiply-add pipe (4 lanes x 2 FLOPs; Arm Neon programmer's guide:
# https://developer.arm.com/documentation/den0018/latest); a clock and a bandwidth are assumed
# where sysfs gives none.
_FLOPS_PER_CYCLE = 8.0
_DEFAULT_FREQ_KHZ = 2_000_000
_MEM_BW_PER_DEVICE = 1.0e10


#: RK3588 NPU device specs -> the NPU cores they run on (``()``: the runtime picks, NPU_CORE_AUTO).
NPU_SPECS: dict[str, tuple[int, ...]] = {
    "npu": (), "npu:0": (0,), "npu:1": (1,), "npu:2": (2,), "npu:0-1": (0, 1), "npu:0-2": (0, 1, 2),
}
# A prior like _FLOPS_PER_CYCLE, replaced by measured stage times: 6 TOPS (int8) over the RK3588
# NPU's three cores (Rockchip RK3588 product brief, https://www.rock-chips.com/a/en/products/RK35_Series/2022/0926/1660.html),
# fp16 assumed at a quarter of the int8 rate.
_NPU_FP16_FLOPS_PER_CORE = 6.0e12 / 3 / 4
_NPU_SOCS = ("rk3588",)
_NPU_LOOKED_FOR = (
    f"a devfreq node named *.npu or with of_node 'npu' under {devfreq.DEVFREQ_CLASS}, the rknpu driver "
    f"(sys/module/rknpu, {', '.join(rknpu.NPU_LOAD_PATHS)}) and an RK3588 device-tree compatible"
)


def _npu_device(spec: str, fs: SysfsRoot) -> Device:
    """The RK3588 NPU device of ``spec`` (a key of :data:`NPU_SPECS`) on the board under ``fs``.

    On a tree that is not the host's ``/`` (a twin's root) the device also carries the twin's
    NPU profile domain and clock, so the stage's time and energy are modelled as for the twin.

    :raises DeviceSpecError: no NPU under the root (the message says what was looked for), or an
        NPU on a SoC the RKNN backend has no target for.
    """
    nodes = [d for d in devfreq.read_devices(fs) if d.kind == "npu"]
    has_driver = fs.exists("sys/module/rknpu") or any(fs.exists(p) for p in rknpu.NPU_LOAD_PATHS)
    soc_name = soc.identify_soc(soc.read_compatible(fs), fs.read_text("etc/nv_tegra_release"))
    if not nodes and not has_driver:
        raise DeviceSpecError(f"device spec {spec!r}: no NPU found under {str(fs.root)!r}: looked for {_NPU_LOOKED_FOR}")
    if soc_name not in _NPU_SOCS:
        raise DeviceSpecError(f"device spec {spec!r}: found an NPU under {str(fs.root)!r} but the SoC is "
                              f"{soc_name or 'unknown'}; the RKNN backend targets {', '.join(_NPU_SOCS)}")
    cores = NPU_SPECS[spec]
    mask = 0
    for c in cores:
        mask |= 1 << c  # rknn-toolkit-lite2's NPU_CORE_* values (0 = NPU_CORE_AUTO)
    max_hz = nodes[0].max_freq_hz if nodes else None
    options: dict[str, object] = {"core_mask": mask, "target": soc_name, "cores": cores, "soc": soc_name}
    peak = _NPU_FP16_FLOPS_PER_CORE * max(1, len(cores))
    bandwidth = _MEM_BW_PER_DEVICE
    if not fs.is_host_root:
        # the tree is a twin's (or a capture's): model the stage on the twin's NPU at the tree's clocks
        from .._estimators import board_twin_devices

        twin = next((d for d in board_twin_devices(soc_name, str(fs.root), root_bound=False) if d.kind == "npu"),
                    None)
        if twin is not None:
            options.update({k: twin.options[k] for k in ("clock", "profile_domain", "memory_domain_profile")})
            options["simulated"] = True
            peak = twin.peak_flops * max(1, len(cores)) / len(NPU_SPECS["npu:0-2"])
            bandwidth = twin.mem_bandwidth
    return Device(
        name=spec,
        kind="npu",
        backend="rknn",
        memory_domain="host",  # the NPU reads DRAM: pool buffers (memfds) are shared with it
        domain="npu",
        max_freq_khz=max_hz // 1000 if max_hz else None,
        peak_flops=peak,
        mem_bandwidth=bandwidth,
        options=options,
    )


def _board_spec(spec: str, s: str, board: BoardRoot, fs: SysfsRoot) -> list[Device]:
    """``spec`` on a board root; an NPU spec on a board without one says what was looked for."""
    if s in NPU_SPECS and board.npu is None:
        try:
            _npu_device(s, fs)
        except DeviceSpecError as exc:
            raise DeviceSpecError(f"{exc}; the {board.soc} board's specs: {', '.join(board_specs(board))}") from exc
    return resolve_board_spec(spec, s, board, tuple(NPU_SPECS))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist (``"0-3,6 8"``) into sorted unique CPU numbers.

    :raises DeviceSpecError: malformed list.
    """
    cpus: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise DeviceSpecError(f"bad CPU list {text!r}: {part!r} is not N or N-M")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise DeviceSpecError(f"bad CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Sequence[int]) -> str:
    out: list[str] = []
    cpus = sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class CpuCluster:
    """CPUs sharing a cpufreq policy (one clock domain)."""

    policy: int | None
    cpus: tuple[int, ...]
    capacity: float
    max_freq_khz: int | None
    role: str = "cpu"
    """``"big"``, ``"little"``, ``"mid"`` (ranked by capacity, then max frequency) or ``"cpu"``."""

    @property
    def domain(self) -> str | None:
        return f"cluster{self.policy}" if self.policy is not None else None

    def device(self) -> Device:
        freq = self.max_freq_khz or _DEFAULT_FREQ_KHZ
        per_core = _FLOPS_PER_CYCLE * freq * 1e3 * (self.capacity / 1024.0)
        return Device(
            name=f"cpu:{format_cpulist(self.cpus)}",
            kind="cpu",
            backend="cpu",
            cpus=self.cpus,
            domain=self.domain,
            capacity=self.capacity,
            max_freq_khz=self.max_freq_khz,
            peak_flops=per_core * len(self.cpus),
            mem_bandwidth=_MEM_BW_PER_DEVICE,
            options={"role": self.role},
        )


def _capacity(fs: SysfsRoot, cpu: int) -> float:
    cap = fs.read_int(f"{CPU_DIR}/cpu{cpu}/cpu_capacity")
    return float(cap) if cap is not None and cap >= 0 else 1024.0


def discover_cpu_clusters(root: str | os.PathLike[str] | SysfsRoot = "/") -> list[CpuCluster]:
    """CPU clusters from ``sys/devices/system/cpu`` under ``root``.

    Built on the platform layer's cluster discovery (cpufreq policies and their
    ``related_cpus``, ``cpu_capacity``), keeping online CPUs only; without cpufreq,
    groups online CPUs by ``topology/cluster_id``, else one cluster of all of them (as on
    an x86 host without cpufreq). Missing or unparseable files are absent capabilities.

    :raises SysfsError: ``root`` is not a directory.
    :raises SysfsPermissionError: a cpufreq file may not be read.
    :raises DeviceSpecError: the kernel's ``online`` CPU list is malformed.
    """
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    online_text = fs.read_text(f"{CPU_DIR}/online")
    online = parse_cpulist(online_text) if online_text else (host_cpus() if fs.is_host_root else ())
    clusters: list[CpuCluster] = []
    for info in read_clusters(fs):
        cpus = tuple(c for c in info.cpus if not online or c in online)
        if not cpus:
            continue
        clusters.append(
            CpuCluster(
                policy=info.policy,
                cpus=cpus,
                capacity=float(info.capacity) if info.capacity is not None else 1024.0,
                max_freq_khz=info.cpuinfo_max_khz,
            )
        )
    if not clusters:
        # No cpufreq: group by topology/cluster_id, else one cluster.
        groups: dict[str, list[int]] = {}
        for c in online:
            cid = fs.read_text(f"{CPU_DIR}/cpu{c}/topology/cluster_id")
            groups.setdefault((cid or "0").strip(), []).append(c)
        for _cid, cpus_l in sorted(groups.items()):
            clusters.append(
                CpuCluster(policy=None, cpus=tuple(cpus_l), capacity=_capacity(fs, cpus_l[0]), max_freq_khz=None)
            )
    return _rank(clusters)


def _rank(clusters: list[CpuCluster]) -> list[CpuCluster]:
    if len(clusters) <= 1:
        return clusters
    keys = sorted({(c.capacity, c.max_freq_khz or 0) for c in clusters})
    if len(keys) == 1:
        return clusters
    out = []
    for c in clusters:
        k = (c.capacity, c.max_freq_khz or 0)
        role = "little" if k == keys[0] else "big" if k == keys[-1] else "mid"
        out.append(replace(c, role=role))
    return out


def resolve_devices(
    specs: Iterable[str | Device] | str | Device | None,
    *,
    root: str | os.PathLike[str] | SysfsRoot = "/",
    available_cpus: Sequence[int] | None = None,
) -> list[Device]:
    """Turn device specs into :class:`Device` objects.

    Accepted specs: a ``Device``; ``"cpu"`` (all usable CPUs as one device);
    ``"cpu:0"``, ``"cpu:0-1"``, ``"cpu:4,5"`` (pinned to those cores); ``"big"``,
    ``"little"``, ``"mid"`` (each host cluster of that rank); ``"clusters"`` (every
    host cluster); on an RK3588 ``"npu"``, ``"npu:N"``, ``"npu:0-1"``, ``"npu:0-2"``.
    ``None`` means every host cluster. On a real Jetson Orin (``/``) ``"gpu"``, ``"dla"`` and
    ``"dla:N"`` are its GPU and DLA cores on the ``tensorrt`` backend, with ``":ort"`` appended
    on the ``ort-gpu`` backend (see :mod:`hetsched._devices.jetson`).

    On a board root (``root`` is a tree, not ``/``, whose device tree names a SoC with a twin
    profile) the board's devices are meant instead: ``None`` is every CPU cluster, the GPU,
    the DLA cores and the RK3588 NPU (when the RKNN toolkit exists; :func:`board_device_notes`
    says why it is left out otherwise), and ``cpu``/``clusters``/``big``/``little``/``mid``,
    ``gpu``, ``npu...``, ``dla:N`` and the twin's device names pick some of them (see
    :mod:`hetsched._devices.board`); ``cpu:LIST`` stays the host's cores.
    On a real Jetson Orin's ``/``, ``None`` is the CPU clusters plus ``gpu`` and the DLA cores
    when the TensorRT backend can run (else the clusters, with a logged note).

    :raises DeviceSpecError: unparseable spec, CPUs the host lacks, duplicate names, a spec the
        board under ``root`` lacks (the message lists its specs), or ``gpu``/``dla`` on a real
        board that is not a Jetson Orin or lacks that GPU / DLA core.
    """
    usable = tuple(available_cpus) if available_cpus is not None else host_cpus()
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    board = board_root(fs, host=usable, npu=_npu_device)
    out: list[Device] = []
    clusters = _HostClusters(fs)
    for spec in _spec_list(specs, board, fs):
        if isinstance(spec, Device):
            out.append(spec)
            continue
        if not isinstance(spec, str):
            raise DeviceSpecError(f"device spec must be a string or Device, got {type(spec).__name__}")
        s = spec.strip().lower()
        if board is not None and not s.startswith("cpu:"):
            out.extend(_board_spec(spec, s, board, fs))
        elif s == "gpu:ncnn":  # the host's Vulkan device through ncnn
            from hetsched.backends._ncnn_devices import ncnn_gpu_device

            out.append(ncnn_gpu_device(spec))
        elif is_gpu_spec(s):
            out.extend(jetson_gpu_devices(spec, s, fs))
        elif s in NPU_SPECS:
            out.append(_npu_device(s, fs))
        elif s in ("clusters", "big", "little", "mid"):
            out.extend(_cluster_devices(spec, s, clusters.get(), usable))
        else:
            out.append(_cpu_device(spec, s, usable, clusters))
    _check_names(out)
    return out


def _spec_list(specs: Iterable[str | Device] | str | Device | None, board: BoardRoot | None,
               fs: SysfsRoot) -> Iterable[str | Device]:
    """The specs as an iterable; ``None`` is the board's (or the host's) default devices."""
    if specs is None:
        return default_board_devices(board) if board is not None else default_host_specs(fs)
    return [specs] if isinstance(specs, (str, Device)) else specs


class _HostClusters:
    """The host's CPU clusters under ``fs``, discovered at the first spec that needs them."""

    def __init__(self, fs: SysfsRoot) -> None:
        self._fs = fs
        self._clusters: list[CpuCluster] | None = None

    def get(self) -> list[CpuCluster]:
        if self._clusters is None:
            self._clusters = [c for c in discover_cpu_clusters(self._fs) if c.cpus]
        return self._clusters


def _cluster_devices(spec: str, s: str, clusters: Sequence[CpuCluster], usable: Sequence[int]) -> list[Device]:
    """One device per host cluster of ``s`` (``clusters``, ``big``, ``little``, ``mid``).

    :raises DeviceSpecError: the host has no such cluster, or one has CPUs this process cannot use.
    """
    chosen = [c for c in clusters if s == "clusters" or c.role == s]
    if not chosen and s in ("big", "little") and all(c.role == "cpu" for c in clusters):
        # a homogeneous host (one cluster, or all alike as on a Jetson Orin): each is both big and little
        chosen = list(clusters)
    if not chosen:
        raise DeviceSpecError(f"device spec {spec!r}: the host has no {s} CPU cluster")
    out = []
    for c in chosen:
        dev = c.device()
        missing = [x for x in dev.cpus if x not in usable]
        if missing:
            raise DeviceSpecError(f"device spec {spec!r}: cluster {dev.name} has CPUs {missing} this process cannot use")
        out.append(dev)
    return out


def _spec_cpus(spec: str, s: str, usable: tuple[int, ...]) -> tuple[int, ...]:
    """The cores of ``cpu`` (every usable one) or ``cpu:LIST``.

    :raises DeviceSpecError: an unknown spec, a malformed or empty list, or CPUs the process lacks.
    """
    if s == "cpu":
        cpus = usable
    elif s.startswith("cpu:"):
        try:
            cpus = parse_cpulist(s[4:])
        except DeviceSpecError as exc:
            raise DeviceSpecError(f"device spec {spec!r}: {exc}") from exc
        if not cpus:
            raise DeviceSpecError(f"device spec {spec!r} names no CPUs")
    else:
        raise DeviceSpecError(
            f"unknown device spec {spec!r}: expected 'cpu', 'cpu:N', 'cpu:N-M', 'cpu:N,M', "
            "'big', 'little', 'mid', 'clusters' or (on an RK3588) 'npu', 'npu:N', 'npu:0-1', 'npu:0-2'"
        )
    missing = [c for c in cpus if c not in usable]
    if missing:
        raise DeviceSpecError(
            f"device spec {spec!r} names CPUs {missing} that this host/process lacks (usable: "
            f"{format_cpulist(usable)})"
        )
    return cpus


def _cpu_device(spec: str, s: str, usable: tuple[int, ...], clusters: _HostClusters) -> Device:
    """The device of ``cpu`` or ``cpu:LIST``: those cores, with the clock and capacity of the
    cluster holding them all (the defaults where none does); the spec is checked first."""
    cpus = _spec_cpus(spec, s, usable)
    freq = None
    cap = 1024.0
    dom = None
    for c in clusters.get():
        if set(cpus) <= set(c.cpus):
            freq, cap, dom = c.max_freq_khz, c.capacity, c.domain
    per_core = _FLOPS_PER_CYCLE * (freq or _DEFAULT_FREQ_KHZ) * 1e3 * cap / 1024.0
    return Device(
        name=f"cpu:{format_cpulist(cpus)}",
        kind="cpu",
        backend="cpu",
        cpus=cpus,
        domain=dom,
        capacity=cap,
        max_freq_khz=freq,
        peak_flops=per_core * len(cpus),
        mem_bandwidth=_MEM_BW_PER_DEVICE,
    )


def _check_names(devices: Sequence[Device]) -> None:
    """:raises DeviceSpecError: no devices, or two with one name."""
    names = [d.name for d in devices]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DeviceSpecError(f"duplicate devices: {dupes}")
    if not devices:
        raise DeviceSpecError("no devices given")
