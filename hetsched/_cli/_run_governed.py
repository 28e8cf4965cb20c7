"""The governed and frame-paced parts of ``hetsched run``: pacing, the governor's run, its summary.

Frame pacing (``--frame-deadline-ms``, ``--frame-period-ms``): request ``i`` starts at frame
``i``'s start (one request per period, the next at once when one overran), and a request
whose latency exceeds the deadline is a missed deadline. On a twin's devices the latency
judged is the board's (the stages' *modelled* seconds: the host's onnxruntime time says
nothing about the simulated board's), elsewhere the host's wall time. The same pacing
governed and ungoverned makes their energy per request comparable.

After a governed run the summary holds, per phase, the clocks it ran at, its time and
energy; the peak temperature of each zone; the writes (total, per domain, per domain per
second); the locked domains (those that did not follow the writes).

Board energy (:class:`BoardEnergy`): where the root has a *measured* board-input rail
(``VDD_IN`` on a Jetson's INA3221), the run integrates it over its requests, memory, CPUs and
the idle between frames included: what the board draws, not only the stages' modelled joules.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._platform.telemetry import Telemetry
from .._session._board_energy import BoardRailMeter
from ._common import Progress

if TYPE_CHECKING:
    from .._session._session import Session

T = TypeVar("T")

#: How often a run that is not frame-paced samples the board rail in the background.
BOARD_SAMPLE_PERIOD_S = 0.05


@dataclass
class Paced:
    """What a frame-paced run measured."""

    latencies_s: list[float]
    """Per request: board seconds where the devices model them, else wall seconds."""
    source: str
    """``"modelled"`` or ``"wall"``: where :attr:`latencies_s` come from."""
    misses: int
    """Requests whose latency exceeded the deadline."""
    overruns: int
    """Requests that started late because the one before overran its frame (host time)."""


def modelled_seconds(session: Session) -> float | None:
    """Sum of the modelled seconds of every stage run so far (the session's modelled busy seconds
    per device, plans already closed included), or None where no stage models time."""
    st = session.statistics()
    if st.energy_source != "modelled":
        return None
    return float(sum(st.device_busy_s.values()))


class BoardEnergy(BoardRailMeter):
    """The board's input-rail energy over a run, from the root's measured board rail: the
    runtime's :class:`~hetsched._session._board_energy.BoardRailMeter` (its rule: each reading
    stands for the time since the one before; only a *measured* rail, so an RK3588 without a
    power monitor has :attr:`source` None and :attr:`note` saying why), sampled by the run's
    own task and reported as ``hetsched run --json`` fields.

    :param root: the sysfs root (a twin's, or ``/``).
    :param clock: seconds, monotonic, of the board: host time on a real board and on a twin
        run in its own process at ``--speed 1``; a twin driven in-process passes its board time.
    """

    def __init__(self, root: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(root, clock=clock, telemetry=Telemetry)

    @property
    def source(self) -> str | None:
        """``"measured: VDD_IN"``, or None without a measured board rail."""
        return None if self.rail is None else f"measured: {self.rail}"

    async def sample_async(self) -> None:
        """:meth:`sample` in a worker thread (on a board an INA3221 read is an i2c transaction)."""
        if self.measuring:
            await anyio.to_thread.run_sync(self.sample)

    async def sample_every(self, period_s: float = BOARD_SAMPLE_PERIOD_S) -> None:
        """Sample every ``period_s`` until cancelled (a task of the run's task group)."""
        if not self.measuring:
            return
        while True:
            await anyio.sleep(period_s)
            await self.sample_async()

    def fields(self, requests: int) -> dict[str, Any]:
        """The ``hetsched run --json`` fields: ``board_energy_j``, ``board_energy_per_request_j``,
        ``board_energy_source`` and, where those are null, ``board_energy_note``."""
        if self.rail is None or self.samples < 2:
            note = self.note or f"the {self.rail} rail read fewer than two samples over the run"
            return {"board_energy_j": None, "board_energy_per_request_j": None, "board_energy_source": None,
                    "board_energy_note": note}
        return {"board_energy_j": self.energy_j,
                "board_energy_per_request_j": self.energy_j / requests if requests else None,
                "board_energy_source": self.source, "board_energy_samples": self.samples}


async def sampled(board: BoardEnergy | None, work: Callable[[], Awaitable[T]], *, background: bool = True) -> T:
    """``work()`` with ``board`` sampled at its start and its end and, with ``background``, every
    :data:`BOARD_SAMPLE_PERIOD_S` in between by a task of this call's own task group, cancelled
    as soon as ``work`` returns or fails (so no sampler outlives the requests)."""
    if board is None:
        return await work()
    await board.sample_async()
    async with anyio.create_task_group() as tg:
        if background:
            tg.start_soon(board.sample_every)
        result = await work()
        tg.cancel_scope.cancel()
    await board.sample_async()
    return result


async def paced_requests(
    session: Any, feeds: dict[str, Any], n: int, period_s: float, deadline_s: float, progress: Progress,
    board: BoardEnergy | None = None,
) -> Paced:
    """``n`` requests, one per ``period_s`` (wall), each judged against ``deadline_s``; ``board``
    (if given) is sampled at each request's end."""
    lat: list[float] = []
    misses = overruns = 0
    source = "modelled" if modelled_seconds(session) is not None else "wall"
    start = time.perf_counter()
    for i in range(n):
        due = start + i * period_s
        wait = due - time.perf_counter()
        if wait > 0:
            await anyio.sleep(wait)
        elif i:
            overruns += 1
        m0 = modelled_seconds(session)
        t0 = time.perf_counter()
        await session.run(feeds)
        wall = time.perf_counter() - t0
        m1 = modelled_seconds(session)
        took = m1 - m0 if source == "modelled" and m0 is not None and m1 is not None else wall
        lat.append(took)
        if took > deadline_s:
            misses += 1
        if board is not None:
            await board.sample_async()
        progress.update()
    return Paced(lat, source, misses, overruns)


def governor_summary(gov: Any) -> dict[str, Any]:
    """The governor's run as JSON-ready data (see the module docstring)."""
    st = gov.statistics()
    phases = {
        str(p): {"clocks_hz": dict(ps.clocks), "occurrences": ps.occurrences, "time_s": ps.total_s,
                 "energy_j": ps.energy_j, "tuned": ps.tuned, "tuning": ps.tuning}
        for p, ps in st.phases.items()
    }
    return {
        "phase_switches": st.phase_switches, "decisions": st.decisions, "writes": st.writes,
        "writes_per_domain": dict(st.writes_by_domain),
        "writes_per_domain_per_s": st.writes_per_domain_per_s(),
        "writes_avoided": st.writes_avoided, "locked_domains": list(st.locked_domains),
        "elapsed_s": st.elapsed_s, "energy_j": st.energy_j, "peak_temp_c": dict(st.peak_temp_c),
        "phases": phases, "tuned_phases": [str(p) for p in st.tuned_phases],
        "decisions_logged": st.decisions_logged, "dry_run": st.dry_run, "ungoverned": st.ungoverned,
        "power_budget_w": gov.config.power_budget_w, "guarded_probes": gov.config.guarded_probes,
        "guarded_probes_stopped": st.guarded_probes_stopped,
    }


def print_governor_summary(g: dict[str, Any]) -> None:
    mode = " (dry run: nothing written)" if g["dry_run"] else " (ungoverned: nothing written)" if g["ungoverned"] else ""
    print(f"\ngovernor{mode}: {g['phase_switches']} phase switches, {g['writes']} clock writes "
          f"in {g['elapsed_s']:.2f} s, {g['writes_avoided']} held back")
    for d, n in sorted(g["writes_per_domain"].items()):
        print(f"  writes {d:10} {n:6d}  ({g['writes_per_domain_per_s'].get(d, 0.0):.2f}/s)")
    print(f"{'phase':14} {'runs':>6} {'time s':>9} {'energy J':>10}  clocks (MHz)")
    for p, row in g["phases"].items():
        clocks = " ".join(f"{d}={hz / 1e6:.0f}" for d, hz in sorted(row["clocks_hz"].items()))
        print(f"{p:14} {row['occurrences']:6d} {row['time_s']:9.3f} {row['energy_j']:10.4f}  {clocks}")
    if g["peak_temp_c"]:
        hottest = max(g["peak_temp_c"].items(), key=lambda kv: kv[1])
        print(f"peak temperature: {hottest[1]:.1f} C ({hottest[0]}); "
              + ", ".join(f"{z} {t:.1f}" for z, t in sorted(g["peak_temp_c"].items())))
    print(f"locked domains (did not follow writes): {', '.join(g['locked_domains']) or 'none'}")


@contextmanager
def decision_log(enabled: bool) -> Iterator[None]:
    """With ``enabled``, the governor's decisions (logger ``hetsched.governor``, INFO) go to stderr."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("hetsched.governor")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


async def run_governed(args: argparse.Namespace, serve: Callable[[list[Any]], Awaitable[int]]) -> int:
    """``serve`` under the phase governor (``serve`` finds it on the hooks it is given)."""
    from hetsched._governor import Governor, GovernorConfig
    from hetsched._session._governed import GovernorHooks

    profile_path = Path(args.governor_profile) if args.governor_profile else None
    deadline = None if args.frame_deadline_ms is None else args.frame_deadline_ms / 1e3
    gov = Governor(
        args.root, config=GovernorConfig(slowdown=args.slowdown, power_budget_w=args.power_budget,
                                         loop_deadline_s=deadline, guarded_probes=not args.strict_budget),
        profile=profile_path if profile_path is not None and profile_path.exists() else None,
        workload=Path(str(args.model)).stem, dry_run=args.dry_run, handle_signals=False,
    )
    with decision_log(args.dry_run or args.verbose):
        # The governor restores every knob when this block exits: normally, on error, or
        # when the signal watcher cancels the run (the restore is synchronous).
        async with gov:
            rc = await serve([GovernorHooks(gov)])
            if profile_path is not None:
                gov.profile().save(profile_path)
    return rc
