"""``hetsched profile``'s report: pure functions of a plan, the timings and the capabilities.

Nothing here runs a model or opens a file: :func:`parse_ort_profile` reads onnxruntime's
profile events (already loaded), :func:`explain` says why a unit sits on its device from the
plan's own score terms, :func:`build_report` assembles the ``--json`` object and
:func:`format_report` its table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hetsched._errors import ProfileError
from hetsched._planning.graph import GraphIndex
from hetsched._planning.plan import Plan, unit_key
from hetsched.backends import Capabilities

__all__ = ["OrtRun", "UnitTiming", "Why", "build_report", "capability_gap", "explain", "format_report",
           "median_run", "node_tag", "parse_ort_profile"]

Source = Literal["measured", "modelled"]

_TAG = re.compile(r"__hs(\d+)__")


def node_tag(node_id: int) -> str:
    """The name a profiled stage gives graph node ``node_id``, so that onnxruntime's kernel
    events (named after the node: ``<name>_kernel_time``, kept by fusions into that node)
    map back to it."""
    return f"__hs{node_id}__"


@dataclass(frozen=True)
class OrtRun:
    """One ``model_run`` of an onnxruntime profile."""

    seconds: float
    nodes: Mapping[int, float]
    """Kernel seconds per tagged graph node (see :func:`node_tag`)."""
    other: Mapping[str, float] = field(default_factory=dict)
    """Kernel seconds of nodes onnxruntime added (layout reorders, copies), per op name."""


def parse_ort_profile(events: object) -> list[OrtRun]:
    """The runs of an onnxruntime profile (the JSON list ``end_profiling()`` writes), in order.

    Each ``"cat": "Session"`` ``model_run`` event is a run; the ``"cat": "Node"`` events whose
    name ends in ``_kernel_time`` and that lie inside it are its kernels (``dur`` and ``ts`` in
    microseconds). Fence events and kernels outside any run (initialisation) are left out.

    :raises ProfileError: ``events`` is not a list of event objects with numeric ``ts``/``dur``.
    """
    if not isinstance(events, list):
        raise ProfileError(f"onnxruntime profile: expected a list of events, got {type(events).__name__}")
    runs: list[tuple[float, float]] = []
    kernels: list[tuple[float, float, str, str]] = []
    try:
        for ev in events:
            if not isinstance(ev, dict):
                raise TypeError(f"event {ev!r} is not an object")
            name = str(ev.get("name", ""))
            if ev.get("cat") == "Session" and name == "model_run":
                runs.append((float(ev["ts"]), float(ev["dur"])))
            elif ev.get("cat") == "Node" and name.endswith("_kernel_time"):
                args = ev.get("args") or {}
                op = str(args.get("op_name", "?")) if isinstance(args, dict) else "?"
                kernels.append((float(ev["ts"]), float(ev["dur"]), name, op))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"onnxruntime profile: malformed event: {exc}") from exc
    runs.sort()
    out: list[OrtRun] = []
    for ts, dur in runs:
        nodes: dict[int, float] = {}
        other: dict[str, float] = {}
        for kts, kdur, name, op in kernels:
            if not ts <= kts <= ts + dur:
                continue
            m = _TAG.search(name)
            if m is None:
                other[op] = other.get(op, 0.0) + kdur * 1e-6
            else:
                nid = int(m.group(1))
                nodes[nid] = nodes.get(nid, 0.0) + kdur * 1e-6
        out.append(OrtRun(dur * 1e-6, nodes, other))
    return out


def median_run(runs: Sequence[OrtRun], *, warmup: int = 1) -> OrtRun | None:
    """The run of median duration after the first ``warmup`` ones (all runs if that leaves
    none); its kernels add up to at most its duration. None without runs."""
    kept = list(runs[warmup:]) or list(runs)
    if not kept:
        return None
    return sorted(kept, key=lambda r: r.seconds)[len(kept) // 2]


@dataclass(frozen=True)
class UnitTiming:
    """A unit timed alone on one device."""

    unit: int
    device: str
    seconds: float | None
    """Seconds per run (None when it failed: see ``error``)."""
    source: Source = "measured"
    nodes: Mapping[int, float] | None = None
    """Kernel seconds per graph node where the backend reports nodes (onnxruntime's profile)."""
    other_s: float = 0.0
    """Kernel seconds of nodes the backend added (counted in the unit, not in any node)."""
    error: str | None = None


def capability_gap(index: GraphIndex, node_ids: Iterable[int], caps: Capabilities) -> tuple[str, str] | None:
    """``(node name, op)`` of the first node of ``node_ids`` that ``caps`` cannot run (op type,
    opset and input dtypes as the partitioner checks them), or None."""
    for nid in node_ids:
        ref = index.nodes[nid]
        opset = index.opsets.get(ref.domain, index.opsets.get("", 1))
        dts: list[int | None] = []
        for name in ref.inputs[:4]:
            t = index.value_type(name)
            dts.append(t.tensor_type.elem_type if t is not None and t.WhichOneof("value") == "tensor_type" else None)
        if not caps.supports(ref.op_type, ref.domain, opset, dts):
            return ref.name, f"{ref.domain}::{ref.op_type}" if ref.domain else ref.op_type
    return None


@dataclass(frozen=True)
class Why:
    """Why a unit is on its device: ``decided_by`` is ``fastest``, ``only-candidate``,
    ``transfer``, ``start_s``, ``score``, ``energy_s``, ``consolidation`` or ``policy``."""

    text: str
    decided_by: str
    not_on: Mapping[str, str]
    """Per other device, why the unit is not there (capability, refusal, or the terms)."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _transfer_in(plan: Plan, uid: int, device: str) -> float:
    """Seconds the latest of the unit's inputs takes to reach ``device`` from where it is made."""
    problem, assignment = plan.problem, plan.placement.assignment
    return max((problem.transfer_seconds(p, uid, assignment[p], device) for p in plan.units[uid].preds),
               default=0.0)


def _compare(plan: Plan, uid: int, chosen: str, other: str) -> tuple[str, str]:
    """``(term, sentence)``: the score term that made the policy prefer ``chosen`` to ``other``."""
    scores = plan.placement.scores.get(uid, {})
    tc, to = scores.get(chosen), scores.get(other)
    policy = plan.placement.policy
    key = next((k for k in ("effective_s", "score_s") if tc and to and k in tc and k in to), None)
    if tc is None or to is None or key is None:
        return "policy", f"the {policy} policy chose {chosen} (it keeps no score terms to compare)"
    if tc[key] > to[key]:
        return "consolidation", (f"its own {key} favoured {other} ({_ms(to[key])} vs {_ms(tc[key])}); "
                                 f"consolidation moved it to {chosen} with its neighbours (fewer stage boundaries)")

    def parts(t: Mapping[str, float]) -> dict[str, float]:
        start, energy = t.get("start_s", 0.0), t.get("energy_s", 0.0)
        return {"start_s": start, "energy_s": energy, "latency": t[key] - start - energy}

    pc, po = parts(tc), parts(to)
    deltas = {k: po[k] - pc[k] for k in pc}
    term = max(deltas, key=lambda k: deltas[k])
    if term == "start_s":
        xfer = _transfer_in(plan, uid, other) - _transfer_in(plan, uid, chosen)
        if xfer >= deltas["start_s"] / 2:
            return "transfer", (f"its inputs would reach {other} {_ms(xfer)} later (transfer cost), "
                                f"so it could start only at {_ms(to['start_s'])} vs {_ms(tc['start_s'])}")
        return "start_s", (f"{other} is busy with earlier units: it could start at {_ms(to['start_s'])} "
                           f"vs {_ms(tc['start_s'])} on {chosen}")
    if term == "energy_s":
        ej = f" ({to['energy_j']:.3g} J vs {tc['energy_j']:.3g} J)" if "energy_j" in to and "energy_j" in tc else ""
        return "energy_s", (f"it would spend more energy on {other}{ej}: an energy term of "
                            f"{_ms(to['energy_s'])} vs {_ms(tc['energy_s'])}")
    if "score" in to and "score" in tc:
        return "score", (f"{other}'s headroom score is {to['score']:.2f} vs {tc['score']:.2f} (utilisation "
                         f"{to.get('util', 0.0):.2f}, temperature headroom {to.get('temp_headroom', 0.0):.2f}, "
                         f"power headroom {to.get('power_headroom', 0.0):.2f}): latency/score "
                         f"{_ms(po['latency'])} vs {_ms(pc['latency'])}")
    return "latency", f"its {key} is {_ms(to[key])} on {other} vs {_ms(tc[key])} on {chosen}"


def explain(plan: Plan, uid: int, gaps: Mapping[str, tuple[str, str]]) -> Why:
    """Why unit ``uid`` of ``plan`` is on its device and not on the others.

    ``gaps[device]``: the ``(node, op)`` a device that is not a candidate cannot run (see
    :func:`capability_gap`). The fastest candidate is the one of least planned latency (the
    cost the planner used); when it is not the chosen one, the score term with the largest
    difference in the chosen device's favour decided (``transfer`` when the later start is
    the inputs' transfer).
    """
    unit = plan.units[uid]
    chosen = plan.placement.assignment[uid]
    refused = {r.device: r.reason for r in plan.refused if r.unit == uid}
    lat = {d: plan.problem.cost[(uid, d)] for d in unit.candidates}
    not_on: dict[str, str] = {}
    for dev in plan.devices:
        d = dev.name
        if d == chosen:
            continue
        if d in refused:
            not_on[d] = f"refused by its backend: {refused[d]}"
        elif d not in lat:
            gap = gaps.get(d)
            not_on[d] = (f"not a candidate: op {gap[1]} (node {gap[0]!r}) is not supported there" if gap
                         else "not a candidate (its backend's capabilities exclude the unit)")
        elif lat[d] >= lat[chosen]:
            not_on[d] = f"slower: {_ms(lat[d])} vs {_ms(lat[chosen])}"
        else:
            not_on[d] = f"faster ({_ms(lat[d])} vs {_ms(lat[chosen])}), but {_compare(plan, uid, chosen, d)[1]}"
    if len(lat) == 1:
        return Why(f"{chosen} is its only candidate", "only-candidate", not_on)
    fastest = min(lat, key=lambda d: (lat[d], d != chosen))
    if fastest == chosen:
        return Why(f"on its fastest candidate ({_ms(lat[chosen])})", "fastest", not_on)
    term, sentence = _compare(plan, uid, chosen, fastest)
    return Why(f"not on the faster {fastest} ({_ms(lat[fastest])} vs {_ms(lat[chosen])}): {sentence}",
               term, not_on)


_CONSTANT = "it computes constants only: copied into the stages that read it, it never runs alone"


def build_report(index: GraphIndex, plan: Plan, timings: Sequence[UnitTiming], costs: Mapping[str, Any],
                 gaps: Mapping[int, Mapping[str, tuple[str, str]]], notes: Sequence[str] = ()) -> dict[str, Any]:
    """The ``--json`` object: ``units``, ``nodes``, ``costs`` (the cost table as
    :meth:`CostTable.to_json` gives it), ``devices``, ``stages`` and ``notes``.

    ``gaps[unit][device]`` as :func:`explain` takes it. A unit's ``seconds[device]`` is its
    time alone there (``source[device]``: ``measured``, or ``modelled`` by the twin),
    ``node_sum_s[device]`` the sum of its kernels where the backend reports nodes (its nodes'
    plus ``other_s[device]``, the kernels onnxruntime added); a unit
    with ``runs`` false only computes constants (``decided_by``: ``constant``).
    """
    from hetsched._session._profiling import unit_stage_specs

    running = {s.units[0] for s in unit_stage_specs(index, plan)}
    by_unit: dict[int, dict[str, UnitTiming]] = {}
    for t in timings:
        by_unit.setdefault(t.unit, {})[t.device] = t
    units: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    for u in plan.units:
        mine = by_unit.get(u.id, {})
        why = explain(plan, u.id, gaps.get(u.id, {}))
        if u.id not in running:
            why = Why(_CONSTANT, "constant", why.not_on)
        units.append({
            "id": u.id, "key": unit_key(index, plan.unit_nodes[u.id]), "nodes": list(u.nodes),
            "op_types": list(u.op_types), "candidates": list(u.candidates), "runs": u.id in running,
            "device": plan.placement.assignment[u.id],
            "seconds": {d: t.seconds for d, t in mine.items() if t.seconds is not None},
            "source": {d: t.source for d, t in mine.items() if t.seconds is not None},
            "node_sum_s": {d: sum(t.nodes.values()) + t.other_s for d, t in mine.items() if t.nodes is not None},
            "other_s": {d: t.other_s for d, t in mine.items() if t.nodes is not None},
            "planned_s": {d: plan.problem.cost[(u.id, d)] for d in u.candidates},
            "errors": {d: t.error for d, t in mine.items() if t.error is not None},
            "refused": {r.device: r.reason for r in plan.refused if r.unit == u.id},
            "scores": {d: dict(s) for d, s in plan.placement.scores.get(u.id, {}).items()},
            "why": why.text, "decided_by": why.decided_by, "not_on": dict(why.not_on),
        })
        for nid, name, op in zip(plan.unit_nodes[u.id], u.nodes, u.op_types, strict=True):
            per_dev = {d: t.nodes[nid] for d, t in mine.items() if t.nodes is not None and nid in t.nodes}
            no_kernel = sorted(d for d, t in mine.items() if t.nodes is not None and nid not in t.nodes)
            nodes.append({"name": name, "op_type": op, "unit": u.id, "seconds": per_dev, "no_kernel": no_kernel})
    sources: dict[str, set[str]] = {}
    for t in timings:
        if t.seconds is not None:
            sources.setdefault(t.device, set()).add(t.source)
    per_node = {t.device for t in timings if t.nodes is not None}
    devices = [{"name": d.name, "kind": d.kind, "backend": d.backend, "cpus": list(d.cpus),
                "source": "/".join(sorted(sources.get(d.name, ()))) or None, "per_node": d.name in per_node}
               for d in plan.devices]
    stages = [{"name": s.name, "device": s.device, "units": list(s.units)} for s in plan.stages]
    return {"policy": plan.placement.policy, "units": units, "nodes": nodes, "costs": dict(costs),
            "devices": devices, "stages": stages, "notes": list(notes)}


def format_report(report: Mapping[str, Any], *, top_nodes: int = 8) -> str:
    """The report as text: a row per unit (its time on each device, ``m`` = modelled; ``*`` =
    where it runs), why it sits there, the slowest nodes per device, then the notes."""
    devs = [d["name"] for d in report["devices"]]
    lines = [f"policy: {report['policy']}; devices: {', '.join(devs)}", ""]
    head = ["unit", "ops"] + [f"{d} ms" for d in devs]
    rows = [head]
    for u in report["units"]:
        if not u["runs"]:
            continue
        ops: dict[str, int] = {}
        for op in u["op_types"]:
            ops[op] = ops.get(op, 0) + 1
        top = ",".join(f"{k}x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:3])
        cells = [str(u["id"]), top]
        for d in devs:
            s = u["seconds"].get(d)
            mark = ("m" if u["source"].get(d) == "modelled" else "") + ("*" if d == u["device"] else "")
            cells.append("-" if s is None else f"{s * 1e3:.3f}{mark}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("why each unit is where it is:")
    constant = [u for u in report["units"] if not u["runs"]]
    if constant:
        kinds = ", ".join(sorted({op for u in constant for op in u["op_types"]}))
        lines.append(f"  {len(constant)} unit(s) computing constants ({kinds}) are copied into the stages "
                     "that read them and never run alone")
    for u in report["units"]:
        if not u["runs"]:
            continue
        lines.append(f"  unit {u['id']} on {u['device']}: {u['why']}")
        for d, reason in u["not_on"].items():
            if not reason.startswith("slower"):
                lines.append(f"      not on {d}: {reason}")
    for d in devs:
        timed = sorted(((n["seconds"][d], n["name"], n["op_type"]) for n in report["nodes"] if d in n["seconds"]),
                       reverse=True)
        if timed:
            lines.append("")
            lines.append(f"slowest nodes on {d} (onnxruntime profile):")
            for s, name, op in timed[:top_nodes]:
                lines.append(f"  {s * 1e3:9.3f} ms  {op:18} {name}")
    entries = report["costs"].get("seconds", [])
    lines.append("")
    lines.append(f"cost table: {len(entries)} measured (unit, device) entries; the plan above uses them")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
