"""``hetsched top [--root DIR] [--interval S] [--iterations N]``: a live tegrastats/jtop-like view."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, TextIO

__all__ = ["format_frame", "register", "tegrastats_line"]

_CLEAR = "\x1b[H\x1b[2J"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of clocks, utilisation, temperatures and power (like tegrastats/jtop)",
        description="Sample the board under a sysfs root periodically and print what it does.",
    )
    parser.add_argument("--root", default="/", metavar="DIR", help="sysfs root (default /)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between frames (default 1)")
    parser.add_argument(
        "--iterations", type=int, default=None, metavar="N", help="print N frames and exit (default: until Ctrl-C)"
    )
    parser.set_defaults(func=run)


def _pct(u: float | None) -> str:
    # None: not known yet (first sample has no /proc/stat delta) or not exposed by the board.
    return "--" if u is None else f"{round(u * 100)}%"


def _mhz(hz: int | None) -> str:
    return "-" if hz is None else f"{round(hz / 1e6)}"


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


def format_frame(snap: Any, *, root: str, interval: float) -> str:
    """A jtop-like multi-line frame of one snapshot."""
    lines = [f"hetsched top  soc={snap.soc or 'unknown'}  root={root}  t={snap.time_s:.1f}s  every {interval:g}s"]
    lines.append(f"{'domain':<14}{'kind':<8}{'MHz':>7}{'min':>7}{'max':>7}{'util':>7}  governor")
    for d in snap.domains.values():
        lines.append(
            f"{d.name:<14}{d.kind:<8}{_mhz(d.freq_hz):>7}{_mhz(d.min_hz):>7}{_mhz(d.max_hz):>7}"
            f"{_pct(d.utilisation):>7}  {d.governor or '-'}"
        )
    if snap.cpu_utilisation:
        lines.append("cpus  " + " ".join(f"{i}:{_pct(u):>4}" for i, u in enumerate(snap.cpu_utilisation)))
    if snap.zones:
        lines.append(
            "temp  "
            + "  ".join(
                f"{z.name}={'off' if z.temp_c is None else f'{z.temp_c:.1f}C'}"
                + (f"/{z.passive_trip_c:g}" if z.passive_trip_c is not None else "")
                for z in snap.zones.values()
            )
        )
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
    from hetsched._platform.discovery import discover
    from hetsched._platform.telemetry import Telemetry

    tty = out.isatty()
    platform = discover(args.root)
    telemetry = Telemetry(
        args.root, period_s=args.interval, capacity=8, platform=platform, estimator=power_estimator_for(platform)
    )
    async with telemetry as tm:
        snap = tm.latest()
        shown = 0
        while True:
            out.write((_CLEAR if tty else "") + format_frame(snap, root=args.root, interval=args.interval) + "\n")
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
