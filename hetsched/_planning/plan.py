"""Planning: partition a model, place units with a policy, merge into stages."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hetsched._errors import PartitionError, PlacementError
from hetsched.backends import Capabilities, Device, get_backend
from hetsched.policies import (
    HEFT,
    DeviceState,
    Link,
    Placement,
    PlacementPolicy,
    PlacementProblem,
    PowerThermalWeighted,
    Reservation,
    Unit,
    get_policy,
    policy_name,
    validate_placement,
)

from .coarsen import coarsen
from .costs import (
    BOUNDARY,
    BoundaryCosts,
    CostTable,
    NodeCost,
    analytic_node_costs,
    device_rates,
    device_seconds,
    modelled_energy_j,
    storage_fraction,
    sync_seconds_per_byte,
    unit_overhead,
    value_bytes,
)
from .graph import GraphIndex
from .partition import StageSpec, UnitDraft, compute_units, constant_nodes, input_dtypes, merge_stages

__all__ = ["OffloadNote", "OffloadReason", "Plan", "Refusal", "build_plan", "unit_key"]

_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def unit_key(index: GraphIndex, nodes: Sequence[int]) -> str:
    """Stable signature of a group of nodes (for the cost table)."""
    first = index.nodes[nodes[0]].name
    last = index.nodes[nodes[-1]].name
    return f"{first}..{last}#{len(nodes)}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A device whose backend refused to compile a unit its capabilities claimed (found by
    trying: see ``hetsched/_session/_setup.py``); the unit is not offered to that device."""

    unit: int
    device: str
    reason: str
    """The backend's own message (a :class:`CompileError`'s text)."""


class OffloadReason(str, Enum):
    """Why a unit is not on the plan's NPU (:attr:`Plan.offload`)."""

    REFUSED = "refused"
    """The backend tried and refused it (the toolkit's message is the note's detail)."""
    UNSUPPORTED_OP = "unsupported-op"
    """An op (or its input types) the NPU's op list does not run."""
    CONTROL_FLOW = "control-flow"
    """If/Loop/Scan: a subgraph the NPU cannot run."""
    TOO_SMALL = "too-small"
    """It could run there, but its stage would not pay for its boundary (:class:`BoundaryCosts`)."""
    SLOWER = "slower"
    """It could run there; the policy estimated it finishes sooner elsewhere."""


@dataclass(frozen=True, slots=True)
class OffloadNote:
    """A unit not placed on the NPU ``npu`` although the plan has one, and why."""

    unit: int
    npu: str
    device: str
    """Where the unit runs instead."""
    reason: OffloadReason
    detail: str


@dataclass(frozen=True)
class Plan:
    """The outcome of planning: stages, the placement of units, and why."""

    stages: tuple[StageSpec, ...]
    units: tuple[Unit, ...]
    placement: Placement
    devices: tuple[Device, ...]
    problem: PlacementProblem = field(repr=False)
    graph_inputs: tuple[str, ...] = ()
    graph_outputs: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()
    """(unit, device) pairs the op lists offered but the backend refused to compile."""
    unit_nodes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    stage_accuracy: Mapping[str, Mapping[str, float | int]] = field(default_factory=dict)
    """Per stage name, its backend's accuracy against fp32 onnxruntime where the backend measured
    one once compiled (``min_cosine``, ``max_rel_error``, ``samples``: NPU stages)."""
    """Per unit id, its node indices in the graph index (to extract a unit alone)."""
    stage_flops: tuple[float, ...] = field(default=(), repr=False)
    """Per stage id, the analytic FLOPs of its nodes."""
    device_states: Mapping[str, DeviceState] = field(default_factory=dict)
    """Per device, the state the policy was given for this plan (defaults where none was known)."""
    stage_bytes: tuple[float, ...] = field(default=(), repr=False)
    """Per stage id, the analytic bytes its nodes move."""
    stage_modelled: tuple[float | None, ...] = field(default=(), repr=False)
    """Per stage id: on a twin-modelled device whose units have no measured cost, the calibration
    factor its estimate takes (1.0 without a cost table); None where the estimate is the sum of
    its units' costs."""
    offload: tuple[OffloadNote, ...] = ()
    """Per unit not on the plan's NPU (when it has one): where it runs and why not on the NPU."""

    def backend_of(self, device: str) -> str:
        """The backend name of the plan's device called ``device``."""
        return next(d.backend for d in self.devices if d.name == device)

    def stage_costs(self) -> dict[int, float]:
        """Expected seconds per stage: on a twin-modelled device, the twin's own model of the whole
        stage at the device's clocks *now* (:func:`~hetsched._planning.costs.roofline`, what its
        stage will report as its modelled time, so a governor raising a clock moves both alike);
        else the sum of its units' costs (measured where known)."""
        out: dict[int, float] = {}
        modelled = self.stage_modelled if len(self.stage_modelled) == len(self.stages) else ()
        for s in self.stages:
            factor = modelled[s.id] if modelled else None
            if factor is not None:
                dev = next(d for d in self.devices if d.name == s.device)
                out[s.id] = device_seconds(dev, self.stage_flops[s.id], self.stage_bytes[s.id]) * factor
            else:
                out[s.id] = sum(self.problem.cost[(u, s.device)] for u in s.units)
        return out

    def table(self, op_limit: int = 4, reason_chars: int = 72) -> str:
        """A readable placement table; below it, each refused (unit, device) pair with the
        backend's reason (shortened to ``reason_chars``)."""
        costs = self.stage_costs()
        rows = [("stage", "device", "nodes", "units", "deps", "est ms", "ops")]
        for s in self.stages:
            ops: dict[str, int] = {}
            for u in s.units:
                for op in self.units[u].op_types:
                    ops[op] = ops.get(op, 0) + 1
            top = ", ".join(f"{k}x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:op_limit])
            rows.append((s.name, s.device, str(len(s.nodes)), str(len(s.units)),
                         ",".join(str(d) for d in s.deps) or "-", f"{costs[s.id] * 1e3:.3f}", top))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if self.refused:
            lines.append("")
            lines.append("refused by a backend (unit placed elsewhere):")
            for r in self.refused:
                kinds = ", ".join(sorted(set(self.units[r.unit].op_types))[:op_limit])
                lines.append(f"  unit {r.unit} ({kinds}) not on {r.device}: {_shorten(r.reason, reason_chars)}")
        if self.offload:
            lines.append("")
            lines.append("not on the NPU:")
            grouped: dict[tuple[str, str, OffloadReason], list[OffloadNote]] = {}
            for note in self.offload:
                grouped.setdefault((note.npu, note.device, note.reason), []).append(note)
            for (npu, dev, reason), notes in grouped.items():
                uids = [n.unit for n in notes]
                which = ", ".join(str(u) for u in uids[:6]) + (f" (+{len(uids) - 6})" if len(uids) > 6 else "")
                details = list(dict.fromkeys(n.detail for n in notes))
                more = f" (+{len(details) - 1} more)" if len(details) > 1 else ""
                lines.append(f"  unit{'s' if len(uids) > 1 else ''} {which} on {dev}, not {npu}: {reason.value}: "
                             f"{_shorten(details[0], reason_chars)}{more}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        costs = self.stage_costs()
        return {
            "policy": self.placement.policy,
            "devices": [
                {"name": d.name, "kind": d.kind, "cpus": list(d.cpus), "memory_domain": d.memory_domain,
                 "domain": d.domain, "role": d.options.get("role")}
                for d in self.devices
            ],
            "stages": [
                {"id": s.id, "name": s.name, "device": s.device, "backend": self.backend_of(s.device),
                 "nodes": len(s.nodes), "flops": self.stage_flops[s.id] if self.stage_flops else 0.0,
                 "units": list(s.units), "inputs": list(s.inputs), "outputs": list(s.outputs),
                 "deps": list(s.deps), "estimated_s": costs[s.id],
                 **({"accuracy": dict(self.stage_accuracy[s.name])} if s.name in self.stage_accuracy else {})}
                for s in self.stages
            ],
            "units": [
                {"id": u.id, "nodes": list(u.nodes), "candidates": list(u.candidates),
                 "device": self.placement.assignment[u.id],
                 "scores": {d: dict(t) for d, t in self.placement.scores.get(u.id, {}).items()}}
                for u in self.units
            ],
            "refused": [{"unit": r.unit, "device": r.device, "reason": r.reason} for r in self.refused],
            "offload": [{"unit": n.unit, "npu": n.npu, "device": n.device, "reason": n.reason.value,
                         "detail": n.detail} for n in self.offload],
            "device_states": {name: _state_json(st) for name, st in self.device_states.items()},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)


def _state_json(state: DeviceState) -> dict[str, Any]:
    out: dict[str, Any] = {"utilisation": state.utilisation, "temp_headroom": state.temp_headroom,
                           "power_headroom": state.power_headroom}
    if state.inputs is not None:
        out["inputs"] = dataclasses.asdict(state.inputs)
    return out


def _shorten(text: str, limit: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: max(1, limit - 3)] + "..."


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while planning.

    Planning allocates a few container objects per node and unit, none of them in
    reference cycles; with the collector on, every full collection re-walks the whole
    model (protobufs, index) and planning turns superlinear in graph size. Reference
    counting still frees everything; the collector is re-enabled (if it was on) after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_plan(
    index: GraphIndex,
    devices: Sequence[Device],
    policy: PlacementPolicy | str | None = None,
    *,
    max_unit_nodes: int | None = None,
    device_states: Mapping[str, DeviceState] | None = None,
    costs: CostTable | None = None,
    capabilities: Mapping[str, Capabilities] | None = None,
    node_costs: Sequence[NodeCost] | None = None,
    refused: Mapping[tuple[str, str], str] | None = None,
    boundary: BoundaryCosts | None = None,
    reservations: Sequence[Reservation] = (),
    priority: int = 2,
    slo_s: float | None = None,
    rate_hz: float | None = None,
) -> Plan:
    """Partition ``index`` for ``devices`` and place it with ``policy``.

    :param reservations: other sessions' load on the devices (:class:`~hetsched.policies.Reservation`),
        ``priority`` this model's (a ``hetsched.Priority`` value), ``slo_s`` its deadline per
        request and ``rate_hz`` its offered requests per second (None: unknown or a closed loop):
        passed to the policy in the :class:`~hetsched.policies.PlacementProblem`; the stage
        fold weighs the costs with the reservations priced in (``problem.contended()``).

    :param boundary: what a stage boundary costs (:class:`~hetsched._planning.costs.BoundaryCosts`,
        default :data:`~hetsched._planning.costs.BOUNDARY`); after a built-in policy (HEFT,
        PowerThermalWeighted with ``consolidate``) placed the units, groups that do not pay for
        their boundary move whole to a device around them (:func:`~hetsched._planning.coarsen.coarsen`).
        A user's policy (and ``Pinned``, ``RandomPolicy``) is taken as it answers.

    :param refused: ``{(unit_key, device): reason}``: pairs a backend refused to compile
        although its capabilities claimed the unit's ops; the unit is not offered to that
        device (its candidates lose it) and the plan reports the reason.
    :raises PartitionError: an op no device can run, or a unit every capable device refused
        (the message names the unit and each device's reason).
    :param device_states: per device name, what the policy sees of it (e.g. from
        :func:`hetsched._planning.states.device_states`); devices left out get a default state.
    :raises PlacementError: the policy raised (wrapped, naming the policy; a ``PlacementError``
        of its own passes through) or its answer is unusable.
    """
    with _gc_paused():
        return _build_plan(index, devices, policy, max_unit_nodes=max_unit_nodes, device_states=device_states,
                           costs=costs, capabilities=capabilities, node_costs=node_costs,
                           refused=refused or {}, boundary=boundary or BOUNDARY,
                           contention=_Contention(tuple(reservations), int(priority), slo_s, rate_hz))


def _build_plan(
    index: GraphIndex,
    devices: Sequence[Device],
    policy: PlacementPolicy | str | None,
    *,
    max_unit_nodes: int | None,
    device_states: Mapping[str, DeviceState] | None,
    costs: CostTable | None,
    capabilities: Mapping[str, Capabilities] | None,
    node_costs: Sequence[NodeCost] | None,
    refused: Mapping[tuple[str, str], str],
    boundary: BoundaryCosts,
    contention: _Contention | None = None,
) -> Plan:
    pol = get_policy(policy)
    caps = dict(capabilities) if capabilities is not None else {
        d.name: get_backend(d.backend).capabilities(d) for d in devices
    }
    drafts = compute_units(index, [d.name for d in devices], caps, max_unit_nodes=max_unit_nodes)
    if node_costs is None:
        node_costs = analytic_node_costs(index)
    graph = _UnitGraph(index, drafts)
    priced = _price_units(index, drafts, graph, devices, node_costs, costs, refused, boundary)
    states = {d.name: DeviceState(name=d.name, kind=d.kind, memory_domain=d.memory_domain) for d in devices}
    for k, st in (device_states or {}).items():
        if k in states:
            states[k] = st
    load = contention or _Contention()
    problem = PlacementProblem(tuple(priced.units), states, priced.cost, graph.edges, _links(devices, boundary),
                               priced.energy, reservations=load.reservations, priority=load.priority,
                               slo_s=load.slo_s, rate_hz=load.rate_hz)
    placement, left = _place_and_fold(pol, problem, devices, boundary)
    stages = merge_stages(index, drafts, placement.assignment, graph.preds, graph.succs)
    return Plan(
        stages=tuple(stages),
        units=tuple(priced.units),
        placement=placement,
        devices=tuple(devices),
        problem=problem,
        graph_inputs=tuple(index.required_inputs),
        graph_outputs=tuple(index.graph_outputs),
        refused=tuple(priced.refusals),
        unit_nodes=tuple(u.nodes for u in drafts),
        stage_flops=tuple(sum(node_costs[n].flops for n in st.nodes) for st in stages),
        stage_bytes=tuple(sum(node_costs[n].bytes for n in st.nodes) for st in stages),
        stage_modelled=_stage_modelled(index, drafts, stages, devices, costs),
        device_states=states,
        offload=_offload_notes(index, devices, caps, priced.units, drafts, placement.assignment, priced.refusals,
                               left, priced.cost),
    )


@dataclass(frozen=True)
class _Contention:
    """What other sessions and this model's load ask of the placement (see :func:`build_plan`)."""

    reservations: tuple[Reservation, ...] = ()
    priority: int = 2
    slo_s: float | None = None
    rate_hz: float | None = None


class _UnitGraph:
    """The units' dependency graph: per unit its predecessor and successor units (in first-seen
    order), and the bytes on each edge (each value's size counted once per reading unit).

    A unit computing constants only (:func:`constant_nodes`, no graph output among them) is
    rematerialized in every stage reading it (:func:`merge_stages`): nothing crosses a boundary
    from it per request, so it has no edges (a generated model's ``ConstantOfShape`` weights
    would otherwise price every convolution's weights as a transfer from wherever the
    constant was placed, and tie the convolutions to that device)."""

    def __init__(self, index: GraphIndex, drafts: Sequence[UnitDraft]):
        node_unit = [0] * len(index.nodes)
        for u in drafts:
            for nid in u.nodes:
                node_unit[nid] = u.id
        const = constant_nodes(index)
        outputs = set(index.graph_outputs)
        const_unit = [bool(u.nodes) and all(const[n] for n in u.nodes)
                      and not any(o in outputs for n in u.nodes for o in index.nodes[n].outputs) for u in drafts]
        preds: list[dict[int, None]] = [{} for _ in drafts]
        succs: list[dict[int, None]] = [{} for _ in drafts]
        edges: dict[tuple[int, int], float] = {}
        nbytes_of: dict[str, float] = {}  # value sizes, computed once per value (not per reader)
        nodes_ref = index.nodes
        producer = index.producer
        for u in drafts:
            uid = u.id
            preds_u = preds[uid]
            for nid in u.nodes:
                for v in nodes_ref[nid].inputs:
                    p = producer.get(v)
                    if p is None:
                        continue
                    pu = node_unit[p]
                    if pu != uid and not const_unit[pu]:
                        preds_u[pu] = None
                        succs[pu][uid] = None
                        vb = nbytes_of.get(v)
                        if vb is None:
                            vb = nbytes_of[v] = value_bytes(index, v)
                        edges[(pu, uid)] = edges.get((pu, uid), 0.0) + vb
        self.preds: list[tuple[int, ...]] = [tuple(p) for p in preds]
        self.succs: list[tuple[int, ...]] = [tuple(s) for s in succs]
        self.edges = edges


@dataclass
class _Priced:
    """Units as the policy sees them, with their costs and energy per candidate device."""

    units: list[Unit] = field(default_factory=list)
    cost: dict[tuple[int, str], float] = field(default_factory=dict)
    energy: dict[tuple[int, str], float] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)


def _price_units(index: GraphIndex, drafts: Sequence[UnitDraft], graph: _UnitGraph, devices: Sequence[Device],
                 node_costs: Sequence[NodeCost], costs: CostTable | None, refused: Mapping[tuple[str, str], str],
                 boundary: BoundaryCosts) -> _Priced:
    """Each unit's candidates (less the devices that refused it) and its estimated seconds on
    each: measured where ``costs`` knows it, else the roofline (:func:`device_seconds`: compute
    or memory time, whichever is longer, plus the unit overhead) times the device's calibration."""
    names = [d.name for d in devices]
    out = _Priced()
    cost, energy = out.cost, out.energy
    cands_of: dict[int, tuple[str, ...]] = {}  # per capability mask
    # Per device, its rates now (a twin device's clocks are read once per plan, not per unit), the
    # bytes rate in analytic bytes (its storage width applied, as roofline does).
    # Energy is linear in FLOPs (modelled_energy_j): joules per FLOP once per device.
    rates = {d.name: (device_rates(d)[0], device_rates(d)[1] / storage_fraction(d), unit_overhead(d, boundary),
                      modelled_energy_j(d, 1.0)) for d in devices}
    factor = {d: 1.0 if costs is None else costs.factor(d) for d in names}
    nodes_ref = index.nodes
    for u in drafts:
        cands = cands_of.get(u.mask)
        if cands is None:
            cands = cands_of[u.mask] = tuple(names[b] for b in range(len(names)) if u.mask >> b & 1)
        if len(u.nodes) == 1:
            nc = node_costs[u.nodes[0]]
            flops, nbytes = nc.flops, nc.bytes
        else:
            flops = sum(node_costs[n].flops for n in u.nodes)
            nbytes = sum(node_costs[n].bytes for n in u.nodes)
        key = unit_key(index, u.nodes) if costs is not None or refused else ""
        if refused:
            cands = _drop_refused(index, u.id, u.nodes, key, cands, refused, out.refusals)
        for dname in cands:
            fps, bps, over, j_per_flop = rates[dname]
            t_c, t_m = flops / fps, nbytes / bps
            est = (t_c if t_c > t_m else t_m) + over
            measured = costs.get(key, dname) if costs is not None else None
            cost[(u.id, dname)] = measured if measured is not None else est * factor[dname]
            if j_per_flop is not None:
                energy[(u.id, dname)] = j_per_flop * flops
        names_u: tuple[str, ...]
        ops_u: tuple[str, ...]
        if len(u.nodes) == 1:
            ref = nodes_ref[u.nodes[0]]
            names_u, ops_u = (ref.name,), (ref.op_type,)
        else:
            names_u = tuple(nodes_ref[n].name for n in u.nodes)
            ops_u = tuple(nodes_ref[n].op_type for n in u.nodes)
        out.units.append(Unit(
            id=u.id,
            nodes=names_u,
            op_types=ops_u,
            candidates=cands,
            preds=graph.preds[u.id],
            succs=graph.succs[u.id],
            flops=flops,
            bytes=nbytes,
        ))
    return out


def _links(devices: Sequence[Device], boundary: BoundaryCosts) -> dict[tuple[str, str], Link]:
    """Per ordered device pair, a hand-off's fixed seconds (dispatch, the receiver's launch) and
    seconds per byte (a cache sync in one memory domain, the link across domains)."""
    links: dict[tuple[str, str], Link] = {}
    for a in devices:
        for b in devices:
            if a.name != b.name:
                if a.memory_domain == b.memory_domain:
                    spb = sync_seconds_per_byte(a, b)
                else:
                    spb = 1.0 / boundary.cross_domain_bps
                links[(a.name, b.name)] = Link(boundary.dispatch_latency_s + boundary.launch(b), spb)
    return links


def _place_and_fold(pol: PlacementPolicy, problem: PlacementProblem, devices: Sequence[Device],
                    boundary: BoundaryCosts) -> tuple[Placement, dict[int, str]]:
    """The policy's placement, validated; after a built-in policy, with the groups that do not
    pay for their boundary moved (:func:`coarsen`), and per moved unit the device it left."""
    builtin: HEFT | PowerThermalWeighted | None = pol if isinstance(pol, (HEFT, PowerThermalWeighted)) else None
    fold = builtin is not None and builtin.consolidate and boundary.fold_sweeps > 0
    if builtin is not None and fold:
        # The stage fold below replaces the policy's own consolidation (a schedule re-run per
        # candidate move: quadratic on long graphs) with one linear in units per sweep.
        builtin = copy.copy(builtin)
        builtin.consolidate = False
        pol = builtin
    placement = validate_placement(problem, _place(pol, problem), policy_name(pol))
    if not fold:
        return placement, {}
    weight = None
    if isinstance(builtin, PowerThermalWeighted):
        ptw = builtin
        weight = {name: 1.0 / max(ptw.score(ds.utilisation, ds.temp_headroom, ds.power_headroom),
                                  ptw.min_score) ** ptw.sharpness for name, ds in problem.devices.items()}
    # (with other sessions' reservations priced in: no move back onto a device they keep busy)
    folded, left = coarsen(problem.contended(), placement.assignment, {d.name: boundary.launch(d) for d in devices},
                           weight=weight, max_sweeps=boundary.fold_sweeps)
    if left:
        placement = Placement(folded, placement.policy, placement.scores)
    return placement, left


def _stage_modelled(index: GraphIndex, drafts: Sequence[UnitDraft], stages: Sequence[StageSpec],
                    devices: Sequence[Device], costs: CostTable | None) -> tuple[float | None, ...]:
    """Per stage (:attr:`Plan.stage_modelled`): on a twin-modelled device none of whose units has
    a measured cost, the calibration factor its estimate takes; else None."""
    by_name = {d.name: d for d in devices}
    modelled: list[float | None] = []
    for spec in stages:
        measured_any = costs is not None and any(costs.get(unit_key(index, drafts[u].nodes), spec.device) is not None
                                                 for u in spec.units)
        if "profile_domain" in by_name[spec.device].options and not measured_any:
            modelled.append(costs.factor(spec.device) if costs is not None else 1.0)
        else:
            modelled.append(None)
    return tuple(modelled)


def _offload_notes(index: GraphIndex, devices: Sequence[Device], caps: Mapping[str, Capabilities],
                   units: Sequence[Unit], drafts: Sequence[UnitDraft], assignment: Mapping[int, str],
                   refusals: Sequence[Refusal], left: Mapping[int, str], cost: Mapping[tuple[int, str], float],
                   ) -> tuple[OffloadNote, ...]:
    """Why each unit not on an NPU is not there (empty when the plan has no NPU)."""
    npus = [d.name for d in devices if d.kind == "npu"]
    if not npus:
        return ()
    npu = npus[0]
    refused_by = {(r.unit, r.device): r.reason for r in refusals}
    cap = caps[npu]
    const = constant_nodes(index)
    out: list[OffloadNote] = []
    for u in units:
        dev = assignment[u.id]
        if dev in npus or all(const[n] for n in drafts[u.id].nodes):
            continue  # constants are recomputed in each stage reading them: no stage of their own
        if (u.id, npu) in refused_by:
            out.append(OffloadNote(u.id, npu, dev, OffloadReason.REFUSED, refused_by[(u.id, npu)]))
        elif npu not in u.candidates:
            flow = sorted(set(u.op_types) & _CONTROL_FLOW)
            if flow:
                out.append(OffloadNote(u.id, npu, dev, OffloadReason.CONTROL_FLOW,
                                       f"control flow ({', '.join(flow)}) runs on the CPU"))
            else:
                ops = _unsupported_ops(index, drafts[u.id].nodes, cap)
                out.append(OffloadNote(u.id, npu, dev, OffloadReason.UNSUPPORTED_OP,
                                       f"{npu} does not run {', '.join(ops) or 'its ops'}"))
        elif left.get(u.id) == npu:
            out.append(OffloadNote(u.id, npu, dev, OffloadReason.TOO_SMALL,
                                   f"a stage of it on {npu} would not pay for its boundary (launch, hand-offs)"))
        elif cost[(u.id, npu)] > cost[(u.id, dev)]:
            out.append(OffloadNote(u.id, npu, dev, OffloadReason.SLOWER,
                                   f"estimated {cost[(u.id, dev)] * 1e3:.3g} ms on {dev} against "
                                   f"{cost[(u.id, npu)] * 1e3:.3g} ms on {npu}"))
        else:
            # no slower there: what it would save does not pay for a stage boundary (the policy
            # prices the NPU's launch and the hand-offs into each move onto it)
            out.append(OffloadNote(u.id, npu, dev, OffloadReason.TOO_SMALL,
                                   f"estimated {cost[(u.id, npu)] * 1e3:.3g} ms on {npu} against "
                                   f"{cost[(u.id, dev)] * 1e3:.3g} ms on {dev}: the difference does not pay for a "
                                   f"stage boundary there (the NPU's launch, hand-offs)"))
    return tuple(out)


def _unsupported_ops(index: GraphIndex, nodes: Sequence[int], cap: Capabilities) -> list[str]:
    """Op types (with the input types where those decide) among ``nodes`` that ``cap`` does not run."""
    out: dict[str, None] = {}
    for nid in nodes:
        ref = index.nodes[nid]
        opset = index.opsets.get(ref.domain, index.opsets.get("", 1))
        dts = tuple(input_dtypes(index, ref.inputs[:4]))
        if not cap.supports(ref.op_type, ref.domain, opset, dts):
            out[f"{ref.domain + '::' if ref.domain else ''}{ref.op_type}"] = None
    return sorted(out)


def _place(policy: PlacementPolicy, problem: PlacementProblem) -> object:
    """The policy's answer.

    :raises PlacementError: the policy raised; the message names the policy and the error
        (``__cause__`` is the original). A ``PlacementError`` of the policy's own passes through.
    """
    try:
        return policy.place(problem)
    except PlacementError:
        raise
    except Exception as exc:
        raise PlacementError(f"policy {policy_name(policy)!r} raised {type(exc).__name__}: {exc}") from exc


def _drop_refused(index: GraphIndex, uid: int, nodes: Sequence[int], key: str, cands: tuple[str, ...],
                  refused: Mapping[tuple[str, str], str], into: list[Refusal]) -> tuple[str, ...]:
    """``cands`` without the devices that refused unit ``key``; the refusals go to ``into``.

    :raises PartitionError: every candidate refused the unit (names it and each reason).
    """
    kept = tuple(d for d in cands if (key, d) not in refused)
    if len(kept) == len(cands):
        return cands
    mine = [Refusal(uid, d, refused[(key, d)]) for d in cands if (key, d) in refused]
    into.extend(mine)
    if kept:
        return kept
    ops = sorted({index.nodes[n].op_type for n in nodes})
    reasons = "; ".join(f"{r.device}: {r.reason}" for r in mine)
    raise PartitionError(f"unit {uid} ({key}, ops {ops}) compiles on none of its devices: {reasons}",
                         op_types=ops, devices=list(cands))


