"""``hetsched twin SOC --root DIR [--once] [--speed X] [--seed N]``: run a simulated board's sysfs tree."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from ._common import finite_float, non_negative_int, output_dir, positive_float, probability

__all__ = ["register"]


def register(subparsers: Any) -> None:
    from hetsched._twin.profiles import known_socs

    p: argparse.ArgumentParser = subparsers.add_parser(
        "twin",
        help="materialise a SoC twin's sysfs tree (a labelled simulator) and keep it live",
        description=(
            "Write the sysfs/procfs tree of a simulated board under DIR and keep it updated from the twin's "
            "power/thermal model; writes to governor/min/max/setspeed files are applied as the kernel would. "
            "Nothing outside DIR is written, created or deleted: an existing tree in which a symlink leads out "
            "of DIR is refused (exit status 1, the message names the path). "
            "This is a SIMULATOR calibrated from public data, not a board."
        ),
    )
    p.add_argument("soc", choices=known_socs(), metavar="SOC", help=f"one of: {', '.join(known_socs())}")
    p.add_argument("--root", required=True, type=output_dir, help="directory to write the tree into (sys/, proc/, etc/ below it)")
    p.add_argument("--variant", default=None, help="rk3588: vendor|mainline; orin-*: jp6|jp5")
    p.add_argument("--once", action="store_true", help="write one consistent snapshot and exit")
    p.add_argument("--speed", type=positive_float, default=1.0, help="board seconds per wall second (default 1)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sensor-noise seed")
    p.add_argument("--period", type=positive_float, default=0.1, help="wall seconds between updates (default 0.1)")
    p.add_argument("--ambient", type=finite_float, default=25.0, help="ambient temperature in C")
    p.add_argument("--flaky", type=probability, default=0.0, help="probability a zone's temp is unreadable per update")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import anyio

    from hetsched._twin.live import LiveTwin

    twin = LiveTwin(
        args.soc, args.root, variant=args.variant, speed=args.speed, seed=args.seed, period_s=args.period,
        ambient_c=args.ambient, flaky=args.flaky,
    )
    if args.once:
        root = twin.write_once()
        print(f"twin {args.soc} ({twin.variant}): snapshot written under {root}")
        return 0

    async def serve() -> int:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with twin:
                print(
                    f"twin {args.soc} ({twin.variant}) live under {twin.root} at {args.speed}x; Ctrl-C to stop",
                    flush=True,
                )
                async for signum in signals:
                    print(f"twin: {signal.Signals(signum).name}, stopping", file=sys.stderr, flush=True)
                    break
        s = twin.statistics()
        print(
            f"twin: stopped after {s.time_s:.1f} board s, {s.updates} updates, "
            f"{s.writes_applied} writes applied, {s.writes_rejected} rejected",
            flush=True,
        )
        return 0

    return anyio.run(serve)
