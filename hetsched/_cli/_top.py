"""``hetsched top [--root DIR] [--interval S] [--iterations N]``: a live tegrastats/jtop-like view.

Besides clocks, temperatures against their trips and rail power, each frame shows what a
session does to the board: on a live twin root the per-device load the twin renders from the
sessions' reports (its load channel names the reporting pids), and the phase and per-domain
targets of a running hetsched governor (the state file it publishes under the root's run
directory, :class:`hetsched._governor._state_dir.StateDir`), and the per-session load of every
running ``hetsched.Runtime(publish_load=True)`` (``hetsched run`` with several models and
``--root``): each session's share of the board's busy time and its busy share per device (the
file it publishes in the same directory, ``hetsched/_session/_load_file.py``).

Every value is shown as the file says. A current clock outside the domain's own
``[min, max]`` limits is marked ``*`` with a footnote rather than clamped: it is what the
kernel reports while a limit was just moved and the clock has not followed yet (a governor
writing ``min = max = target``), or while another agent holds it, and hiding it would hide
that.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["SessionView", "format_frame", "read_session_view", "register", "tegrastats_line"]

_CLEAR = "\x1b[H\x1b[2J"


def register(subparsers: Any) -> None:
    from ._common import existing_dir, positive_float, positive_int

    parser = subparsers.add_parser(
        "top",
        help="live view of clocks, utilisation, temperatures and power (like tegrastats/jtop)",
        description="Sample the board under a sysfs root periodically and print what it does.",
    )
    parser.add_argument("--root", default="/", metavar="DIR", type=existing_dir, help="sysfs root (default /)")
    parser.add_argument("--interval", type=positive_float, default=1.0, metavar="S", help="seconds between frames (default 1)")
    parser.add_argument(
        "--iterations", type=positive_int, default=None, metavar="N", help="print N frames and exit (default: until Ctrl-C)"
    )
    parser.set_defaults(func=run)


def _pct(u: float | None) -> str:
    # None: not known yet (first sample has no /proc/stat delta) or not exposed by the board.
    return "--" if u is None else f"{round(u * 100)}%"


def _mhz(hz: int | None) -> str:
    return "-" if hz is None else f"{round(hz / 1e6)}"


def _outside_limits(d: Any) -> bool:
    f, lo, hi = d.freq_hz, d.min_hz, d.max_hz
    return f is not None and ((lo is not None and f < lo) or (hi is not None and f > hi))


def tegrastats_line(snap: Any) -> str:
    """One tegrastats-style line: ``CPU [12%@816,...] GR3D_FREQ 0%@[300] ... cpu@48C ... VDD_IN 4832mW``."""
    parts: list[str] = []
    cpu_fields = []
    for d in snap.domains.values():
        if d.kind != "cpu":
            continue
        for c in d.cpus:
            u = snap.cpu_utilisation[c] if c < len(snap.cpu_utilisation) else None
            cpu_fields.append(f"{_pct(u)}@{_mhz(d.freq_hz)}")
    if cpu_fields:
        parts.append(f"CPU [{','.join(cpu_fields)}]")
    for d in snap.domains.values():
        if d.kind == "memory":
            parts.append(f"EMC_FREQ {_pct(d.utilisation)}@{_mhz(d.freq_hz)}")
        elif d.kind == "gpu":
            parts.append(f"GR3D_FREQ {_pct(d.utilisation)}@[{_mhz(d.freq_hz)}]")
        elif d.kind == "npu":
            parts.append(f"NPU {_pct(d.utilisation)}@{_mhz(d.freq_hz)}")
    for z in snap.zones.values():
        short = z.name.split("-", 1)[0]
        parts.append(f"{short}@{'off' if z.temp_c is None else f'{z.temp_c:g}C'}")
    for r in snap.rails.values():
        if r.power_w is None:
            continue
        mark = "~" if r.source == "estimated" else ""
        parts.append(f"{r.name} {mark}{round(r.power_w * 1000)}mW")
    return " ".join(parts)


@dataclass(frozen=True)
class SessionView:
    """What sessions do to the board, besides the snapshot: see the module docstring."""

    live_twin: bool = False
    reporters: tuple[int, ...] = ()
    """Pids whose simulated stages report load to the live twin."""
    governor_pid: int | None = None
    governor_alive: bool = False
    phase: str | None = None
    targets: dict[str, int] = field(default_factory=dict)
    locked: tuple[str, ...] = ()
    sessions: tuple[Any, ...] = ()
    """The sessions of running runtimes that publish their load
    (:class:`hetsched._session._load_file.PublishedSession`)."""


def read_session_view(fs: Any) -> SessionView:
    """Read the live twin's load channel listing and the governor's published state under ``fs``."""
    from hetsched._governor._state_dir import StateDir, pid_alive
    from hetsched._session._load_file import read_published

    live = fs.is_dir(".hetsched-twin")
    pids = sorted({int(n.split("-", 1)[0]) for n in fs.listdir(".hetsched-twin/load")
                   if n.endswith(".load") and n.split("-", 1)[0].isdigit()}) if live else []
    state_dir = StateDir(fs)
    pub = state_dir.read()
    pid = pub.pid("state")
    locked = pub.state.get("locked", []) if pub.state is not None else []
    alive = pid is not None and pid_alive(pid)
    if alive and pub.state is not None and not pub.state.get("dry_run"):
        # A governing one holds the root's lock: a reused pid over a dead one's file does not.
        lock = state_dir.probe()
        if lock.held is not None:
            alive = lock.held and lock.pid in (None, pid)
    return SessionView(
        live_twin=live, reporters=tuple(pids), governor_pid=pid,
        governor_alive=alive, phase=pub.phase, targets=dict(pub.targets),
        locked=tuple(str(x) for x in locked) if isinstance(locked, list) else (),
        sessions=read_published(fs, pid_alive),
    )


def _session_lines(snap: Any, view: SessionView) -> list[str]:
    lines = []
    if view.live_twin:
        who = f"pids {', '.join(map(str, view.reporters))}" if view.reporters else "no session reporting"
        loads = "  ".join(f"{d.name} {_pct(d.utilisation)}" for d in snap.domains.values())
        lines.append(f"load  (live twin; {who})  {loads}")
    if view.governor_pid is not None:
        if view.governor_alive:
            targets = "  ".join(f"{n}={_mhz(hz)}" for n, hz in view.targets.items())
            locked = f"  locked: {', '.join(view.locked)}" if view.locked else ""
            lines.append(f"governor pid {view.governor_pid}  phase {view.phase or '-'}  targets MHz: {targets or '-'}{locked}")
        else:
            lines.append(f"governor state left by pid {view.governor_pid}, which is not running: see `hetsched doctor`")
    for s in view.sessions:
        devices = "  ".join(f"{d} {_pct(v)}" for d, v in sorted(s.busy_share.items())) or "idle"
        lines.append(f"session {s.name:<14} runtime pid {s.runtime_pid}  {_pct(s.share):>4} of the busy time  "
                     f"{s.completed}/{s.requests} done  devices: {devices}")
    return lines


def _zone_text(z: Any) -> str:
    txt = f"{z.name}={'off' if z.temp_c is None else f'{z.temp_c:.1f}C'}"
    trips = [f"{t:g}" for t in (z.passive_trip_c, z.critical_trip_c) if t is not None]
    if trips:
        txt += "/" + "/".join(trips)
    if z.temp_c is not None and z.passive_trip_c is not None and z.temp_c >= z.passive_trip_c:
        txt += "!"  # at or above the passive trip: the kernel throttles
    return txt


def format_frame(snap: Any, *, root: str, interval: float, view: SessionView | None = None) -> str:
    """A jtop-like multi-line frame of one snapshot (and of what sessions do, when ``view`` is given)."""
    lines = [f"hetsched top  soc={snap.soc or 'unknown'}  root={root}  t={snap.time_s:.1f}s  every {interval:g}s"]
    lines.append(f"{'domain':<14}{'kind':<8}{'MHz':>7}{'min':>7}{'max':>7}{'util':>7}  governor")
    outside = False
    for d in snap.domains.values():
        mark = "*" if _outside_limits(d) else ""
        outside = outside or bool(mark)
        lines.append(
            f"{d.name:<14}{d.kind:<8}{_mhz(d.freq_hz) + mark:>7}{_mhz(d.min_hz):>7}{_mhz(d.max_hz):>7}"
            f"{_pct(d.utilisation):>7}  {d.governor or '-'}"
        )
    if outside:
        lines.append("  * current clock outside its min..max: a limit just changed and the clock has not followed yet, "
                     "or another agent holds it")
    if snap.cpu_utilisation:
        lines.append("cpus  " + " ".join(f"{i}:{_pct(u):>4}" for i, u in enumerate(snap.cpu_utilisation)))
    if view is not None:
        lines += _session_lines(snap, view)
    if snap.zones:
        lines.append("temp (C now/passive/critical)  " + "  ".join(_zone_text(z) for z in snap.zones.values()))
    if snap.rails:
        rail_txt = []
        for r in snap.rails.values():
            w = "-" if r.power_w is None else f"{r.power_w:.2f}W"
            e = "" if r.energy_j is None else f" ({r.energy_j:.1f}J)"
            rail_txt.append(f"{r.name}={w}{e}{' est' if r.source == 'estimated' else ''}")
        lines.append("power " + "  ".join(rail_txt))
    if snap.total_power_w is not None:
        lines.append(f"total {snap.total_power_w:.2f} W")
    lines.append(tegrastats_line(snap))
    return "\n".join(lines)


async def _top(args: argparse.Namespace, out: TextIO) -> int:
    from hetsched._estimators import power_estimator_for
    from hetsched._platform._fs import SysfsRoot
    from hetsched._platform.discovery import discover
    from hetsched._platform.telemetry import Telemetry

    tty = out.isatty()
    fs = SysfsRoot(args.root)
    platform = discover(fs)
    telemetry = Telemetry(
        args.root, period_s=args.interval, capacity=8, platform=platform, estimator=power_estimator_for(platform)
    )
    async with telemetry as tm:
        snap = tm.latest()
        shown = 0
        while True:
            frame = format_frame(snap, root=args.root, interval=args.interval, view=read_session_view(fs))
            out.write((_CLEAR if tty else "") + frame + "\n")
            out.flush()
            shown += 1
            if args.iterations is not None and shown >= args.iterations:
                return 0
            snap = await tm.wait_sample()


def run(args: argparse.Namespace) -> int:
    import anyio

    from hetsched._errors import PlatformError

    if not (math.isfinite(args.interval) and args.interval > 0):
        raise PlatformError(f"--interval must be a positive number of seconds, got {args.interval}")
    if args.iterations is not None and args.iterations < 1:
        raise PlatformError(f"--iterations must be >= 1, got {args.iterations}")
    return anyio.run(_top, args, sys.stdout)
