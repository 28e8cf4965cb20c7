"""Program compilation: what one kind of request does, computed once per (outputs, feeds).

A :class:`StageRuntime` is a compiled stage as the scheduler runs it; a :class:`Program` is
the precomputed bookkeeping of the requests that ask the same outputs with the same feeds:
which stages they need, who reads which value where, which tensors cross memory domains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._buffers import TensorBuffer
from ._domains import Topology

if TYPE_CHECKING:
    from hetsched.backends._base import CompiledStage, StageHooks

__all__ = ["Program", "StageIO", "StageRuntime", "address", "build_program"]


@dataclass(frozen=True, slots=True)
class StageIO:
    """Where a stage read and wrote its tensors: ``EventInfo.extra`` of ``AFTER_STAGE``.

    Built only when someone listens to ``AFTER_STAGE``. With zero-copy, a consumer's input
    address equals its producer's output address (the very same pool buffer).
    """

    inputs: Mapping[str, int]
    """Input name -> address of the first byte read."""
    outputs: Mapping[str, int]
    """Output name -> address of the first byte written (empty when the stage failed)."""
    bound: bool
    """True when the outputs were written straight into pool buffers (IO binding)."""


def address(obj: Any) -> int:
    """The address of the first byte of an array or pool buffer (0: not one array)."""
    if type(obj) is TensorBuffer:
        return obj.ptr
    try:
        return int(obj.__array_interface__["data"][0])
    except (AttributeError, KeyError, TypeError):
        return 0  # not an array (a sequence, a map): no single address


class StageRuntime:
    """A compiled stage as the scheduler runs it."""

    __slots__ = (
        "analytic_s",
        "bound",
        "compiled",
        "device",
        "domain",
        "energy_fn",
        "fallback_reason",
        "hooks",
        "input_names",
        "key",
        "labels",
        "learned",
        "name",
        "output_names",
        "samples",
        "seconds_fn",
        "sid",
        "spec",
        "specs",
        "state_alive",
        "stateful",
    )

    def __init__(self, spec: Any, compiled: CompiledStage, key: str, analytic_s: float, domain: str):
        self.spec = spec
        self.sid: int = spec.id
        self.name: str = spec.name
        self.device: str = spec.device
        self.compiled: Any = compiled
        """The compiled stage (its optional calls, ``run(state=)`` and ``run_into``, as :attr:`hooks` declares)."""
        self.key = key
        self.analytic_s = analytic_s
        self.domain = domain
        self.input_names = frozenset(compiled.input_names)
        self.output_names = tuple(compiled.output_names)
        self.labels = tuple(f"{spec.name}:{o}" for o in self.output_names)
        hooks = compiled.hooks
        self.hooks: StageHooks = hooks
        """The optional protocols the stage declared (its backend's :class:`StageHooks`)."""
        specs = hooks.in_place.output_specs() if hooks.in_place is not None else None
        self.specs: tuple[tuple[np.dtype[Any], tuple[int, ...]], ...] | None = (
            tuple((np.dtype(d), tuple(s)) for d, s in specs) if specs is not None else None
        )
        self.bound = self.specs is not None
        self.samples: list[float] = []  # run times not yet folded into the cost table
        self.learned = 0
        """Run times folded into the cost table so far."""
        modelled = hooks.modelled
        self.seconds_fn: Callable[[], float] | None = modelled.last_run_seconds if modelled is not None else None
        """The backend's own seconds of the run that just ended in this thread
        (``last_run_seconds()``: a twin stage's modelled board time), learned instead of the
        host's wall time; None: the host's time is the stage's cost."""
        self.energy_fn: Callable[[], float] | None = (
            modelled.last_run_energy_j if modelled is not None else None)
        """The backend's modelled or measured joules of the run that just ended in this thread
        (``last_run_energy_j()``), or None for a backend that reports no energy."""
        self.stateful = hooks.worker_state is not None
        """The stage keeps per-worker state (``worker_state``): its runs get ``state=``."""
        probe = hooks.state_probe if self.stateful else None
        self.state_alive: Callable[[object], bool] | None = probe.worker_state_alive if probe is not None else None
        """``worker_state_alive(state) -> bool`` of a stateful stage that can tell whether a
        worker's state still works (its context's process lives); None: assumed alive until a
        run on it raises :class:`~hetsched.DeviceFailedError`."""
        self.fallback_reason: str | None = (
            None if self.bound else
            hooks.unbound_reason or (
                "the backend cannot run it in place" if hooks.in_place is None else
                "dynamic output shapes or types that cannot be bound")
        )


class Program:
    """What one kind of request (its wanted outputs and fed inputs) does, computed once.

    ``inputs[sid]``: (input name, key into the request's values) per stage input, where the
    key is the value's name when the stage reads it where it was produced (or fed), and
    ``(name, domain)`` for the copy the transfer engine made in the stage's domain.
    ``outs[sid]``: per output (index, name, references, consumer stages on shared memory,
    domains it must be transferred to). ``xfers[(name, domain)]``: (references, consumers)
    of a transferred copy.
    """

    __slots__ = (
        "by_sid",
        "direct",
        "fed",
        "feed_xfers",
        "generation",
        "has_transfers",
        "initial",
        "inputs",
        "missing0",
        "n_tasks",
        "outs",
        "stages",
        "wanted",
        "xfers",
    )

    def __init__(self) -> None:
        self.stages: tuple[StageRuntime, ...] = ()
        self.by_sid: tuple[StageRuntime, ...] = ()
        """Every stage of the plan the program was built from, by stage id."""
        self.generation: Any = None
        """The plan generation the program belongs to (``_generation.Generation``), or None."""
        self.fed: tuple[str, ...] = ()
        self.initial: tuple[StageRuntime, ...] = ()
        self.missing0: list[int] = []
        self.inputs: dict[int, tuple[tuple[str, Any], ...]] = {}
        self.outs: dict[int, tuple[tuple[int, str, int, tuple[int, ...], tuple[str, ...]], ...]] = {}
        self.xfers: dict[tuple[str, str], tuple[int, tuple[int, ...]]] = {}
        self.feed_xfers: tuple[tuple[str, str], ...] = ()
        self.wanted: tuple[tuple[str, Any], ...] = ()
        self.n_tasks = 0
        self.has_transfers = False
        self.direct: frozenset[int] = frozenset()
        """Stages whose outputs only the caller reads (on memory the host shares): when the caller
        wants arrays it keeps, the backend allocates them and they are handed over as they are."""


def build_program(
    stages: Sequence[StageRuntime],
    output_source: Mapping[str, int | None],
    wanted: Sequence[str],
    fed: Sequence[str],
    topology: Topology,
    host: str,
) -> Program:
    """Precompute the bookkeeping of requests asking ``wanted`` with inputs ``fed``."""
    needed: set[int] = set()
    stack = [output_source[n] for n in wanted if output_source.get(n) is not None]
    while stack:
        sid = stack.pop()
        if sid is None or sid in needed:
            continue
        needed.add(sid)
        stack.extend(stages[sid].spec.deps)
    prog = Program()
    prog.stages = tuple(s for s in stages if s.sid in needed)
    prog.by_sid = tuple(stages)
    prog.fed = tuple(fed)
    fed_set = set(fed)
    shares = topology.shares_memory
    missing = [0] * len(stages)
    # consumers[name] = [(sid, domain)], the caller as sid -1 in the host domain
    consumers: dict[str, list[tuple[int, str]]] = {}
    for st in prog.stages:
        ins: list[tuple[str, Any]] = []
        for name in st.spec.inputs:
            if name not in st.input_names:
                continue
            src = output_source.get(name)
            if src is None or src not in needed:
                if name not in fed_set:
                    continue  # an optional input nobody fed: the stage model's own default applies
                if shares(host, st.domain):
                    ins.append((name, name))
                    continue
                src_domain = host
            else:
                src_domain = stages[src].domain
            consumers.setdefault(name, []).append((st.sid, st.domain))
            ins.append((name, name if shares(src_domain, st.domain) else (name, st.domain)))
            missing[st.sid] += 1
        prog.inputs[st.sid] = tuple(ins)
    for name in dict.fromkeys(wanted):
        src = output_source.get(name)
        if src is not None and src in needed:
            consumers.setdefault(name, []).append((-1, host))
    n_xfers = 0
    feed_xfers: list[tuple[str, str]] = []
    for name in fed:
        remote: dict[str, list[int]] = {}
        for sid, dom in consumers.get(name, ()):
            if sid >= 0 and not shares(host, dom):
                remote.setdefault(dom, []).append(sid)
        for dom, sids in remote.items():
            prog.xfers[(name, dom)] = (len(sids), tuple(sids))
            feed_xfers.append((name, dom))
            n_xfers += 1
    direct: set[int] = set()
    for st in prog.stages:
        outs = []
        if all(sid < 0 and shares(st.domain, dom) for name in st.output_names for sid, dom in consumers.get(name, ())):
            direct.add(st.sid)
        for i, name in enumerate(st.output_names):
            same: list[int] = []
            refs = 0
            remote = {}
            for sid, dom in consumers.get(name, ()):
                if shares(st.domain, dom):
                    refs += 1
                    if sid >= 0:
                        same.append(sid)
                else:
                    remote.setdefault(dom, []).append(sid)
            for dom, sids in remote.items():
                refs += 1  # the transfer's read of the source
                prog.xfers[(name, dom)] = (len(sids), tuple(s for s in sids if s >= 0))
                n_xfers += 1
            outs.append((i, name, refs, tuple(same), tuple(remote)))
        prog.outs[st.sid] = tuple(outs)
    wanted_keys: list[tuple[str, Any]] = []
    for name in dict.fromkeys(wanted):
        src = output_source.get(name)
        if src is not None and src in needed and not shares(stages[src].domain, host):
            wanted_keys.append((name, (name, host)))
        else:
            wanted_keys.append((name, name))
    prog.wanted = tuple(wanted_keys)
    prog.missing0 = missing
    prog.initial = tuple(s for s in prog.stages if missing[s.sid] == 0)
    prog.feed_xfers = tuple(feed_xfers)
    prog.n_tasks = len(prog.stages) + n_xfers
    prog.has_transfers = n_xfers > 0
    prog.direct = frozenset(direct)
    return prog

