"""Drawing a trace (``hetsched plot``): stacked panels on one time axis in seconds.

From the top: clocks (MHz per domain), temperatures (C per zone, passive trips dashed), power
(W per rail), then the stage timeline (one row per device worker, one colour per stage, failed
runs hatched red; transfer channels below, grey). Governor phases are shaded across every panel
and re-plans are dotted vertical lines, labelled on the top panel. A panel the trace has no data
for is left out. matplotlib (the optional ``plot`` extra) is imported only here, when drawing,
and only through its object API on the Agg canvas: no display, no pyplot state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetsched._cli._plot_trace import Row, Series, TraceView, load_trace
from hetsched._errors import BackendUnavailableError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_trace", "render_trace"]

_INSTALL_HINT = "pip install 'hetsched[plot]'"
_MAX_STAGE_LEGEND = 14
_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_OTHER_ROWS = {"transfer": "0.55", "compile": "tan"}
"""Face colours of the rows that are not stage runs (one colour per kind: their names are not stages)."""


def plot_trace(trace: str | os.PathLike[str], out: str | os.PathLike[str], *, width_in: float = 13.0,
               dpi: int = 110, title: str | None = None,
               window_s: tuple[float | None, float | None] = (None, None)) -> TraceView:
    """Read the trace file ``trace`` and draw it to ``out``; returns what was read.

    Raises :class:`ProfileError` naming the trace file when it is malformed and
    :class:`BackendUnavailableError` when matplotlib is not installed.
    """
    view = load_trace(trace)
    render_trace(view, out, width_in=width_in, dpi=dpi, title=title, window_s=window_s)
    return view


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise BackendUnavailableError(
            f"hetsched plot needs matplotlib, which is not installed ({exc}): {_INSTALL_HINT}"
        ) from exc
    return Figure


def render_trace(view: TraceView, out: str | os.PathLike[str], *, width_in: float = 13.0, dpi: int = 110,
                 title: str | None = None,
                 window_s: tuple[float | None, float | None] = (None, None)) -> Path:
    """Draw ``view`` into the image file ``out`` (PNG, or SVG/PDF by its suffix); returns the path.

    ``window_s`` shows only that time range (seconds since the trace's first event; None: from
    the start / to the end).

    Raises :class:`BackendUnavailableError` when matplotlib is not installed and ``ValueError``
    for a width or dpi that is not positive or an empty window.
    """
    if not width_in > 0 or dpi <= 0:
        raise ValueError(f"plot width ({width_in}) and dpi ({dpi}) must be positive")
    end = max(view.end_s, 1e-6)
    lo = 0.0 if window_s[0] is None else window_s[0]
    hi = end * 1.005 if window_s[1] is None else window_s[1]
    if not hi > lo:
        raise ValueError(f"plot window from {lo:g} s to {hi:g} s is empty")
    figure_cls = _figure_class()
    counter_panels = [
        (series, label, steps)
        for series, label, steps in (
            (view.clocks, "clock (MHz)", True),
            (view.temps, "temperature (°C)", False),
            (view.power, "power (W)", False),
        )
        if series
    ]
    heights = [2.2] * len(counter_panels)
    if view.rows:
        heights.append(max(1.4, 0.42 * len(view.rows) + 0.5))
    if not heights:
        # Only instants (re-plans) or governor phases: an empty timeline still shows them on the time axis.
        heights.append(1.4)
    fig = figure_cls(figsize=(width_in, sum(heights) + 1.3), dpi=dpi, layout="constrained")
    axes: list[Axes] = list(fig.subplots(len(heights), 1, sharex=True, squeeze=False,
                                         gridspec_kw={"height_ratios": heights})[:, 0])
    for ax, (series, label, steps) in zip(axes, counter_panels, strict=False):
        _draw_counters(ax, series, label, steps=steps, trips=dict(view.trips_c) if series is view.temps else {})
    timeline = axes[len(counter_panels)] if len(axes) > len(counter_panels) else None
    if timeline is not None:
        _draw_timeline(timeline, view.rows)
    phase_handles = _shade_phases(axes, view)
    replan_handles = _mark_replans(axes, view, lo, hi)
    axes[-1].set_xlim(lo, hi)
    axes[-1].set_xlabel("time (s) since the trace's first event")
    for ax in axes:
        ax.grid(True, axis="x", alpha=0.25, linewidth=0.6)
    fig.suptitle(title or _title(view), fontsize="large")
    if phase_handles:
        fig.legend(handles=phase_handles, loc="outside lower left", ncols=min(len(phase_handles), 6),
                   fontsize="small", frameon=False, title="governor phases (shaded)", title_fontsize="small")
    if replan_handles:
        fig.legend(handles=replan_handles, loc="outside lower right", ncols=1 if len(replan_handles) < 4 else 2,
                   fontsize="small", frameon=False, title="re-plans (dotted)", title_fontsize="small")
    path = Path(out)
    fig.savefig(path, format=_FORMATS.get(path.suffix.lower(), "png"))
    return path


def _title(view: TraceView) -> str:
    parts = [f"{Path(view.source).name}: {view.end_s:.3g} s"]
    if view.rows:
        n, busy = len(view.devices), len(view.busy_devices)
        parts.append(f"{view.stage_runs} stage runs on {busy}{f' of {n}' if busy != n else ''} device{'s' if n != 1 else ''}")
    if view.failed_runs:
        parts.append(f"{view.failed_runs} failed")
    if view.replans:
        parts.append(f"{len(view.replans)} re-plan{'s' if len(view.replans) != 1 else ''}")
    if not (view.clocks or view.temps or view.power):
        parts.append("no board telemetry in the trace")
    return ", ".join(parts)


def _legend_outside(ax: Axes, **kwargs: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, fontsize="small",
              frameon=False, **kwargs)


def _draw_counters(ax: Axes, series: tuple[Series, ...], label: str, *, steps: bool,
                   trips: dict[str, float]) -> None:
    for s in series:
        (line,) = ax.plot(s.times_s, s.values, label=s.name, linewidth=1.4,
                          drawstyle="steps-post" if steps else "default")
        trip = trips.get(s.name)
        if trip is not None:
            ax.axhline(trip, color=line.get_color(), linestyle="--", linewidth=1.0, alpha=0.8,
                       label=f"{s.name} passive trip {trip:g} °C")
    # Trips of zones with no samples in the trace still say where throttling starts.
    for zone, trip in sorted(trips.items()):
        if all(s.name != zone for s in series):
            ax.axhline(trip, color="grey", linestyle="--", linewidth=1.0, label=f"{zone} passive trip {trip:g} °C")
    ax.set_ylabel(label)
    _legend_outside(ax, ncols=2 if len(series) > 8 else 1)


def _stage_colours(rows: tuple[Row, ...]) -> tuple[dict[str, Any], dict[str, float]]:
    """A colour per stage name and each name's busy seconds over all rows."""
    from matplotlib import colormaps

    busy: dict[str, float] = {}
    for row in rows:
        if row.kind == "device":
            for s in row.spans:
                busy[s.name] = busy.get(s.name, 0.0) + s.dur_s
    # Nine distinct hues first, then their light variants, so neighbouring stages never look alike;
    # red (tab10's 4th) is left out: it marks failed runs.
    tab10, tab20 = colormaps["tab10"], colormaps["tab20"]
    palette = [tab10(k) for k in range(10) if k != 3] + [tab20(2 * k + 1) for k in range(10) if k != 3]
    # Colours follow first appearance order of the names, so a stage keeps its colour across rows.
    names = list(dict.fromkeys(s.name for row in rows if row.kind == "device" for s in row.spans))
    return {name: palette[k % len(palette)] for k, name in enumerate(names)}, busy


def _draw_timeline(ax: Axes, rows: tuple[Row, ...]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colours, busy = _stage_colours(rows)
    n = len(rows)
    any_failed = False
    for k, row in enumerate(rows):
        y = n - 1 - k
        bars = [(s.start_s, s.dur_s) for s in row.spans]
        faces = [colours.get(s.name, "0.6") if row.kind == "device" else _OTHER_ROWS[row.kind] for s in row.spans]
        # A hairline edge in the face colour keeps sub-pixel runs visible on a long trace.
        ax.broken_barh(bars, (y - 0.36, 0.72), facecolors=faces, edgecolors=faces, linewidth=0.4)
        failed = [(s.start_s, s.dur_s) for s in row.spans if s.failed]
        if failed:
            any_failed = True
            ax.broken_barh(failed, (y - 0.36, 0.72), facecolors="none", edgecolors="red", hatch="xxx",
                           linewidth=1.0)
            ax.plot([a for a, _ in failed], [y + 0.42] * len(failed), linestyle="none", marker="v",
                    color="red", markersize=5)
        if row.marks_s:
            ax.plot(row.marks_s, [y + 0.42] * len(row.marks_s), linestyle="none", marker="v", color="black",
                    markersize=5)
    ax.set_yticks(range(n), [row.label for row in reversed(rows)], fontsize="small")
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_ylabel("stages")
    ranked = sorted(busy, key=lambda name: -busy[name])
    handles: list[Any] = [Patch(facecolor=colours[name], label=name) for name in ranked[:_MAX_STAGE_LEGEND]]
    if len(ranked) > _MAX_STAGE_LEGEND:
        handles.append(Patch(facecolor="white", edgecolor="none",
                             label=f"... {len(ranked) - _MAX_STAGE_LEGEND} more stages"))
    for kind, colour in _OTHER_ROWS.items():
        if any(row.kind == kind for row in rows):
            handles.append(Patch(facecolor=colour, label=kind))
    if any_failed:
        handles.append(Patch(facecolor="none", edgecolor="red", hatch="xxx", label="failed run"))
    if any(row.marks_s for row in rows):
        handles.append(Line2D([], [], linestyle="none", marker="v", color="black", label="transfer preempted"))
    if handles:
        _legend_outside(ax, handles=handles, title="stage (busiest first)", title_fontsize="small")


def _shade_phases(axes: list[Axes], view: TraceView) -> list[Any]:
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    names = list(dict.fromkeys(p.name for p in view.phases))
    cmap = colormaps["Pastel1"]
    colours = {name: cmap(k % cmap.N) for k, name in enumerate(names)}
    for p in view.phases:
        for ax in axes:
            ax.axvspan(p.start_s, p.start_s + p.dur_s, color=colours[p.name], alpha=0.45, linewidth=0, zorder=0)
    return [Patch(facecolor=colours[name], label=name) for name in names]


def _mark_replans(axes: list[Axes], view: TraceView, lo: float, hi: float) -> list[Any]:
    """Dotted lines across every panel, numbered above the top one; the legend gives each one's reason."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    span = hi - lo
    last_numbered: float | None = None
    for k, r in enumerate(view.replans, start=1):
        for ax in axes:
            ax.axvline(r.time_s, color="black", linestyle=":", linewidth=1.2, zorder=3)
        # Numbers closer than 2 % of the axis would overlap: the later line goes unnumbered (the legend has it).
        # A number outside the window would be drawn beyond the axes (it is not clipped) and squash the layout.
        inside = lo <= r.time_s <= hi
        if inside and (last_numbered is None or r.time_s - last_numbered >= 0.02 * span):
            last_numbered = r.time_s
            axes[0].text(r.time_s, 1.01, str(k), transform=axes[0].get_xaxis_transform(), ha="center",
                         va="bottom", fontsize="small", fontweight="bold")
        label = r.label if len(r.label) <= 90 else r.label[:89] + "…"
        handles.append(Line2D([], [], color="black", linestyle=":", label=f"{k}  at {r.time_s:.3g} s: {label}"))
    return handles
