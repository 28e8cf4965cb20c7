"""``hetsched doctor``'s checks: pure functions from what was read (``_doctor_checks_read``) to findings.

Each check returns :class:`Finding` objects: ``check`` (its name), ``status`` (``ok``, ``warn``
or ``fail``), ``subject`` (the domain, zone, file or package concerned), ``message`` and a
``hint`` (how to fix it; empty for ``ok``). Nothing here does I/O, so every check is tested
with readings made up or read from a twin tree with the fault planted.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "DomainLimits",
    "Finding",
    "NcnnState",
    "ProbeResult",
    "SdkState",
    "SensorRead",
    "TripRaw",
    "ZoneReading",
    "check_dead_governor",
    "check_freq_limits",
    "check_nvpmodel",
    "check_permissions",
    "check_probe",
    "check_sdks",
    "check_sensors",
    "check_simulated",
    "check_thermal",
    "oscillation",
]

Status = Literal["ok", "warn", "fail"]

# Plausibility bounds for "garbage" (a value no sensor of these boards can report). Orin's Tj
# shutdown is ~97 C and RK3588's hardware shutdown 120 C (docs: /work reference soc-sysfs.md
# sections 1.4 and 2.4, from the vendor device trees); a zone reading 200 C or -60 C is broken.
_TEMP_MIN_C = -60.0
_TEMP_MAX_C = 200.0
_TRIP_MAX_C = 150.0
_PASSIVE_LOW_C = 40.0
"""A passive trip below this throttles at room temperature: almost surely a mistake."""
_OFFLINE_MILLI = -256000  # what fused-off Orin zones read (tegrastats prints CV0@-256C)


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    subject: str
    message: str
    hint: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _ok(check: str, subject: str, message: str) -> Finding:
    return Finding(check, "ok", subject, message)


def _mhz(hz: int | None) -> str:
    return "?" if hz is None else f"{hz / 1e6:g} MHz"


# -- simulated -----------------------------------------------------------------------------


def check_simulated(*, host_root: bool, live_twin: bool, root: str) -> list[Finding]:
    """Say what the root is. A live twin keeps ``.hetsched-twin/`` under its root while it runs;
    any other root that is not ``/`` is a board tree in a directory (a twin's ``hetsched twin
    --once`` or ``build_board_tree``, or a copy): no kernel answers writes there."""
    if live_twin:
        return [_ok("simulated", root, "simulated: a live SoC twin runs on this root (figures are modelled)")]
    if not host_root:
        return [_ok("simulated", root, "simulated: a board tree in a directory, not the host's /: "
                                       "no kernel acts on it (figures are what the files hold)")]
    return [_ok("simulated", root, "the host's own board (not simulated)")]


# -- frequency caps and locks -----------------------------------------------------------------


@dataclass(frozen=True)
class DomainLimits:
    name: str
    """Domain name (``cluster4``, ``gpu``, ``memory``)."""
    path: str
    """Root-relative directory of its knobs."""
    hw_max_hz: int | None
    """The hardware top (``cpuinfo_max_freq``, the top of the frequency table, EMC ``max_rate``)."""
    min_hz: int | None
    max_hz: int | None
    governor: str | None = None
    max_path: str = ""
    """The file that holds the maximum (``.../scaling_max_freq``, devfreq ``max_freq``, EMC's cap)."""
    hw_max_text: str = ""
    """What to write there to lift a cap (its unit: kHz for cpufreq, Hz otherwise)."""
    locked_flag: bool = False
    """Jetson EMC ``mrq_rate_locked`` = 1."""


def check_freq_limits(
    domains: Sequence[DomainLimits], *, governed: Mapping[str, int] | None = None, jetson: bool = False
) -> list[Finding]:
    """A domain whose maximum is held below its hardware maximum (a cap), or pinned (min = max,
    an EMC rate lock). ``governed``: targets a live hetsched governor publishes (its own holds)."""
    out = []
    for d in domains:
        if governed is not None and d.name in governed:
            out.append(_ok("freq-limits", d.name, f"held at {_mhz(governed[d.name])} by a running hetsched governor"))
            continue
        where = d.max_path or d.path
        if d.max_hz is not None and d.hw_max_hz is not None and d.max_hz < d.hw_max_hz:
            cause = "the nvpmodel power mode sets it; " if jetson else ""
            out.append(Finding(
                "freq-limits", "warn", d.name,
                f"maximum held at {_mhz(d.max_hz)}, below the hardware maximum {_mhz(d.hw_max_hz)} ({where})",
                f"{cause}a thermal/power tool or an earlier run wrote it: write {d.hw_max_text or d.hw_max_hz} "
                f"to {where} (as root) if the cap is not intended"
                + ("; `sudo nvpmodel -m 0` selects MAXN" if jetson else ""),
            ))
        elif d.locked_flag:
            out.append(Finding(
                "freq-limits", "warn", d.name, f"rate locked ({d.path}/mrq_rate_locked = 1) at {_mhz(d.min_hz)}",
                f"jetson_clocks or a governor that died locked it: `sudo jetson_clocks --restore` or "
                f"write 0 to {d.path}/mrq_rate_locked",
            ))
        elif d.min_hz is not None and d.max_hz is not None and d.min_hz == d.max_hz and d.governor != "userspace":
            out.append(Finding(
                "freq-limits", "warn", d.name, f"pinned: minimum = maximum = {_mhz(d.max_hz)} ({d.path})",
                "jetson_clocks or a governor that died copied max into min: `sudo jetson_clocks --restore`, "
                "or write the table's lowest frequency to the minimum",
            ))
        else:
            out.append(_ok("freq-limits", d.name, f"{_mhz(d.min_hz)} - {_mhz(d.max_hz)} of hardware "
                                                  f"{_mhz(d.hw_max_hz)}, governor {d.governor or '-'}"))
    return out


@dataclass(frozen=True)
class ProbeResult:
    domain: str
    wrote_hz: int | None
    read_hz: int | None
    restored: bool
    error: str | None = None


def check_probe(results: Sequence[ProbeResult]) -> list[Finding]:
    """``--probe``: one harmless value written and read back per domain, then restored."""
    out = []
    for r in results:
        if r.error is not None:
            out.append(Finding("probe", "warn", r.domain, f"probe write failed: {r.error}",
                               "see the permissions check; the governor cannot drive this domain"))
        elif r.read_hz != r.wrote_hz:
            out.append(Finding(
                "probe", "warn", r.domain,
                f"writes do not take effect: wrote {_mhz(r.wrote_hz)}, it reads {_mhz(r.read_hz)} (frequency lock)",
                "another agent owns this clock (nvpmodel, a vendor daemon, firmware): stop it, or let the "
                "governor leave the domain alone (it does so once it sees the lock)",
            ))
        else:
            out.append(_ok("probe", r.domain, f"a write of {_mhz(r.wrote_hz)} took effect"))
        if not r.restored:
            out.append(Finding("probe", "fail", r.domain, "the probe could not restore the knobs it changed",
                               "check the domain's governor/min/max files and write the values back by hand"))
    return out


# -- nvpmodel ---------------------------------------------------------------------------------


def check_nvpmodel(*, jetson: bool, unit_file: str | None, enabled: bool, running: bool,
                   mode: str | None) -> list[Finding]:
    """The nvpmodel service re-applies its power mode (clock limits) at boot and on mode changes."""
    if not jetson:
        return []
    subject = "nvpmodel.service"
    mode_txt = f" (mode {mode})" if mode else ""
    if running or enabled:
        state = "running" if running else "enabled"
        return [Finding(
            "nvpmodel", "warn", subject,
            f"the nvpmodel service is {state}{mode_txt}: it re-applies its mode's clock limits over yours",
            "pick the mode first (`sudo nvpmodel -m N`), then `sudo systemctl disable --now nvpmodel` while "
            "you tune clocks by hand; the hetsched governor works inside the mode's limits",
        )]
    if unit_file is not None:
        return [_ok("nvpmodel", subject, f"installed ({unit_file}) but neither enabled nor running{mode_txt}")]
    return [_ok("nvpmodel", subject, f"no nvpmodel service found{mode_txt}")]


# -- thermal ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TripRaw:
    index: int
    type: str
    text: str | None
    """The raw ``trip_point_N_temp`` content."""
    path: str


@dataclass(frozen=True)
class ZoneReading:
    name: str
    """The zone's type (``soc-thermal``)."""
    path: str
    temps: tuple[tuple[float, float | None], ...]
    """(seconds, degrees C or None) over the window."""
    trips: tuple[TripRaw, ...] = ()


def _trip_c(t: TripRaw) -> float | None:
    try:
        return int((t.text or "").strip()) / 1000.0
    except ValueError:
        return None


def oscillation(series: Sequence[tuple[float, float | None]], *, min_swing_c: float = 2.0) -> tuple[int, float, float] | None:
    """Periodic swings in a temperature series: (reversals, mean swing in C, mean period in s), or
    None below three reversals of at least ``min_swing_c`` each (one and a half periods)."""
    pts = [(t, v) for t, v in series if v is not None]
    if len(pts) < 4:
        return None
    turns: list[tuple[float, float]] = []
    lo = hi = ext = pts[0]
    direction = 0  # +1 rising, -1 falling, 0 not known yet
    for t, v in pts[1:]:
        if direction == 0:
            if v - lo[1] >= min_swing_c:
                direction, ext = 1, (t, v)
            elif hi[1] - v >= min_swing_c:
                direction, ext = -1, (t, v)
            else:
                lo = (t, v) if v < lo[1] else lo
                hi = (t, v) if v > hi[1] else hi
        elif (v - ext[1]) * direction >= 0:
            ext = (t, v)  # still going the same way: a new extreme
        elif abs(ext[1] - v) >= min_swing_c:
            turns.append(ext)
            direction, ext = -direction, (t, v)
    if len(turns) < 3:
        return None
    swings = [abs(b[1] - a[1]) for a, b in itertools.pairwise(turns)]
    period = 2 * (turns[-1][0] - turns[0][0]) / (len(turns) - 1)
    return len(turns), sum(swings) / len(swings), period


def check_thermal(zones: Sequence[ZoneReading]) -> list[Finding]:
    """At or above a passive/critical trip, oscillating, or trip points that look wrong."""
    out: list[Finding] = []
    for z in zones:
        bad = False
        passive = [c for t in z.trips if t.type == "passive" and (c := _trip_c(t)) is not None]
        critical = [c for t in z.trips if t.type == "critical" and (c := _trip_c(t)) is not None]
        for t in z.trips:
            c = _trip_c(t)
            if c is None:
                out.append(Finding("thermal-trips", "fail", z.name, f"trip {t.index} reads {t.text!r} ({t.path})",
                                   "a broken device tree or driver: check the board's thermal zones in its dts"))
                bad = True
            elif not 0.0 < c <= _TRIP_MAX_C:
                out.append(Finding("thermal-trips", "fail", z.name,
                                   f"trip {t.index} ({t.type}) at {c:g} C is absurd ({t.path})",
                                   "fix the trip in the device tree (or the value an overlay wrote)"))
                bad = True
        if critical and passive and min(critical) <= max(passive):
            out.append(Finding("thermal-trips", "fail", z.name,
                               f"critical trip {min(critical):g} C is not above the passive trip {max(passive):g} C",
                               "the board would shut down before it throttles: fix the trips in the device tree"))
            bad = True
        elif passive and min(passive) < _PASSIVE_LOW_C:
            out.append(Finding("thermal-trips", "warn", z.name,
                               f"passive trip at {min(passive):g} C: it throttles at room temperature",
                               "raise the passive trip (device tree) unless the enclosure needs it"))
            bad = True
        temps = [v for _, v in z.temps if v is not None]
        if temps:
            hot = max(temps)
            if critical and hot >= min(critical):
                out.append(Finding("thermal", "fail", z.name, f"{hot:g} C: at or above the critical trip {min(critical):g} C",
                                   "shut the load down and check the heatsink and fan now"))
                bad = True
            elif passive and hot >= min(passive):
                out.append(Finding("thermal", "warn", z.name,
                                   f"{hot:g} C: at or above the passive trip {min(passive):g} C, the kernel throttles",
                                   "improve cooling (fan, heatsink) or lower the load; clocks and timings "
                                   "measured now are throttled ones"))
                bad = True
        osc = oscillation(z.temps)
        if osc is not None:
            n, swing, period = osc
            out.append(Finding("thermal", "warn", z.name,
                               f"temperature oscillates: {n} turns, swings of {swing:.1f} C about every {period:.2g} s",
                               "a throttle/recover cycle (passive trip with little hysteresis) or a fan "
                               "switching on and off: widen the hysteresis or run the fan steadily"))
            bad = True
        if not bad and z.trips:
            now = temps[-1] if temps else None
            out.append(_ok("thermal", z.name, f"{'-' if now is None else f'{now:g} C'}, trips "
                           + ", ".join(f"{t.type} {_trip_c(t):g}" for t in z.trips)))
    return out


# -- sensors ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SensorRead:
    path: str
    kind: Literal["temp", "mV", "mA", "uW", "kHz", "Hz"]
    reads: tuple[str | None, ...]
    """Each read's raw text; ``""`` for an empty or flaky read (EAGAIN/EIO), None when absent."""
    denied: bool = False


_RANGES: dict[str, tuple[float, float]] = {
    "temp": (_TEMP_MIN_C * 1000, _TEMP_MAX_C * 1000), "mV": (0, 60000), "mA": (0, 60000),
    "uW": (0, 200e6), "kHz": (1, 1e8), "Hz": (1, 1e11),
}


def check_sensors(sensors: Sequence[SensorRead], unreadable: Mapping[str, str] | None = None) -> list[Finding]:
    """Unreadable (permission), garbage (not a number, out of any physical range) or flaky
    (some reads fail, some do not) sensor files. A zone that never reads (a fused-off Orin
    cv zone: ``-256000`` or EAGAIN every time) is offline, not flaky. ``unreadable``: files that
    can hold no value (a directory, a link out of the root: ``SysfsRoot.unreadable``), one
    finding each."""
    out: list[Finding] = []
    for path, why in (unreadable or {}).items():
        outside = why.startswith("PathOutsideRootError")
        out.append(Finding("sensors", "fail", path, f"unreadable: {why}",
                           "a link leading out of the root: hetsched never follows it; remove the link"
                           if outside else "not a value file (a directory or a device node where the kernel "
                           "puts a value): hetsched treats it as absent; fix or remove it"))
    fine = 0
    for s in sensors:
        if s.denied:
            out.append(Finding("sensors", "warn", s.path, "unreadable: permission denied",
                               "run as root (debugfs and some hwmon files are root-only)"))
            continue
        present = [r for r in s.reads if r is not None]
        if not present:
            continue
        failed = sum(1 for r in present if not r.strip())
        lo, hi = _RANGES[s.kind]
        garbage = None
        values = []
        for r in present:
            if not r.strip():
                continue
            try:
                v = int(r.strip())
            except ValueError:
                garbage = f"returns garbage {r.strip()[:40]!r}"
                break
            if s.kind == "temp" and v <= _OFFLINE_MILLI:
                failed += 1
                continue
            if not lo <= v <= hi:
                garbage = f"returns an impossible value {v} ({s.kind})"
                break
            values.append(v)
        if garbage is not None:
            out.append(Finding("sensors", "fail", s.path, garbage,
                               "a broken sensor or driver: do not trust readings from it (hetsched ignores "
                               "values it cannot parse); check the driver's dmesg lines"))
        elif failed and values:
            out.append(Finding("sensors", "warn", s.path, f"flaky: {failed} of {len(present)} reads failed",
                               "readings drop out (i2c noise, a rail-gated block): telemetry skips them; "
                               "check the sensor's wiring or driver if it gets worse"))
        else:
            fine += 1
    if not any(f.status != "ok" for f in out):
        out.append(_ok("sensors", "sensors", f"{fine} sensor files read cleanly (offline zones excepted)"))
    return out


# -- governor left behind -------------------------------------------------------------------------


def check_dead_governor(
    *, state: Mapping[str, Any] | None, saved: Mapping[str, Any] | None, alive: Mapping[int, bool],
    changed: Sequence[str], errors: Mapping[str, str], saved_path: str,
) -> list[Finding]:
    """The governor's state directory (``hetsched._governor._state_dir.StateDir``): a saved-knobs file
    whose owner process is gone means it died with the clocks changed. ``changed``: knob files
    that differ from the saved bytes now."""
    out = [Finding("governor", "warn", path, f"unreadable governor state file: {why}", f"delete {path}")
           for path, why in errors.items()]
    pid = saved.get("pid") if saved is not None else (state.get("pid") if state is not None else None)
    if not isinstance(pid, int):
        if saved is None and state is None and not errors:
            out.append(_ok("governor", "governor", "no hetsched governor state on this root"))
        return out
    if alive.get(pid, False):
        phase = state.get("phase") if state is not None else None
        out.append(_ok("governor", f"pid {pid}", f"a hetsched governor runs (pid {pid}), phase {phase or '-'}"))
        return out
    if saved is not None and changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        out.append(Finding(
            "governor", "fail", saved_path,
            f"clocks left changed by a hetsched governor that died (pid {pid}): {len(changed)} knobs differ "
            f"from what it saved ({shown})",
            f"`hetsched restore --root DIR` (or `hetsched doctor --restore-clocks`) writes the saved values back (or reboot); {saved_path} holds them",
        ))
    else:
        out.append(Finding("governor", "warn", saved_path if saved is not None else f"pid {pid}",
                           f"stale state of a hetsched governor that is gone (pid {pid}); the clocks are as it found them",
                           f"delete the files under {saved_path.rsplit('/', 1)[0]}"))
    return out


# -- permissions ------------------------------------------------------------------------------


def check_permissions(knobs: Mapping[str, Sequence[tuple[str, bool]]], *, governable: Mapping[str, str]) -> list[Finding]:
    """``knobs``: domain -> (knob file, writable by us); ``governable``: domain -> why the
    governor skips it (no frequency table...), for domains it cannot drive at all."""
    out = []
    for dom, why in governable.items():
        out.append(Finding("permissions", "warn", dom, f"the governor cannot drive it: {why}",
                           "nothing to do unless you need this domain governed"))
    for dom, files in knobs.items():
        denied = [p for p, ok in files if not ok]
        if denied:
            out.append(Finding(
                "permissions", "warn", dom,
                f"cannot write {', '.join(denied)}: a governor raises SysfsPermissionError "
                "(strict) or runs ungoverned (strict=False)",
                "run as root, or grant write access to these files (a udev rule or tmpfiles.d entry "
                "with a group you are in)",
            ))
        elif files:
            out.append(_ok("permissions", dom, f"{len(files)} clock knobs writable"))
    return out


# -- SDKs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SdkState:
    onnxruntime: str | None
    """Version, or None when not importable."""
    providers: tuple[str, ...] = ()
    rknn_lite: bool = False
    rknn_toolkit: str | None = None
    """Why the toolkit environment is unusable, or None when found."""
    tensorrt: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)
    ncnn: NcnnState | None = None
    """ncnn and the Vulkan devices it finds (None: not looked at)."""


@dataclass(frozen=True)
class NcnnState:
    reason: str | None
    """Why ncnn cannot run a stage here (ncnn, pnnx or a Vulkan device missing), or None."""
    hardware_reason: str | None
    """Why ncnn has no GPU here (``reason``, or only a software Vulkan driver such as lavapipe), or None."""
    devices: tuple[str, ...] = ()
    """The Vulkan devices ncnn finds: name, type, vendor, Vulkan and driver versions, heap budget."""


_NEVER_RUN = "importable; never run on hardware by this project"


def check_sdks(soc: str | None, sdk: SdkState, *, simulated: bool) -> list[Finding]:
    """What is installed for this board, and what to install (a twin needs no vendor SDK)."""
    out = []
    if sdk.onnxruntime is None:
        out.append(Finding("sdk", "fail", "onnxruntime", "onnxruntime is not importable: CPU stages cannot run",
                           "pip install onnxruntime (onnxruntime-gpu from the Jetson Zoo on a Jetson)"))
    else:
        out.append(_ok("sdk", "onnxruntime", f"onnxruntime {sdk.onnxruntime}, providers {', '.join(sdk.providers)}"))
    soc = soc or ""
    twin_note = " (not needed: the twin simulates it)" if simulated else ""
    status: Status = "ok" if simulated else "warn"
    if soc.startswith("rk35"):
        if sdk.rknn_lite:
            out.append(_ok("sdk", "rknn-toolkit-lite2", f"rknn-toolkit-lite2 {_NEVER_RUN} (runs on the NPU)"))
        else:
            out.append(Finding("sdk", status, "rknn-toolkit-lite2", "rknn-toolkit-lite2 is not installed" + twin_note,
                               "" if simulated else "pip install 'hetsched[rknn]' on the board to run stages on the NPU"))
        if sdk.rknn_toolkit is None:
            out.append(_ok("sdk", "rknn-toolkit2", "the RKNN toolkit environment is set up (compiles for the NPU)"))
        else:
            out.append(Finding("sdk", "ok", "rknn-toolkit2",
                               f"no RKNN toolkit environment: {sdk.rknn_toolkit}" + twin_note,
                               "" if simulated else "`hetsched setup rknn` on an x86-64 host to compile models offline"))
        out.extend(_check_ncnn(sdk.ncnn, simulated=simulated))
    elif soc.startswith(("orin", "tegra", "jetson")):
        if sdk.tensorrt:
            out.append(_ok("sdk", "tensorrt", f"TensorRT {_NEVER_RUN} (its GPU and DLA devices are opt-in)"))
        else:
            out.append(Finding("sdk", status, "tensorrt", "TensorRT's Python bindings are not importable" + twin_note,
                               "" if simulated else "install JetPack's python3-libnvinfer (a venv needs --system-site-packages) and "
                               "pip install 'hetsched[jetson-cuda12]' (cuda-python of the board's CUDA major)"))
        gpu = [p for p in sdk.providers if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
        if gpu:
            out.append(_ok("sdk", "onnxruntime-gpu", f"GPU providers: {', '.join(gpu)}"))
        elif sdk.onnxruntime is not None:
            out.append(Finding("sdk", status, "onnxruntime-gpu", "onnxruntime has no CUDA/TensorRT provider" + twin_note,
                               "" if simulated else "install the onnxruntime-gpu wheel for your JetPack from the Jetson Zoo"))
    return out


def _check_ncnn(state: NcnnState | None, *, simulated: bool) -> list[Finding]:
    """The RK3588's Mali GPU through ncnn over Vulkan: what ncnn finds, and what to install."""
    if state is None:
        return []
    found = "; ".join(state.devices) or "none"
    if simulated:
        if state.reason is None:
            return [_ok("sdk", "ncnn", f"ncnn runs the twin's gpu:ncnn on this host's Vulkan device: {found}")]
        return [_ok("sdk", "ncnn", f"ncnn cannot run here: {state.reason} (only needed for the twin's gpu:ncnn)")]
    if state.hardware_reason is None:
        return [_ok("sdk", "ncnn", f"the Mali GPU runs through ncnn; Vulkan devices: {found}")]
    return [Finding("sdk", "warn", "ncnn", f"the Mali GPU is left out: {state.hardware_reason}",
                    "pip install 'hetsched[ncnn]' and install the Mali's Vulkan driver (Arm's libmali with Vulkan, "
                    "or Mesa's panvk)")]
