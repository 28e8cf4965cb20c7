"""``hetsched doctor``'s readers: everything the checks need, read once from a root (thin; no verdicts).

Every file is read through :class:`~hetsched._platform._fs.SysfsRoot`, so nothing outside the
root is opened. What varies is injected: ``sleep``/``clock`` (the telemetry window), ``euid``
(whose write permission is judged), ``alive`` (whether a pid runs), ``sdk`` (what is importable).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import HetschedError, PathOutsideRootError, SysfsPermissionError
from .._governor._knobs import expected_knobs
from .._governor._state_dir import Published, StateDir, decode_knobs, pid_alive
from .._governor._state_walk import RUN_DIR, SAVED_FILE
from .._platform import cpufreq, devfreq, thermal
from .._platform._fs import SysfsRoot
from .._platform.discovery import discover
from .._platform.jetson import EMC_CAP, EMC_DIR
from .._platform.power import find_ina3221
from ._doctor_checks import (
    DomainLimits,
    Finding,
    NcnnState,
    ProbeResult,
    SdkState,
    SensorRead,
    TripRaw,
    ZoneReading,
    check_dead_governor,
    check_freq_limits,
    check_nvpmodel,
    check_permissions,
    check_probe,
    check_sdks,
    check_sensors,
    check_simulated,
    check_thermal,
)

__all__ = ["BoardReading", "findings", "read_board", "read_sdks", "restore_saved_clocks"]

TWIN_DIR = ".hetsched-twin"
"""Exists under a root only while a live twin runs there (its load channel)."""
_UNIT = "nvpmodel.service"
_UNIT_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")
# systemd keeps a link per active unit here (src/core/unit.c, unit_export_invocation_id:
# https://github.com/systemd/systemd/blob/main/src/core/unit.c).
_ACTIVE_DIR = "run/systemd/units"


@dataclass(frozen=True)
class BoardReading:
    root: str
    host_root: bool
    live_twin: bool
    soc: str | None
    jetson: bool
    domains: tuple[DomainLimits, ...] = ()
    zones: tuple[ZoneReading, ...] = ()
    sensors: tuple[SensorRead, ...] = ()
    nvpmodel: Mapping[str, Any] = field(default_factory=dict)
    published: Published = field(default_factory=Published)
    alive: Mapping[int, bool] = field(default_factory=dict)
    changed: tuple[str, ...] = ()
    knobs: Mapping[str, tuple[tuple[str, bool], ...]] = field(default_factory=dict)
    ungovernable: Mapping[str, str] = field(default_factory=dict)
    sdk: SdkState = field(default_factory=lambda: SdkState(None))
    probe: tuple[ProbeResult, ...] | None = None
    unreadable: Mapping[str, str] = field(default_factory=dict)
    """Files that could hold no value (``SysfsRoot.unreadable``): a directory, a link out of the root."""


def _exists(fs: SysfsRoot, rel: str) -> bool:
    """``fs.exists``; a link out of the root is not there (noted as unreadable, never followed)."""
    try:
        return fs.exists(rel)
    except PathOutsideRootError as exc:
        fs.note_unreadable(rel, exc)
        return False


def _writable(fs: SysfsRoot, rel: str, euid: int) -> bool:
    try:
        path = fs.resolve(rel).path
    except PathOutsideRootError as exc:
        fs.note_unreadable(rel, exc)
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    if euid == os.geteuid():
        return os.access(path, os.W_OK)
    if euid == 0:
        return True
    if st.st_uid == euid:
        return bool(st.st_mode & stat.S_IWUSR)
    return bool(st.st_mode & stat.S_IWOTH)


def _domains(fs: SysfsRoot, euid: int) -> tuple[list[DomainLimits], dict[str, tuple[tuple[str, bool], ...]], dict[str, str]]:
    limits: list[DomainLimits] = []
    knobs: dict[str, tuple[tuple[str, bool], ...]] = {}
    skipped: dict[str, str] = {}
    for pol in cpufreq.read_policies(fs):
        if not pol.available_khz:
            skipped[pol.name] = f"{pol.path} has no scaling_available_frequencies"
            continue
        hw = pol.cpuinfo_max_khz or pol.available_khz[-1]
        limits.append(DomainLimits(
            pol.name, pol.path, hw * 1000, None if pol.min_khz is None else pol.min_khz * 1000,
            None if pol.max_khz is None else pol.max_khz * 1000, pol.governor,
            max_path=f"{pol.path}/scaling_max_freq", hw_max_text=str(hw)))
        files = [f"{pol.path}/{k}" for k in ("scaling_governor", "scaling_min_freq", "scaling_max_freq")]
        knobs[pol.name] = tuple((p, _writable(fs, p, euid)) for p in files if _exists(fs, p))
    for dev in devfreq.read_devices(fs):
        if dev.kind not in ("gpu", "npu", "memory") or dev.kind in knobs:
            continue
        if not dev.available_hz:
            skipped[dev.kind] = f"{dev.path} has no available_frequencies"
            continue
        limits.append(DomainLimits(dev.kind, dev.path, dev.available_hz[-1], dev.min_hz, dev.max_hz, dev.governor,
                                   max_path=f"{dev.path}/max_freq", hw_max_text=str(dev.available_hz[-1])))
        files = [f"{dev.path}/{k}" for k in ("governor", "min_freq", "max_freq")]
        knobs[dev.kind] = tuple((p, _writable(fs, p, euid)) for p in files if _exists(fs, p))
    if "memory" not in knobs and _exists(fs, f"{EMC_DIR}/rate"):
        emc_hw = fs.read_int(f"{EMC_DIR}/max_rate")
        cap = fs.read_int(EMC_CAP) or None
        limits.append(DomainLimits(
            "memory", EMC_DIR, emc_hw, fs.read_int(f"{EMC_DIR}/min_rate"), min(cap, emc_hw) if cap and emc_hw else emc_hw, "bpmp",
            max_path=EMC_CAP if cap else f"{EMC_DIR}/max_rate", hw_max_text="0",
            locked_flag=fs.read_int(f"{EMC_DIR}/mrq_rate_locked") == 1))
        files = [f"{EMC_DIR}/mrq_rate_locked", f"{EMC_DIR}/rate"]
        knobs["memory"] = tuple((p, _writable(fs, p, euid)) for p in files)
    return limits, knobs, skipped


def _read_raw(fs: SysfsRoot, rel: str) -> str | None:
    """Raw text; ``""`` for an empty or flaky read; None when absent. Raises SysfsPermissionError."""
    data = fs.read_bytes(rel)
    if data is None:
        return "" if _exists(fs, rel) else None
    return data.decode("utf-8", "replace")


def _sensor_paths(fs: SysfsRoot, zones: list[thermal.ThermalZone]) -> list[tuple[str, Any]]:
    paths: list[tuple[str, Any]] = [(f"{z.path}/temp", "temp") for z in zones]
    for rail in find_ina3221(fs):
        paths += [(p, k) for p, k in ((rail.voltage_path, "mV"), (rail.current_path, "mA")) if p]
    for pol in cpufreq.read_policies(fs):
        paths.append((f"{pol.path}/scaling_cur_freq", "kHz"))
    for dev in devfreq.read_devices(fs):
        paths.append((f"{dev.path}/cur_freq", "Hz"))
    return paths


def _window(fs: SysfsRoot, paths: list[tuple[str, Any]], *, window_s: float, interval_s: float,
            sleep: Callable[[float], None], clock: Callable[[], float]) -> tuple[list[float], dict[str, list[str | None]], set[str]]:
    n = 1 if window_s <= 0 else max(2, int(window_s / interval_s) + 1)
    times: list[float] = []
    reads: dict[str, list[str | None]] = {p: [] for p, _ in paths}
    denied: set[str] = set()
    for i in range(n):
        if i:
            sleep(window_s / (n - 1))
        times.append(clock())
        for p, _ in paths:
            if p in denied:
                continue
            try:
                reads[p].append(_read_raw(fs, p))
            except SysfsPermissionError:
                denied.add(p)
    return times, reads, denied


def _temp(raw: str | None) -> float | None:
    return thermal.parse_temp_c(raw) if raw else None


def _nvpmodel(fs: SysfsRoot) -> dict[str, Any]:
    unit = next((f"{d}/{_UNIT}" for d in _UNIT_DIRS if fs.exists(f"{d}/{_UNIT}")), None)
    wants = [e for e in fs.listdir("etc/systemd/system") if e.endswith(".wants")]
    enabled = any(_UNIT in fs.listdir(f"etc/systemd/system/{w}") for w in wants)
    running = f"invocation:{_UNIT}" in fs.listdir(_ACTIVE_DIR)
    status = fs.read_str("var/lib/nvpmodel/status") or ""
    mode = next((tok.split(":", 1)[1].lstrip("0") or "0" for tok in status.split() if tok.startswith("pmode:")), None)
    return {"unit_file": unit, "enabled": enabled, "running": running, "mode": mode}


def read_sdks() -> SdkState:
    """What is importable in this interpreter (the vendor SDKs are looked up, not imported)."""
    version: str | None = None
    providers: tuple[str, ...] = ()
    try:
        import onnxruntime

        version = str(onnxruntime.__version__)
        providers = tuple(onnxruntime.get_available_providers())
    except ImportError:
        pass
    from .._rknn.env import find_toolkit_python

    toolkit: str | None = None
    try:
        find_toolkit_python()
    except HetschedError as exc:
        toolkit = str(exc)
    return SdkState(version, providers, rknn_lite=importlib.util.find_spec("rknnlite") is not None,
                    rknn_toolkit=toolkit, tensorrt=importlib.util.find_spec("tensorrt") is not None,
                    ncnn=read_ncnn())


def read_ncnn() -> NcnnState:
    """ncnn and the Vulkan devices it finds (ncnn is imported: it starts Vulkan once)."""
    from hetsched.backends._ncnn_convert import ncnn_unavailable_reason, vulkan_devices
    from hetsched.backends._ncnn_devices import hardware_reason

    return NcnnState(ncnn_unavailable_reason(), hardware_reason(), tuple(d.describe() for d in vulkan_devices()))


def _probe(fs: SysfsRoot, *, settle_s: float, sleep: Callable[[float], None],
           clock: Callable[[], float]) -> tuple[ProbeResult, ...]:
    from .._governor._sysfs import SysfsPort

    # It only looks: a dead governor's saved clocks are reported, not restored behind the user's back.
    port = SysfsPort(fs, clock=clock, sleep=sleep, settle_s=settle_s, recover=False)
    try:
        return _probe_domains(port)
    finally:
        port.release_lock()  # the last save() (the read-back check) took the root's lock again


def _probe_domains(port: Any) -> tuple[ProbeResult, ...]:
    out = []
    for name, spec in port.domains().items():
        saved = port.save()
        wrote: int | None = None
        try:
            cur = port.read(name)
            # The lowest frequency is the harmless one (less power, briefly slower); the next one
            # up when the domain already runs there, so that the write is a visible change.
            options = [hz for hz in spec.available_hz if hz != cur] or list(spec.available_hz)
            wrote = options[0]
            port.write(name, wrote)
            got = port.read(name)
            error = None
        except HetschedError as exc:
            got, error = None, str(exc)
        try:
            port.restore(saved)
            # Files absent when saved (a userspace set_freq) go once the kernel's governor is back.
            now = port.save()[name]
            restored = all(v is None or now.get(k) == v for k, v in saved[name].items())
        except HetschedError:
            restored = False
        out.append(ProbeResult(name, wrote, got, restored, error))
    return tuple(out)


def read_board(
    root: str | os.PathLike[str] = "/",
    *,
    window_s: float = 3.0,
    interval_s: float = 0.25,
    probe: bool = False,
    probe_settle_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    euid: int | None = None,
    alive: Callable[[int], bool] = pid_alive,
    sdk: SdkState | None = None,
) -> BoardReading:
    """Read everything the checks need from ``root``.

    :raises SysfsError: ``root`` is not a directory.
    :raises SysfsPermissionError: the clock or thermal directories cannot be listed at all.
    """
    fs = SysfsRoot(root)
    platform = discover(fs)
    uid = os.geteuid() if euid is None else euid
    limits, knobs, skipped = _domains(fs, uid)
    zones = thermal.read_zones(fs)
    paths = _sensor_paths(fs, zones)
    times, reads, denied = _window(fs, paths, window_s=window_s, interval_s=interval_s, sleep=sleep, clock=clock)
    t0 = times[0]
    zone_readings = []
    for z in zones:
        series = tuple((t - t0, _temp(r)) for t, r in zip(times, reads[f"{z.path}/temp"], strict=False))
        trips = tuple(
            TripRaw(int(e[11:-5]), fs.read_str(f"{z.path}/{e[:-5]}_type") or "unknown",
                    fs.read_text(f"{z.path}/{e}"), f"{z.path}/{e}")
            for e in fs.listdir(z.path) if e.startswith("trip_point_") and e.endswith("_temp") and e[11:-5].isdigit()
        )
        zone_readings.append(ZoneReading(z.type, z.path, series, tuple(sorted(trips, key=lambda t: t.index))))
    sensors = tuple(SensorRead(p, k, tuple(reads[p]), p in denied) for p, k in paths)
    state_dir = StateDir(fs)
    published = state_dir.read()
    pids = {p for p in (published.pid("state"), published.pid("saved")) if p is not None}
    changed: list[str] = []
    if published.saved is not None:
        try:
            for knobs_of in decode_knobs(published.saved.get("knobs", {})).values():
                changed += [p for p, v in expected_knobs(knobs_of).items() if fs.read_bytes(p) != v]
        except (ValueError, HetschedError):
            pass
    alive_of = {p: alive(p) for p in pids}
    saved_pid = published.pid("saved")
    if alive is pid_alive and published.saved is not None and saved_pid is not None:
        # By the governor lock where the file was written under one: a pid may be reused.
        alive_of[saved_pid] = state_dir.saved_owner_alive(published.saved)[0]
    jetson = platform.jetpack is not None or (platform.soc or "").startswith("orin")
    return BoardReading(
        root=str(fs.root), host_root=fs.is_host_root, live_twin=fs.is_dir(TWIN_DIR), soc=platform.soc,
        jetson=jetson, domains=tuple(limits), zones=tuple(zone_readings), sensors=sensors,
        nvpmodel=_nvpmodel(fs), published=published, alive=alive_of, changed=tuple(changed),
        knobs=knobs, ungovernable=skipped, sdk=sdk if sdk is not None else read_sdks(),
        probe=_probe(fs, settle_s=probe_settle_s, sleep=sleep, clock=clock) if probe else None,
        unreadable=fs.unreadable(),
    )


def findings(r: BoardReading) -> list[Finding]:
    """Every check over one reading, in the order ``hetsched doctor`` prints them."""
    simulated = r.live_twin or not r.host_root
    alive_pid = next((p for p, a in r.alive.items() if a), None)
    governed = r.published.targets if alive_pid is not None and r.published.state is not None else None
    out = check_simulated(host_root=r.host_root, live_twin=r.live_twin, root=r.root)
    out += check_freq_limits(r.domains, governed=governed, jetson=r.jetson)
    if r.probe is not None:
        out += check_probe(r.probe)
    out += check_nvpmodel(jetson=r.jetson, **r.nvpmodel)
    out += check_thermal(r.zones)
    out += check_sensors(r.sensors, r.unreadable)
    out += check_dead_governor(state=r.published.state, saved=r.published.saved, alive=r.alive, changed=r.changed,
                               errors=r.published.errors, saved_path=f"{RUN_DIR}/{SAVED_FILE}")
    out += check_permissions(r.knobs, governable=r.ungovernable)
    out += check_sdks(r.soc, r.sdk, simulated=simulated)
    return out


def restore_saved_clocks(root: str | os.PathLike[str], *, alive: Callable[[int], bool] | None = None) -> list[str]:
    """Write back the knobs a hetsched governor that died saved (``--restore-clocks``); returns the
    files written. The same restore as ``hetsched restore``
    (:meth:`hetsched._governor._state_dir.StateDir.restore_saved`): every knob tried, in the order the kernel
    accepts; the saved file is removed once every knob reads back as saved.

    :raises PlatformError: no saved file, it is malformed, or its governor still runs (it
        restores them itself).
    :raises SysfsError: some knobs could not be put back (the message names each).
    """
    from .._errors import PlatformError, SysfsError
    out = StateDir(SysfsRoot(root)).restore_saved(alive=alive)
    if out.status == "partial":
        raise SysfsError(errno.EIO, out.message)
    if out.status != "restored":
        raise PlatformError(out.message)
    return list(out.written)
