"""The GPU and DLA cores of a real Jetson Orin (the host's ``/``, not a twin's tree).

Specs (:func:`jetson_gpu_devices`): ``gpu`` / ``gpu:0`` (the Orin's one GPU), ``dla`` (every DLA
core), ``dla:N``; each with ``:ort`` appended (``gpu:ort``, ``dla:0:ort``) for onnxruntime's
TensorRT/CUDA providers (backend ``ort-gpu``) instead of the native ``tensorrt`` backend.

DLA cores are counted from the board's platform devices (``sys/bus/platform/devices/*.nvdlaN``)
or, where readable, the debugfs engine clocks jtop reads (``sys/kernel/debug/clk/dlaN_core``);
with neither, from NVIDIA's module data: AGX Orin and Orin NX 16GB two, Orin Nano none
(https://developer.nvidia.com/embedded/jetson-modules; the NX 8GB has one, which the platform
devices tell).

Default devices (:func:`default_host_specs`, for ``resolve_devices(None)`` on ``/``): on a
real Orin every CPU cluster, and the GPU and every DLA core only when the ``tensorrt`` backend can
run here (TensorRT's bindings and cuda-python import and CUDA answers) *and* they are opted in
(``HETSCHED_ORIN_GPU_DEFAULT=1``; named specs always work): this project's TensorRT path has
never run on a GPU. On a real RK3588 the clusters and its Mali GPU (``gpu``, through ncnn) when
ncnn finds a hardware Vulkan device. Otherwise the clusters only,
and :func:`jetson_device_notes` says why the GPU and DLA cores were left out, as the RK3588 NPU
is left out without its toolkit (a ``hetsched.devices`` log warning is written too).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from hetsched.backends import Device

from .._errors import DeviceSpecError
from .._platform import devfreq, soc
from .._platform._fs import SysfsRoot

__all__ = ["GPU_DEFAULT_ENV", "JETSON_GPU_SOCS", "NEVER_RUN", "default_host_specs", "dla_core_count", "is_gpu_spec", "jetson_device_notes",
           "jetson_gpu_devices", "jetson_soc"]

log = logging.getLogger("hetsched.devices")

JETSON_GPU_SOCS = ("orin-agx", "orin-nx", "orin-nano")

_SPEC_RE = re.compile(r"(?P<kind>gpu|dla)(?::(?P<index>\d+))?(?P<ort>:ort)?")
_MODULE_DLA_CORES = {"orin-agx": 2, "orin-nx": 2, "orin-nano": 0}
_PLATFORM_DEVICES = "sys/bus/platform/devices"
_DEBUG_CLK = "sys/kernel/debug/clk"
_MAX_DLA = 8

# Priors of the analytic cost model, replaced by measured stage times: CUDA cores per module
# (AGX Orin 64GB 2048, Orin NX 16GB 1024, Orin Nano 8GB 1024) at 2 fp32 FLOPs per core per clock
# (one fused multiply-add), and a DLA core at half the modules' DLA/GPU sparse-INT8 ratio
# (AGX Orin 64GB: 105 DLA TOPS over two cores, 170 GPU TOPS), both from
# https://developer.nvidia.com/embedded/jetson-modules. 1 GHz is assumed where devfreq gives no clock.
_CUDA_CORES = {"orin-agx": 2048, "orin-nx": 1024, "orin-nano": 1024}
_DLA_PER_GPU = 105.0 / 170.0 / 2
_DEFAULT_GPU_HZ = 1_000_000_000
_MEM_BW = 1.0e10


def is_gpu_spec(s: str) -> bool:
    """``s`` (stripped, lower case) names a GPU or DLA device (well formed or not)."""
    return s in ("gpu", "dla") or s.startswith(("gpu:", "dla:"))


def dla_core_count(fs: SysfsRoot, soc_name: str) -> int:
    """The DLA cores of the Orin under ``fs`` (see the module docstring for where they are counted)."""
    found: set[int] = set()
    for entry in fs.listdir(_PLATFORM_DEVICES) if fs.is_dir(_PLATFORM_DEVICES) else []:
        m = re.search(r"\.nvdla(\d+)$", entry)
        if m:
            found.add(int(m.group(1)))
    for n in range(_MAX_DLA):
        if fs.exists(f"{_DEBUG_CLK}/dla{n}_core"):
            found.add(n)
    if found:
        return max(found) + 1
    return _MODULE_DLA_CORES.get(soc_name, 0)


def _specs_of(dla: int) -> str:
    cores = [f"dla:{n}" for n in range(dla)]
    base = ["gpu", "gpu:0", *(["dla", *cores] if dla else [])]
    return ", ".join([*base, *(f"{b}:ort" for b in base)])


def jetson_gpu_devices(spec: str, s: str, fs: SysfsRoot) -> list[Device]:
    """The devices of a GPU/DLA spec (``s``: stripped, lower case) on the real board under ``fs``.

    :raises DeviceSpecError: malformed spec, the board is not a Jetson Orin (on an RK3588 the
        Mali GPU has no backend), or it lacks the GPU index / DLA core named (the message lists
        the specs it has).
    """
    m = _SPEC_RE.fullmatch(s)
    if m is None:
        raise DeviceSpecError(f"device spec {spec!r}: expected gpu, gpu:0, dla, dla:N, each optionally with "
                              "':ort' (onnxruntime's GPU providers)")
    compatible = soc.read_compatible(fs)
    soc_name = soc.identify_soc(compatible, fs.read_text("etc/nv_tegra_release"))
    if soc_name not in JETSON_GPU_SOCS:
        if soc_name == "rk3588" and m.group("kind") == "gpu" and m.group("index") in (None, "0") and not m.group("ort"):
            from hetsched.backends._ncnn_devices import ncnn_gpu_device

            return [ncnn_gpu_device(spec, soc=soc_name)]  # the Mali-G610 through ncnn over Vulkan
        if soc_name == "rk3588":
            raise DeviceSpecError(f"device spec {spec!r}: the RK3588 has one GPU, its Mali (gpu, through ncnn) "
                                  "and no DLA; its NPU is 'npu'")
        raise DeviceSpecError(
            f"device spec {spec!r}: no Jetson Orin under {str(fs.root)!r} (looked for a tegra234 device-tree "
            f"compatible with an Orin module number and etc/nv_tegra_release; found {soc_name or 'neither'}); "
            "GPU and DLA devices need a Jetson Orin, or a twin's root for simulated ones"
        )
    dla = dla_core_count(fs, soc_name)
    backend = "ort-gpu" if m.group("ort") else "tensorrt"
    suffix = ":ort" if m.group("ort") else ""
    index = int(m.group("index")) if m.group("index") is not None else None
    nodes = [d for d in devfreq.read_devices(fs) if d.kind == "gpu"]
    gpu_hz = nodes[0].max_hz if nodes and nodes[0].max_hz else None
    gpu_peak = 2.0 * _CUDA_CORES[soc_name] * (gpu_hz or _DEFAULT_GPU_HZ)
    if m.group("kind") == "gpu":
        if index not in (None, 0):
            raise DeviceSpecError(f"device spec {spec!r}: the {soc_name} board has one GPU (gpu:0); its specs: "
                                  f"{_specs_of(dla)}")
        return [Device(
            name=f"gpu{suffix}", kind="gpu", backend=backend,
            memory_domain="host",  # Jetson's unified memory: the GPU maps the pool's pinned host buffers
            domain="gpu", max_freq_khz=gpu_hz // 1000 if gpu_hz else None, peak_flops=gpu_peak,
            mem_bandwidth=_MEM_BW, options={"device_id": 0, "soc": soc_name},
        )]
    cores = range(dla) if index is None else [index]
    if not dla or (index is not None and index >= dla):
        has = f"{dla} DLA core{'s' if dla != 1 else ''}" + (f" ({', '.join(f'dla:{n}' for n in range(dla))})" if dla else "")
        raise DeviceSpecError(f"device spec {spec!r}: the {soc_name} board under {str(fs.root)!r} has {has}; "
                              f"its specs: {_specs_of(dla)}")
    return [
        Device(
            name=f"dla:{n}{suffix}", kind="dla", backend=backend, memory_domain="host", domain=f"dla{n}",
            peak_flops=gpu_peak * _DLA_PER_GPU, mem_bandwidth=_MEM_BW,
            options={"device_id": 0, "dla_core": n, "soc": soc_name},
        )
        for n in cores
    ]


def jetson_soc(fs: SysfsRoot) -> str | None:
    """The Orin module under ``fs`` (``orin-agx``, ``orin-nx``, ``orin-nano``) when ``fs`` is a real
    board's root (the host's ``/``), else None (another SoC, or a twin's tree)."""
    if not fs.is_host_root:
        return None
    name = soc.identify_soc(soc.read_compatible(fs), fs.read_text("etc/nv_tegra_release"))
    return name if name in JETSON_GPU_SOCS else None


def _is_real_rk3588(fs: SysfsRoot) -> bool:
    return fs.is_host_root and soc.identify_soc(soc.read_compatible(fs), fs.read_text("etc/nv_tegra_release")) == "rk3588"


def _mali_notes(fs: SysfsRoot) -> list[str]:
    """On a real RK3588 (the host's ``/``): why its Mali GPU is left out of the default devices."""
    if not _is_real_rk3588(fs):
        return []
    from hetsched.backends._ncnn_devices import mali_note

    note = mali_note()
    return [note] if note else []


GPU_DEFAULT_ENV = "HETSCHED_ORIN_GPU_DEFAULT"
"""Set to ``1`` to put a real Orin's GPU and DLA cores into its default devices when TensorRT can run."""

NEVER_RUN = (f"opt-in until this project's TensorRT path has run on a GPU: name them (devices=['gpu', 'dla']) "
             f"or set {GPU_DEFAULT_ENV}=1")


def _tensorrt_reason() -> str | None:
    """Why a real Orin's default devices leave the GPU and DLA out: TensorRT cannot run, or (when it
    can) the path is opt-in, having never run on a GPU (:data:`NEVER_RUN`)."""
    import os

    from hetsched.backends.tensorrt import tensorrt_unavailable_reason

    why = tensorrt_unavailable_reason()
    if why is None and os.environ.get(GPU_DEFAULT_ENV) != "1":
        return NEVER_RUN
    return why


def jetson_device_notes(fs: SysfsRoot, reason: Callable[[], str | None] = _tensorrt_reason) -> list[str]:
    """What a real Orin's default device list leaves out and why: the GPU and the DLA cores when
    the ``tensorrt`` backend cannot run here (``reason``: why not, or None). Empty elsewhere."""
    name = jetson_soc(fs)
    if name is None:
        return _mali_notes(fs)
    why = reason()
    if why is None:
        return []
    dla = dla_core_count(fs, name)
    left = "gpu" + (f" and the DLA core{'s' if dla != 1 else ''} (dla)" if dla else "")
    return [f"{left}: left out of the {name} board's default devices: {why}"]


def default_host_specs(fs: SysfsRoot, reason: Callable[[], str | None] = _tensorrt_reason) -> list[str]:
    """The device specs ``resolve_devices(None)`` means on the host root ``fs``: ``clusters``, and
    on a real Orin ``gpu`` and ``dla`` (when it has DLA cores) too when the ``tensorrt``
    backend can run (``reason`` returns None); when it cannot they are left out and a
    ``hetsched.devices`` warning says why (:func:`jetson_device_notes`)."""
    name = jetson_soc(fs)
    if name is None:
        if not _is_real_rk3588(fs):
            return ["clusters"]
        notes = _mali_notes(fs)
        for note in notes:
            log.warning("%s", note)
        return ["clusters", *([] if notes else ["gpu"])]  # the Mali through ncnn when it can run
    notes = jetson_device_notes(fs, reason)
    if notes:
        for note in notes:
            log.warning("%s", note)
        return ["clusters"]
    return ["clusters", "gpu", *(["dla"] if dla_core_count(fs, name) else [])]
