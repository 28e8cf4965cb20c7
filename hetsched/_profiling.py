"""Profiling: measure every unit of a plan on every device that can run all of them.

Used by ``Session.profile()``, which runs :func:`profile_units` in a worker thread while the
session's device workers are idle and then re-plans with the measured costs.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hetsched.backends import get_backend

from ._errors import BackendError
from ._planning.costs import CostTable
from ._planning.graph import GraphIndex
from ._planning.partition import UnitDraft, extract_stage, merge_stages
from ._planning.plan import Plan, unit_key
from ._platform.affinity import pin_current_thread

__all__ = ["profile_units"]


def profile_units(index: GraphIndex, plan: Plan, feeds: dict[str, Any], repeats: int, costs: CostTable) -> None:
    """Run each unit of ``plan`` alone, in topological order, on each device that is a
    candidate for every unit (pinned to its CPUs), and put the median of ``repeats`` runs
    into ``costs`` under the unit's key.

    A device whose backend fails on some unit (:class:`BackendError`) is skipped from there
    on; the units measured before stay in ``costs``. Blocking: call it from a worker thread.
    """
    by_name = {d.name: d for d in plan.devices}
    node_of_name = {n.name: n.index for n in index.nodes}
    drafts_nodes = [tuple(node_of_name[n] for n in u.nodes) for u in plan.units]
    for dev_name, dev in by_name.items():
        if any(dev_name not in u.candidates for u in plan.units):
            continue
        drafts = [UnitDraft(u.id, drafts_nodes[u.id], 1) for u in plan.units]
        # One stage per unit: give each unit a distinct pseudo-device so nothing merges.
        assignment = {u.id: f"u{u.id}" for u in plan.units}
        specs = merge_stages(index, drafts, assignment, [u.preds for u in plan.units],
                             [u.succs for u in plan.units])
        values = dict(feeds)
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
                    own = getattr(compiled, "last_run_seconds", None)
                    for _ in range(max(1, repeats)):
                        t0 = time.perf_counter()
                        out = compiled.run(stage_feeds)
                        times.append(time.perf_counter() - t0 if not callable(own) else float(own()))
                    for name, v in zip(compiled.output_names, out, strict=False):
                        values[name] = v
                    times.sort()
                    uid = spec.units[0]
                    costs.update(unit_key(index, drafts_nodes[uid]), dev_name, times[len(times) // 2])
                finally:
                    compiled.close()
        except BackendError:
            continue
        finally:
            if prev is not None:
                os.sched_setaffinity(0, prev)
