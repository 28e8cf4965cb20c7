"""The session layer reads declared seams, never attributes discovered by name.

A governor is a :class:`~hetsched._session._governed.SessionGovernor` (``on_phase``,
``current_phase``); what only a :class:`hetsched.Governor` has (its engine: the dwell and the
clock targets a trace shows; its power budget) is read from that class. A trace traces the
governors of :class:`hetsched.GovernorHooks`, not of any hook holding a ``governor``. A stream
gives back the buffers of zero-copy :class:`hetsched.Outputs` only. Each test pairs an object
that has the attribute but does not declare the seam (not used) with the declared path (used).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetsched
from hetsched import Governor, GovernorHooks, Outputs, Phase
from hetsched._events import Event, EventInfo, Hooks
from hetsched._runtime._clock import SystemClock
from hetsched._session._governed import DWELL_S, SessionGovernor, power_budget_w
from hetsched._session._stream import _release_untaken
from hetsched._session._trace import SessionTrace

from _governor_fakes import TableBoard, additive_table


class _Engine:
    """Looks like a governor's engine by name: a dwell to set, clock targets to read."""

    def __init__(self) -> None:
        self.dwell_s: float | None = None
        self.current = {"gpu": 900_000_000}


class _Config:
    power_budget_w = 5.0


class _LookAlike:
    """A governor of the caller's: the declared seam (``on_phase``, ``current_phase``) and, by
    name only, what a :class:`hetsched.Governor` has (``engine``, ``config``)."""

    def __init__(self) -> None:
        self.current_phase: Phase | None = None
        self.engine = _Engine()
        self.config = _Config()

    def on_phase(self, phase: Phase) -> None:
        self.current_phase = phase


def _governor(**kw: Any) -> Governor:
    table = additive_table({Phase.INFER: {"gpu": 0.2e9}}, {"cluster0": 1.0, "gpu": 6.0, "memory": 1.2})
    return Governor(port=TableBoard(table), autotune=False, handle_signals=False, **kw)


def test_a_governor_implements_the_declared_seam() -> None:
    seam: SessionGovernor = _governor()  # checked by mypy: the class declares what a session reads
    assert seam.current_phase is None


# -- GovernorHooks: the dwell ---------------------------------------------------------------------


def test_an_engine_by_name_only_is_never_used() -> None:
    gov = _LookAlike()
    hooks = GovernorHooks(gov)
    assert hooks.engine is None
    assert gov.engine.dwell_s is None  # not a hetsched.Governor: its "engine" is not touched
    hooks.request_start(EventInfo(Event.REQUEST_START, 0.0, request_id=0))
    assert gov.current_phase is Phase.PREPROCESS  # the declared seam still drives it


def test_a_governor_gets_the_session_dwell() -> None:
    gov = _governor()
    hooks = GovernorHooks(gov)
    assert hooks.engine is gov.engine and gov.engine.dwell_s == DWELL_S
    own = _governor()
    own.engine.dwell_s = 1.0
    GovernorHooks(own)
    assert own.engine.dwell_s == 1.0  # a dwell of its own is kept
    left = _governor()
    GovernorHooks(left, dwell_s=None)
    assert left.engine.dwell_s is None


# -- the power budget a policy's headroom is measured against ---------------------------------------


def test_a_power_budget_by_name_only_is_never_used() -> None:
    assert power_budget_w(_LookAlike()) is None
    assert power_budget_w(_governor()) is None
    assert power_budget_w(_governor(power_budget_w=7.0)) == 7.0


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="a"), helper.make_node("Neg", ["r"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_session_takes_the_budget_of_a_governor_only() -> None:
    looks = hetsched.Session(_model(), devices=["cpu:0"], governor=_LookAlike())
    assert looks._life._power_budget is None
    gov = hetsched.Session(_model(), devices=["cpu:0"], governor=_governor(power_budget_w=7.0))
    assert gov._life._power_budget == 7.0


# -- the trace's governors ------------------------------------------------------------------------


class _HoldsAGovernor(Hooks):
    """A hook of the caller's with a ``governor`` attribute: not a GovernorHooks."""

    def __init__(self, governor: _LookAlike) -> None:
        self.governor = governor

    def before_stage(self, info: EventInfo) -> None:
        self.governor.on_phase(Phase.INFER)


def test_a_hook_holding_a_governor_is_not_traced(tmp_path: Path) -> None:
    trace = SessionTrace(tmp_path / "t.json", clock=SystemClock(), root=tmp_path)
    user = _HoldsAGovernor(_LookAlike())
    assert trace.wrap_hooks([user])[:1] == [user]  # no phase probe in front of it
    assert not trace.wants_task
    declared = GovernorHooks(_LookAlike())
    wrapped = trace.wrap_hooks([user, declared])
    assert wrapped[1:3] == [user, declared] and len(wrapped) == 4  # the probe first, the trace's hooks last
    assert trace.wants_task


def _load(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    return events


def _phase_slices(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"
            and e["args"]["name"] == "governor"}
    return [e for e in events if e["ph"] == "X" and e["pid"] in pids]


@pytest.mark.anyio
async def test_only_declared_governors_have_phase_slices(tmp_path: Path, anyio_backend: str) -> None:
    x = {"x": np.ones(8, np.float32)}
    undeclared = tmp_path / "undeclared.json"
    async with hetsched.Session(_model(), devices=["cpu:0"], hooks=[_HoldsAGovernor(_LookAlike())],
                                trace=undeclared) as s:
        await s.run(x)
    assert _phase_slices(_load(undeclared)) == []
    declared = tmp_path / "declared.json"
    async with hetsched.Session(_model(), devices=["cpu:0"], governor=_LookAlike(), trace=declared) as s:
        await s.run(x)
    slices = _phase_slices(_load(declared))
    assert [e["name"] for e in slices][:2] == ["preprocess", "infer"]
    # clock targets come from a hetsched.Governor's engine only: the look-alike's "engine" is not read
    assert all("targets_mhz" not in e["args"] for e in slices)


# -- a stream's untaken results -------------------------------------------------------------------


class _Releasable(dict[str, Any]):
    """A plain result that happens to have ``release``: it owns its arrays, nothing to give back."""

    released = False

    def release(self) -> None:
        self.released = True


def test_only_zero_copy_outputs_are_released() -> None:
    plain = _Releasable(y=np.zeros(2))
    _release_untaken(plain)
    assert not plain.released
    out = Outputs({"y": np.zeros(2)}, [])
    _release_untaken(out)
    assert out.released
    _release_untaken(None)
