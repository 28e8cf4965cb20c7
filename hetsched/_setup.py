"""Session setup: what ``Session.__aenter__`` and each re-plan build before requests can run.

Loading the model (and the graph outputs that are constants), the default memory topology,
compiling a plan's stages for their devices, where each graph output comes from, and the
adapter from the transfer engine's callbacks to the session's hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onnx import numpy_helper

from hetsched.backends import Device, get_backend

from ._errors import TransferError
from ._events import Event, EventInfo, HookDispatcher, Priority
from ._planning.costs import STAGE_OVERHEAD_S, analytic_node_costs
from ._planning.graph import GraphIndex
from ._planning.model import ModelSource, load_model
from ._planning.partition import extract_stage
from ._planning.plan import Plan, unit_key
from ._runtime._clock import Clock
from ._runtime._domains import MemoryDomain, MemoryKind, Topology
from ._runtime._scheduler import StageRuntime
from ._runtime._transfer import TransferInfo

__all__ = ["TransferEvents", "compile_stages", "load_index", "make_topology", "output_sources"]


def load_index(source: ModelSource) -> tuple[GraphIndex, dict[str, Any]]:
    """The model's graph index and its graph outputs that are initializers (as arrays).

    Blocking (reads and checks the model). A str that is no file may name an embedded model
    (see :func:`hetsched.load_model`).

    :raises ModelError: the model could not be loaded.
    """
    model = load_model(source)
    index = GraphIndex(model)
    constants = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer
                 if init.name in index.graph_outputs}
    return index, constants


def make_topology(topology: Topology | None, devices: Sequence[Device]) -> tuple[Topology, str]:
    """The topology to use and the name of its host domain (feeds and outputs live there).

    Default (``topology`` None): the host and every device's ``memory_domain`` share memory.

    :raises TransferError: a device's memory domain is not in ``topology``, or it has no host domain.
    """
    if topology is None:
        names = list(dict.fromkeys(["host", *(d.memory_domain for d in devices)]))
        doms = [MemoryDomain("host", MemoryKind.HOST)] + [MemoryDomain(n, MemoryKind.DEVICE) for n in names[1:]]
        return Topology(doms, shared=[names]), "host"
    known = {d.name for d in topology.domains}
    for dev in devices:
        if dev.memory_domain not in known:
            raise TransferError(f"device {dev.name!r} writes memory domain {dev.memory_domain!r}, which the "
                                f"topology lacks (it has {sorted(known)})")
    if "host" in known:
        return topology, "host"
    host = next((d.name for d in topology.domains if d.kind is MemoryKind.HOST), None)
    if host is None:
        raise TransferError(f"the topology has no host memory domain for feeds and outputs: {topology!r}")
    return topology, host


def compile_stages(index: GraphIndex, plan: Plan) -> list[StageRuntime]:
    """Compile every stage of ``plan`` for its device (blocking; on failure the stages
    compiled so far are closed).

    :raises CompileError: a backend refused a stage.
    """
    by_name = {d.name: d for d in plan.devices}
    node_costs = analytic_node_costs(index)
    out: list[StageRuntime] = []
    try:
        for spec in plan.stages:
            dev = by_name[spec.device]
            model = extract_stage(index, spec)
            compiled = get_backend(dev.backend).compile(model, dev, name=spec.name)
            flops = sum(node_costs[n].flops for n in spec.nodes)
            nbytes = sum(node_costs[n].bytes for n in spec.nodes)
            est = max(flops / dev.peak_flops, nbytes / dev.mem_bandwidth) + STAGE_OVERHEAD_S
            out.append(StageRuntime(spec, compiled, unit_key(index, spec.nodes), est, dev.memory_domain))
    except BaseException:
        for st in out:
            st.compiled.close()
        raise
    return out


def output_sources(plan: Plan) -> dict[str, int | None]:
    """For each graph output, the id of the stage producing it (None: a graph input or an
    initializer passed through)."""
    src: dict[str, int | None] = {}
    for s in plan.stages:
        for o in s.outputs:
            src[o] = s.id
    for o in plan.graph_outputs:
        src.setdefault(o, None)
    return src


class TransferEvents:
    """Adapts the engine's transfer callbacks to session hooks; an event nobody listens to
    is None here, so the engine skips it for free."""

    def __init__(self, dispatch: HookDispatcher, clock: Clock):
        self.before_transfer = self._forward(Event.BEFORE_TRANSFER, dispatch, clock)
        self.after_transfer = self._forward(Event.AFTER_TRANSFER, dispatch, clock)
        self.preempted = self._forward(Event.PREEMPTED, dispatch, clock)
        self.resumed = self._forward(Event.RESUMED, dispatch, clock)

    @staticmethod
    def _forward(event: Event, dispatch: HookDispatcher, clock: Clock) -> Callable[[TransferInfo], None] | None:
        fns = dispatch.listeners[event]
        if not fns:
            return None

        def forward(t: TransferInfo) -> None:
            # labels are "<stage>:<value>-><domain>#<request id>" (see Scheduler._transfer)
            head, _, rid = t.label.rpartition("#")
            stage = head.split(":", 1)[0] if head else None
            info = EventInfo(event, clock.perf_counter(), int(rid) if rid.isdigit() else None,
                             Priority(t.priority) if 0 <= t.priority <= 3 else None, stage, None,
                             nbytes=t.nbytes, extra=t)
            for fn in fns:
                fn(info)

        return forward
