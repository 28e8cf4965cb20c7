"""``hetsched plot TRACE -o FILE.png [--width IN] [--dpi N] [--from S] [--to S] [--title TEXT]``: draw a trace.

The trace is the Chrome trace event file ``Session(trace=...)`` / ``hetsched run --trace`` writes;
the figure shows clocks, temperatures and power over time above a per-device stage timeline, with
governor phases shaded and re-plans marked (see :mod:`hetsched._cli._plot_render`). Needs the
optional ``plot`` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import finite_float, output_file, positive_float, positive_int

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="plot a trace: clocks, temperatures and power over a per-device stage timeline (needs hetsched[plot])",
        description="Draw a trace written by 'hetsched run --trace' (or Session(trace=...)) into one image: "
                    "clocks, temperatures and power over time above a per-device stage timeline, governor "
                    "phases shaded, re-plans marked.",
    )
    parser.add_argument("trace", metavar="TRACE", help="the trace file (Chrome trace event JSON)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", type=output_file,
                        help="image to write: PNG (or SVG/PDF by the file's suffix)")
    parser.add_argument("--width", type=positive_float, default=13.0, metavar="IN",
                        help="figure width in inches (default 13); the height follows the panels")
    parser.add_argument("--dpi", type=positive_int, default=110, metavar="N", help="pixels per inch (default 110)")
    parser.add_argument("--from", dest="start", type=finite_float, default=None, metavar="S",
                        help="show the trace from S seconds after its first event (default: its start)")
    parser.add_argument("--to", dest="end", type=finite_float, default=None, metavar="S",
                        help="show the trace up to S seconds after its first event (default: its end)")
    parser.add_argument("--title", default=None, help="figure title (default: file name, duration, runs, re-plans)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetsched._cli._plot_render import plot_trace

    if args.start is not None and args.end is not None and not args.end > args.start:
        print(f"hetsched plot: error: --to {args.end:g} must be after --from {args.start:g}", file=sys.stderr)
        return 2
    view = plot_trace(args.trace, args.output, width_in=args.width, dpi=args.dpi, title=args.title,
                      window_s=(args.start, args.end))
    series = len(view.clocks) + len(view.temps) + len(view.power)
    print(
        f"wrote {args.output}: {view.end_s:.3g} s, {view.stage_runs} stage runs on {len(view.busy_devices)} of"
        f" {len(view.devices)} devices"
        f" ({view.failed_runs} failed), {series} counter series, {len(view.phases)} governor phases,"
        f" {len(view.replans)} re-plans"
    )
    return 0
