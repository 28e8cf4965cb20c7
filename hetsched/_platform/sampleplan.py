"""The sampling plan telemetry compiles from a :class:`Platform`, and the decoders of what it reads.

:func:`compile_plan` resolves every file a sample reads once (clocks, loads, zone
temperatures, rail sensors), so a sample is one ``open``/``read``/``close`` per file
on pre-resolved paths. The decoders turn those raw bytes into numbers, ``None`` for
anything absent or unparseable (a sample never raises on a bad value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import PathOutsideRootError
from ._fs import ResolvedPath, SysfsRoot
from .devfreq import parse_load
from .discovery import Platform
from .jetson import emc_utilisation
from .rknpu import parse_npu_load

__all__ = ["DomainPlan", "RailPlan", "SamplePlan", "ZonePlan", "compile_plan", "decode_int", "decode_load"]


@dataclass(frozen=True, slots=True)
class DomainPlan:
    name: str
    kind: Any
    cur: ResolvedPath | None
    cur_scale: int
    """What ``cur``/``min``/``max`` are multiplied by to give Hz (1000 for cpufreq's kHz)."""
    min: ResolvedPath | None
    max: ResolvedPath | None
    governor: ResolvedPath | None
    available_hz: tuple[int, ...]
    cpus: tuple[int, ...]
    load: ResolvedPath | None
    load_format: str | None


@dataclass(frozen=True, slots=True)
class ZonePlan:
    name: str
    temp: ResolvedPath | None
    passive_c: float | None
    critical_c: float | None


@dataclass(frozen=True, slots=True)
class RailPlan:
    name: str
    kind: str
    voltage: ResolvedPath | None
    current: ResolvedPath | None
    power_mw: ResolvedPath | None
    energy: ResolvedPath | None
    max_range_uj: int | None
    is_total: bool


@dataclass(frozen=True, slots=True)
class SamplePlan:
    proc_stat: ResolvedPath | None
    domains: tuple[DomainPlan, ...]
    zones: tuple[ZonePlan, ...]
    rails: tuple[RailPlan, ...]
    """Rails a sensor measures."""
    estimated_names: tuple[str, ...]
    """Rails only a model can fill (no sensor on the board)."""
    n_cpus: int


def _res(fs: SysfsRoot, rel: str | None) -> ResolvedPath | None:
    """``rel`` resolved for the hot loop; None when absent, or when it leads out of the root
    (an unreadable file: noted once as the :class:`~hetsched.PathOutsideRootError`, never read)."""
    if rel is None:
        return None
    try:
        return fs.resolve(rel) if fs.exists(rel) else None
    except PathOutsideRootError as exc:
        fs.note_unreadable(rel, exc)
        return None


def _zone_key(type_: str, index: int, seen: set[str]) -> str:
    key = type_ if type_ not in seen else f"{type_}#{index}"
    seen.add(key)
    return key


def _domains(fs: SysfsRoot, p: Platform) -> tuple[DomainPlan, ...]:
    domains: list[DomainPlan] = []
    for c in p.cpu_clusters:
        cur = _res(fs, f"{c.path}/scaling_cur_freq") or _res(fs, f"{c.path}/cpuinfo_cur_freq")
        domains.append(
            DomainPlan(
                name=c.name,
                kind="cpu",
                cur=cur,
                cur_scale=1000,
                min=_res(fs, f"{c.path}/scaling_min_freq"),
                max=_res(fs, f"{c.path}/scaling_max_freq"),
                governor=_res(fs, f"{c.path}/scaling_governor"),
                available_hz=tuple(k * 1000 for k in c.frequencies_khz),
                cpus=c.cpus,
                load=None,
                load_format=None,
            )
        )
    seen_kinds: set[str] = set()
    for d in p.devices:
        # Snapshot domains are named by kind; a second device of a kind keeps its node name.
        name = d.kind if d.kind not in seen_kinds else f"{d.kind}:{d.name}"
        seen_kinds.add(d.kind)
        if d.source == "bpmp":
            cur, lo, hi = (_res(fs, f"{d.path}/{f}") for f in ("rate", "min_rate", "max_rate"))
            gov = None
        else:
            cur, lo, hi, gov = (_res(fs, f"{d.path}/{f}") for f in ("cur_freq", "min_freq", "max_freq", "governor"))
        domains.append(
            DomainPlan(
                name=name,
                kind=d.kind,
                cur=cur,
                cur_scale=1,
                min=lo,
                max=hi,
                governor=gov,
                available_hz=d.frequencies_hz,
                cpus=(),
                load=_res(fs, d.load_path),
                load_format=d.load_format,
            )
        )
    return tuple(domains)


def compile_plan(fs: SysfsRoot, p: Platform) -> SamplePlan:
    """Resolve every file a sample of ``p`` reads.

    :raises PathOutsideRootError: a link in the tree points outside the root.
    """
    seen: set[str] = set()
    zones = tuple(
        ZonePlan(_zone_key(z.type, z.index, seen), _res(fs, f"{z.path}/temp"), z.passive_trip_c, z.critical_trip_c)
        for z in p.thermal_zones
    )
    rails = tuple(
        RailPlan(
            name=r.name,
            kind=r.kind,
            voltage=_res(fs, r.voltage_path),
            current=_res(fs, r.current_path),
            power_mw=_res(fs, r.power_path),
            energy=_res(fs, r.energy_path),
            max_range_uj=r.max_energy_range_uj,
            is_total=r.is_total,
        )
        for r in p.rails
        if r.source != "estimated"
    )
    return SamplePlan(
        proc_stat=_res(fs, "proc/stat"),
        domains=_domains(fs, p),
        zones=zones,
        rails=rails,
        estimated_names=tuple(r.name for r in p.rails if r.source == "estimated"),
        n_cpus=max(p.cpus, default=-1) + 1,
    )


def decode_int(raw: bytes | None) -> int | None:
    """An integer file's bytes as an int; ``None`` when absent or not a number."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def decode_load(raw: bytes | None, fmt: str | None, freq_hz: int | None) -> float | None:
    """Utilisation 0..1 from a load file in ``fmt`` (see ``DeviceInfo.load_format``); ``None`` if unknown."""
    if raw is None:
        return None
    if fmt == "busy@hz":
        parsed = parse_load(raw.decode("ascii", "replace"))
        return parsed[0] / 100.0 if parsed else None
    if fmt == "permille":
        v = decode_int(raw)
        return min(max(v, 0), 1000) / 1000.0 if v is not None else None
    if fmt == "rknpu":
        cores = parse_npu_load(raw.decode("ascii", "replace"))
        return sum(cores) / len(cores) if cores else None
    if fmt == "mc_all":
        return emc_utilisation(decode_int(raw), freq_hz)
    return None
