"""Profiling: measure every unit of a plan on every device that can run all of them.

Used by ``Session.profile()``, which runs :func:`profile_units` in a worker thread while the
session's device workers are idle and then re-plans with the measured costs; ``hetsched
profile`` also takes :func:`unit_stage_specs` to time each unit alone on each candidate.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from hetsched.backends import get_backend

from .._errors import BackendError
from .._planning.costs import CostTable
from .._planning.graph import GraphIndex
from .._planning.partition import StageSpec, UnitDraft, extract_stage, merge_stages
from .._planning.plan import Plan, unit_key
from .._platform.affinity import pin_current_thread

__all__ = ["ProgressCallback", "profile_units", "unit_stage_specs"]

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` after each unit measured (from the profiling thread)."""


def unit_stage_specs(index: GraphIndex, plan: Plan) -> list[StageSpec]:
    """One stage per unit of ``plan``, in topological order (``spec.units == (unit_id,)``)."""
    drafts = [UnitDraft(u.id, tuple(plan.unit_nodes[u.id]), 1) for u in plan.units]
    # a distinct pseudo-device per unit, so that nothing merges
    assignment = {u.id: f"u{u.id}" for u in plan.units}
    return merge_stages(index, drafts, assignment, [list(u.preds) for u in plan.units],
                        [list(u.succs) for u in plan.units])


def profile_units(index: GraphIndex, plan: Plan, feeds: dict[str, Any], repeats: int, costs: CostTable,
                  progress: ProgressCallback | None = None, *,
                  perf_counter: Callable[[], float] = time.perf_counter) -> None:
    """Run each unit of ``plan`` alone, in topological order, on each device that is a
    candidate for every unit that runs as a stage of its own (pinned to its CPUs), and put
    the median of ``repeats`` runs into ``costs`` under the unit's key. Units that only
    compute constants are copied into the stages that read them (see ``merge_stages``), so
    they neither run alone nor keep a device from being measured.

    A device whose backend fails on some unit (:class:`BackendError`) is skipped from there
    on; the units measured before stay in ``costs``. Blocking: call it from a worker thread.

    :param progress: called as ``progress(done, total)`` after each unit (``total``: units
        run times measured devices; a skipped device's remaining units count as done).
    """
    by_name = {d.name: d for d in plan.devices}
    specs = unit_stage_specs(index, plan)
    running = [plan.units[s.units[0]] for s in specs]
    measured = [name for name in by_name if all(name in u.candidates for u in running)]
    total = len(measured) * len(specs)
    done = 0
    if progress is not None:
        progress(done, total)
    for dev_name in measured:
        dev = by_name[dev_name]
        values = dict(feeds)
        dev_done = 0
        prev = pin_current_thread(dev.cpus)
        try:
            for spec in specs:
                compiled = get_backend(dev.backend).compile(extract_stage(index, spec), dev, name=spec.name)
                try:
                    stage_feeds = {n: values[n] for n in spec.inputs if n in values}
                    times = []
                    out: list[Any] = []
                    # a backend that knows its own run time (a twin stage's modelled board
                    # seconds) is measured by it, as the runtime learns it
                    own = compiled.hooks.modelled
                    for _ in range(max(1, repeats)):
                        t0 = perf_counter()
                        out = compiled.run(stage_feeds)
                        times.append(perf_counter() - t0 if own is None else float(own.last_run_seconds()))
                    for name, v in zip(compiled.output_names, out, strict=False):
                        values[name] = v
                    times.sort()
                    uid = spec.units[0]
                    costs.update(unit_key(index, plan.unit_nodes[uid]), dev_name, times[len(times) // 2])
                finally:
                    compiled.close()
                dev_done += 1
                if progress is not None:
                    progress(done + dev_done, total)
        except BackendError:
            continue
        finally:
            if prev is not None:
                os.sched_setaffinity(0, prev)
            done += len(specs)
            if progress is not None and dev_done < len(specs):
                progress(done, total)
