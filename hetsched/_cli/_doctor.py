"""``hetsched doctor [--root DIR] [--json] [--probe] [--window S] [--all]``: what is wrong with a board.

Reads the board (or twin root) once, over a short telemetry window, and prints one finding per
check and subject with a fix hint (``_doctor_checks``). ``--json`` prints a list of objects with
``check``, ``status`` (``ok``/``warn``/``fail``), ``subject``, ``message`` and ``hint``.
``--probe`` writes one harmless value (a domain's lowest frequency) to each clock domain through
the governor's port, reads it back and restores every knob. Exit status: 1 when any check
fails, else 0. ``--restore-clocks`` first writes back what a governor that died saved.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

__all__ = ["register", "run"]

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def register(subparsers: Any) -> None:
    from ._common import existing_dir, non_negative_float

    p = subparsers.add_parser(
        "doctor",
        help="check a board (or twin root) for clock caps, nvpmodel, thermal trouble, sensors, SDKs",
        description="Check a board or twin root and print findings, each with a fix hint.",
    )
    p.add_argument("--root", default="/", metavar="DIR", type=existing_dir, help="sysfs root (default /)")
    p.add_argument("--json", action="store_true", help="print a JSON list of findings")
    p.add_argument("--probe", action="store_true",
                   help="write one harmless value to each clock domain and restore it (needs write permission)")
    p.add_argument("--window", type=non_negative_float, default=3.0, metavar="S",
                   help="seconds of telemetry for oscillation and flaky sensors (default 3; 0: one sample)")
    p.add_argument("--all", action="store_true", help="also print the checks that passed")
    p.add_argument("--restore-clocks", action="store_true",
                   help="write back the clocks a hetsched governor that died left changed, then check")
    p.set_defaults(func=run)


def format_findings(found: list[Any], *, show_ok: bool) -> str:
    lines = []
    for f in found:
        if f.status == "ok" and not show_ok:
            continue
        lines.append(f"[{_MARK[f.status]}] {f.check:<12} {f.subject}: {f.message}")
        if f.hint:
            lines.append(f"{'':20}fix: {f.hint}")
    counts = {s: sum(1 for f in found if f.status == s) for s in ("ok", "warn", "fail")}
    lines.append(f"{counts['fail']} failed, {counts['warn']} warnings, {counts['ok']} ok")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hetsched._errors import PlatformError

    from ._doctor_checks_read import findings, read_board

    if not (math.isfinite(args.window) and args.window >= 0):
        raise PlatformError(f"--window must be a number of seconds >= 0, got {args.window}")
    if args.restore_clocks:
        from ._doctor_checks_read import restore_saved_clocks

        written = restore_saved_clocks(args.root)
        print(f"restored {len(written)} clock knobs", file=sys.stderr)
    found = findings(read_board(args.root, window_s=args.window, probe=args.probe))
    if args.json:
        print(json.dumps([f.as_json() for f in found], indent=1))
    else:
        print(format_findings(found, show_ok=args.all))
    sys.stdout.flush()
    return 1 if any(f.status == "fail" for f in found) else 0
