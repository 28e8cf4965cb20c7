"""Compile events (BEFORE_COMPILE / AFTER_COMPILE) and the CLI's compile progress lines."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetsched
from hetsched import CompileInfo, Event, EventInfo, Hooks
from hetsched._cli import main
from hetsched._cli._common import CompileProgress
from hetsched._errors import CompileError
from hetsched._events import HookDispatcher
from hetsched._session._setup import CompileEvents
from hetsched.backends import NO_STAGE_HOOKS, Device, StageHooks
from hetsched.lowlevel import SystemClock
from hetsched.policies import PlacementProblem
from hetsched.testing import FakeBackend, FakeStage, fake_device


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h1"], name="mm"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Abs", ["h2"], ["h3"], name="abs"),
        helper.make_node("Neg", ["h3"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@dataclass(frozen=True)
class _StageStats:
    cached: bool


class _CachedStage(FakeStage):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks = StageHooks(compile_cache=self)  # declared: built through a compile cache

    def statistics(self) -> _StageStats:
        return _StageStats(cached=self.name in self._backend.cached)  # type: ignore[attr-defined]


class _Backend(FakeBackend):
    """Refuses stages with an op in ``refuse_ops``; says ``cached`` for stages named in
    ``cached``; logs each compile with its thread, so a test can check the order of events."""

    def __init__(self, name: str, log: list[tuple[str, str, str]], *, refuse_ops: frozenset[str] = frozenset(),
                 cached: frozenset[str] = frozenset(), sleep_s: float = 0.0):
        super().__init__(name)
        self.log = log
        self.refuse_ops = refuse_ops
        self.cached = cached
        self.sleep_s = sleep_s
        self.mu = threading.Lock()

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> FakeStage:
        with self.mu:
            self.log.append(("compile", name, threading.current_thread().name))
        if self.sleep_s:
            time.sleep(self.sleep_s)  # a slow conversion, for the CLI's threshold
        ops = {n.op_type for n in model.graph.node}
        if ops & self.refuse_ops:
            raise CompileError(f"{device.name}: toolkit refuses {sorted(ops & self.refuse_ops)}")
        return _CachedStage(self, model, device, name)


class _Recorder(Hooks):
    def __init__(self, log: list[tuple[str, str, str]]) -> None:
        self.log = log
        self.infos: list[EventInfo] = []
        self.mu = threading.Lock()

    def _rec(self, info: EventInfo) -> None:
        with self.mu:
            self.log.append((info.event.value, str(info.stage), threading.current_thread().name))
            self.infos.append(info)

    before_compile = after_compile = session_start = _rec


def _alternate(problem: PlacementProblem) -> dict[int, str]:
    """Units alternate between the accelerator and the CPU: one stage per unit."""
    return {u.id: "acc" if u.id % 2 == 0 else "cpu:0" for u in problem.units}


def _on_acc(problem: PlacementProblem) -> dict[int, str]:
    return {u.id: "acc" if "acc" in u.candidates else "cpu:0" for u in problem.units}


def _acc() -> Device:
    return fake_device("acc", backend="evbackend", kind="npu", peak_flops=1e15, mem_bandwidth=1e13)


def _batches(infos: list[EventInfo]) -> list[list[EventInfo]]:
    """The AFTER_COMPILE events, grouped by batch (a batch ends when ``total`` of them came)."""
    out: list[list[EventInfo]] = []
    for info in infos:
        if info.event is not Event.AFTER_COMPILE:
            continue
        assert isinstance(info.extra, CompileInfo)
        if not out or len(out[-1]) == out[-1][0].extra.total:
            out.append([])
        out[-1].append(info)
    return out


def test_hooks_methods_are_named_like_the_events() -> None:
    methods = {m for m in vars(Hooks) if not m.startswith("_")}
    assert methods == {e.value for e in Event}
    assert Event.BEFORE_COMPILE.is_before and Event.AFTER_COMPILE.is_after


@pytest.mark.anyio
async def test_each_stage_compile_is_bracketed_in_its_compile_thread() -> None:
    log: list[tuple[str, str, str]] = []
    rec = _Recorder(log)
    with _Backend("evbackend", log, cached=frozenset({"stage0"})):
        async with hetsched.Session(_model(), devices=["cpu:0", _acc()], policy=_alternate, max_unit_nodes=1,
                                    hooks=[rec]) as s:
            stages = {st.name: st.device for st in s.plan.stages}
    assert len(stages) == 4
    names = [e for e, _, _ in log]
    # compiling happens before the session starts
    assert names.index("session_start") == len(names) - 1
    after = [i for i in rec.infos if i.event is Event.AFTER_COMPILE]
    before = [i for i in rec.infos if i.event is Event.BEFORE_COMPILE]
    assert sorted(str(i.stage) for i in after) == sorted(str(i.stage) for i in before) == sorted(stages)
    for info in before + after:
        ci = info.extra
        assert isinstance(ci, CompileInfo)
        assert (ci.stage, ci.device, ci.total, ci.trial) == (info.stage, stages[ci.stage], 4, False)
        assert info.device == ci.device
    assert sorted(i.extra.index for i in after) == [0, 1, 2, 3]
    for info in after:
        assert info.error is None and info.elapsed_s is not None and info.elapsed_s >= 0
        assert info.extra.seconds == info.elapsed_s
    # cached where the compiled stage's statistics() says so; None without statistics (cpu)
    assert {i.stage: i.extra.cached for i in after} == {
        name: (name == "stage0") if dev == "acc" else None for name, dev in stages.items()}
    # the fake's compile ran between its stage's events, in the same (non-event-loop) thread
    for name, dev in stages.items():
        if dev != "acc":
            continue
        mine = [(e, t) for e, st, t in log if st == name]
        assert [e for e, _ in mine] == ["before_compile", "compile", "after_compile"]
        assert len({t for _, t in mine}) == 1
        assert mine[0][1] != threading.main_thread().name


@pytest.mark.anyio
async def test_refusal_trials_are_marked_and_carry_the_error() -> None:
    log: list[tuple[str, str, str]] = []
    rec = _Recorder(log)
    with _Backend("evbackend", log, refuse_ops=frozenset({"Abs"})):
        async with hetsched.Session(_model(), devices=["cpu:0", _acc()], policy=_on_acc, max_unit_nodes=1,
                                    hooks=[rec]) as s:
            final = [(st.name, st.device) for st in s.plan.stages]
    first, trials, last = _batches(rec.infos)
    # the first plan: every unit in one accelerator stage, refused
    assert [(i.extra.device, i.extra.total, i.extra.trial) for i in first] == [("acc", 1, False)]
    assert isinstance(first[0].error, CompileError)
    # each unit alone on the accelerator, as trials: only the Abs unit is refused
    assert all(i.extra.trial and i.extra.device == "acc" and i.extra.total == 4 for i in trials)
    assert sorted(i.extra.index for i in trials) == [0, 1, 2, 3]
    assert sum(isinstance(i.error, CompileError) and "Abs" in str(i.error) for i in trials) == 1
    assert sum(i.error is None for i in trials) == 3
    # the re-plan compiles every stage, none a trial, none failing
    assert sorted((i.stage, i.device) for i in last) == sorted(final)
    assert all(not i.extra.trial and i.extra.total == len(final) and i.error is None for i in last)


class _OnlySessionStart(Hooks):
    def session_start(self, info: EventInfo) -> None: ...


class _ExplodingClock:
    def monotonic(self) -> float:
        raise AssertionError("read the clock with nobody listening")

    perf_counter = monotonic


def test_compile_events_cost_nothing_without_listeners() -> None:
    dispatch = HookDispatcher([_OnlySessionStart(), Hooks()])
    assert dispatch.listeners[Event.BEFORE_COMPILE] == dispatch.listeners[Event.AFTER_COMPILE] == ()
    sentinel: Any = object()
    events = CompileEvents(dispatch, _ExplodingClock())
    assert events.around(lambda: sentinel, CompileInfo("s", "d", 0, 1)) is sentinel


def test_a_failing_after_hook_closes_the_compiled_stage() -> None:
    class Boom(Hooks):
        def after_compile(self, info: EventInfo) -> None:
            raise RuntimeError("hook failed")

    class Stage:
        closed = False
        hooks = NO_STAGE_HOOKS

        def close(self) -> None:
            self.closed = True

    stage: Any = Stage()
    events = CompileEvents(HookDispatcher([Boom()]), SystemClock())
    with pytest.raises(RuntimeError, match="hook failed"):
        events.around(lambda: stage, CompileInfo("s", "d", 0, 1))
    assert stage.closed


def _info(event: Event, stage: str, index: int, total: int, *, seconds: float | None = None,
          cached: bool | None = None, trial: bool = False, error: BaseException | None = None) -> EventInfo:
    ci = CompileInfo(stage, "npu", index, total, seconds, cached, trial)
    return EventInfo(event, 0.0, stage=stage, device="npu", elapsed_s=seconds, error=error, extra=ci)


def test_progress_lines_start_once_compiling_runs_long() -> None:
    now = [0.0]
    out = io.StringIO()
    p = CompileProgress(after_s=0.5, clock=lambda: now[0], stream=out)
    p.before_compile(_info(Event.BEFORE_COMPILE, "s0", 0, 3))
    p.before_compile(_info(Event.BEFORE_COMPILE, "s1", 1, 3))
    now[0] = 0.2
    p.after_compile(_info(Event.AFTER_COMPILE, "s0", 0, 3, seconds=0.2))
    assert out.getvalue() == ""  # quick so far: silent
    now[0] = 4.0
    p.after_compile(_info(Event.AFTER_COMPILE, "s1", 1, 3, seconds=4.0))
    p.before_compile(_info(Event.BEFORE_COMPILE, "s2", 2, 3))
    now[0] = 6.0
    p.after_compile(_info(Event.AFTER_COMPILE, "s2", 2, 3, seconds=2.0, cached=True))
    # a round of trials is a new batch
    p.before_compile(_info(Event.BEFORE_COMPILE, "u0", 0, 2, trial=True))
    now[0] = 7.0
    p.after_compile(_info(Event.AFTER_COMPILE, "u0", 0, 2, seconds=1.0, trial=True, error=CompileError("no")))
    assert out.getvalue().splitlines() == [
        "compiling 2/3 s1 on npu: 4.0 s (ETA 2 s)",
        "compiling 3/3 s2 on npu: cached (ETA 0 s)",
        "trying 1/2 u0 on npu: refused (ETA 1 s)",
    ]


_LINE = re.compile(r"^compiling (\d+)/(\d+) (\S+) on (\S+): (cached|\d+\.\d s) \(ETA \d+ s\)$")


def _progress_lines(err: str) -> list[re.Match[str]]:
    lines = [ln for ln in err.splitlines() if ln.startswith(("compiling", "trying"))]
    matches = [_LINE.match(ln) for ln in lines]
    assert all(matches), lines
    return [m for m in matches if m is not None]


def test_run_json_stays_clean_with_progress_lines_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "light_squeezenet", "--requests", "1", "--json", "--progress", "--max-unit-nodes", "30",
                 "--devices", "cpu:0", "cpu:1"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    lines = _progress_lines(captured.err)
    assert sorted((m[3], m[4]) for m in lines) == sorted((st["name"], st["device"]) for st in summary["stages"])
    assert sorted(int(m[1]) for m in lines) == list(range(1, len(summary["stages"]) + 1))
    assert {int(m[2]) for m in lines} == {len(summary["stages"])}


def test_plan_quiet_prints_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "light_squeezenet", "--json", "--quiet", "--progress", "--devices", "cpu:0"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert _progress_lines(captured.err) == []


def test_plan_prints_progress_for_a_slow_conversion(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import hetsched._cli._plan as plan_cli

    monkeypatch.setattr(plan_cli, "select_devices", lambda specs, root: ["cpu:0", _acc()])
    log: list[tuple[str, str, str]] = []
    # each conversion sleeps past the 0.5 s threshold, so the lines start without --progress
    with _Backend("evbackend", log, sleep_s=0.6):
        assert main(["plan", "light_squeezenet", "--json", "--policy", "pinned:acc"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    lines = _progress_lines(captured.err)
    assert sorted((m[3], m[4]) for m in lines) == sorted((st["name"], "acc") for st in plan["stages"])
