"""``hetsched restore [--root DIR] [--json] [--force]``: put back the clocks a governor that died left changed.

A governor saves every clock knob under ``<root>/run/hetsched/governor-saved.json`` before its
first write and removes the file once it has restored them. When it was killed (SIGKILL, the
OOM killer, power loss on a twin tree) the file stays and the board keeps its clocks: this
writes them back without starting a governor (the next governor on the root does the same
before it saves). The file is removed after a clean restore. A governor that still runs is
left alone unless ``--force`` (a governor that hangs): one that holds the root's governor lock
(``run/hetsched/governor.lock``; the lock is taken for the restore, so no governor starts in
the middle of it), or, for a file an older version wrote without a lock, whose pid runs (a
pid reused by another process reads as running: ``--force``).

Exit status: 0 restored or nothing to restore; 1 some knobs are not back (each named), the
file is unreadable, or its governor still runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._common import existing_dir

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "restore",
        help="write back the clocks a hetsched governor that died left changed",
        description="Restore the clock knobs a hetsched governor saved and could not put back itself.",
    )
    p.add_argument("--root", default="/", metavar="DIR", type=existing_dir, help="sysfs root (default /)")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    p.add_argument("--force", action="store_true", help="restore even if the governor that saved them still runs (holds the governor lock)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetsched._governor._state_dir import StateDir
    from hetsched._platform._fs import SysfsRoot

    # The straight descent: this command -> the root's state directory (its lock, its saved
    # knobs) -> the knobs written back through the sysfs root.
    out = StateDir(SysfsRoot(args.root)).restore_saved(force=args.force)
    if args.json:
        print(json.dumps(out.to_json(), sort_keys=True))
    else:
        print(out.message)
        for path, why in out.failed.items():
            print(f"  not restored: {path}: {why}")
    sys.stdout.flush()
    return out.exit_code
