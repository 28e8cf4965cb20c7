"""Failover under load (issue 23): devices dying during re-plans, device contexts killed under runs.

Every scenario runs on asyncio and on trio, and every request's result is checked. Counted per
scenario and in total: ``requests``, ``completed``, ``failed_promised_retry`` (a request that
failed although failover promises to start it over: a device that failed while another could
replace it, or a worker context that died while a new one could be built; target 0),
``lost`` (a request submitted that neither returned nor raised, a stream item missing; target
0), ``wrong`` (a result that differs from the model's; target 0), ``failures`` (stage runs the
failover counted), ``quarantines`` (devices quarantined or found irreplaceable),
``states_renewed`` (dead per-worker contexts rebuilt), ``replans``.

**replan_race** (fake backends): a chain on a preferred device ``a`` and a fallback ``b``; each
round opens a session, starts a re-plan whose policy takes ``--slow-ms`` to answer, and makes
``a`` fail for good while that plan (made with ``a``) is still being computed. Rounds alternate
the trigger: an explicit ``Session.replan()``, and ``background_compile``'s switch (the opening
plan on quick devices, the slow backend's plan compiling while a device of the opening plan
dies). The load is ``run()`` calls from concurrent tasks or one ``map()`` stream, alternately.

**context_kill** (fake backend, no fallback device): one device with two workers, each with a
per-worker context (as an RKNN worker holds a toolkit process); contexts die under runs and
while idle, ``--kills`` times per loop.

**toolkit_kill** (``--toolkit-requests N``, with rknn-toolkit2 installed: ``hetsched setup
rknn``): the real toolkit worker processes of an NPU on an rk3588 twin root (the toolkit's
simulator computes; no board), no fallback device; a thread SIGKILLs a random toolkit process
every ``--toolkit-kill-every-s`` seconds while the requests run: one holding a worker's context
and started ``--toolkit-min-age-s`` ago at least (a crash; ``0``: any toolkit process, those
still starting too: a crash loop).
Kills faster than a process restarts make runs fail ``Replanning.quarantine_after`` times in a row: the device is
quarantined, no plan can do without it, so it stays and its requests start over on it (a
request whose every try met a dying process, ``quarantine_after`` + 1 runs, fails: counted as
``failed_promised_retry`` here all the same).

    .venv/bin/python benchmarks/failover_probe.py                  # 10k requests per loop: seconds
    .venv/bin/python benchmarks/failover_probe.py --long           # 50k requests per loop
    .venv/bin/python benchmarks/failover_probe.py --toolkit-requests 600

Figures: counts measured on this host (fake backends: the runtime's failover, not any device's
speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
from _labels import host, labelled, measured
from onnx import TensorProto, helper

import hetsched
from hetsched import DeviceFailedError, HetschedError, Replanning, Session
from hetsched.backends import (
    BackendHooks,
    Capabilities,
    Device,
    StageHooks,
    WorkerInfo,
    register_backend,
    unregister_backend,
)
from hetsched.policies import Placement
from hetsched.testing import FakeBackend, fake_device

TARGETS = {"failed_promised_retry": "== 0", "lost": "== 0", "wrong": "== 0"}
LOOPS = ("asyncio", "trio")
_TESTS = str(Path(__file__).resolve().parent.parent / "tests")


def _chain(n: int = 3) -> onnx.ModelProto:
    ops = ["Neg", "Abs"]
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node(ops[i % 2], [prev], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


def _x(i: int) -> np.ndarray:
    return np.array([i, -i, 0.5 * i, -0.25 * i], np.float32)


def _chain_expected(x: np.ndarray) -> np.ndarray:
    return -np.abs(-x)


class Tally:
    def __init__(self) -> None:
        self.requests = self.completed = self.failed_promised_retry = self.lost = self.wrong = 0
        self.failures = self.replans = self.rounds = self.quarantines = self.states_renewed = 0
        self.errors: dict[str, int] = {}

    def fail(self, exc: BaseException) -> None:
        self.failed_promised_retry += 1
        text = str(exc)
        key = f"{type(exc).__name__}: {text if len(text) <= 200 else text[:100] + ' ... ' + text[-95:]}"
        self.errors[key] = self.errors.get(key, 0) + 1

    def add_stats(self, s: Session) -> None:
        st = s.statistics()
        if st.failover is not None:
            self.failures += sum(st.failover.failures.values())
            self.quarantines += len(st.failover.quarantined) + len(st.failover.unreplaceable)
        self.replans += st.replanning.replans
        self.states_renewed += st.worker_states_renewed

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("requests", "completed", "failed_promised_retry", "lost", "wrong",
                                             "failures", "quarantines", "states_renewed", "replans",
                                             "rounds")}
        if self.errors:
            out["errors"] = dict(sorted(self.errors.items(), key=lambda kv: -kv[1])[:5])
        return out


async def _load(s: Session, tally: Tally, first: int, n: int, stream: bool, concurrency: int) -> None:
    """``n`` requests (ids ``first ..``), by concurrent run() tasks or one map() stream."""
    tally.requests += n
    got: dict[int, np.ndarray] = {}
    if stream:
        try:
            async with s.map({"x": _x(i)} for i in range(first, first + n)) as results:
                i = first
                async for out in results:
                    got[i] = out["y"]
                    i += 1
        except HetschedError as exc:  # the stream ends at its first failed request
            tally.fail(exc)
    else:
        ids = iter(range(first, first + n))

        async def worker() -> None:
            for i in ids:
                try:
                    got[i] = (await s.run({"x": _x(i)}))["y"]
                except HetschedError as exc:
                    tally.fail(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
    tally.completed += len(got)
    failed_here = n - len(got)
    if stream and failed_here:
        tally.lost += failed_here - 1  # the items after the failed one never came
    for i, y in got.items():
        if not np.array_equal(y, _chain_expected(_x(i))):
            tally.wrong += 1


# -- replan_race ---------------------------------------------------------------------------------


class _SlowPolicy:
    """Places each unit on the first of ``prefer`` (``odd`` for odd unit ids) it may use; while
    armed, its next answer takes ``slow_s`` and sets ``entered`` first (the window in which a
    device dies)."""

    def __init__(self, prefer: tuple[str, ...], slow_s: float, odd: tuple[str, ...] | None = None):
        self.prefer = prefer
        self.odd = odd if odd is not None else prefer
        self.slow_s = slow_s
        self.armed = False
        self.entered = threading.Event()

    def place(self, problem: Any) -> Placement:
        if self.armed:
            self.armed = False
            self.entered.set()
            time.sleep(self.slow_s)
        assignment = {}
        for u in problem.units:
            prefer = self.odd if u.id % 2 else self.prefer
            pick = next((d for d in prefer if d in u.candidates), None)
            assignment[u.id] = pick if pick is not None else sorted(u.candidates)[0]
        return Placement(assignment, "probe")


class _SlowCompile(FakeBackend):
    slow_compile = True  # as the RKNN backend declares: background_compile defers its devices

    def __init__(self, name: str, delay_s: float):
        super().__init__(name)
        self.hooks = BackendHooks(slow_compile=True)
        self.delay_s = delay_s
        self.compiling = threading.Event()

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> Any:
        self.compiling.set()
        time.sleep(self.delay_s)
        return super().compile(model, device, name=name)


async def _replan_round(k: int, tally: Tally, n: int, slow_s: float, concurrency: int) -> None:
    tag = f"probe{os.getpid()}-{k}"
    stream = k % 4 >= 2
    if k % 2 == 0:  # an explicit replan() that began before "a" failed
        policy = _SlowPolicy(("a", "b"), slow_s)
        with FakeBackend(f"{tag}-fb") as fb:
            devices = [fake_device("a", backend=fb.name, peak_flops=1e13),
                       fake_device("b", backend=fb.name, peak_flops=1e10)]
            async with Session(_chain(), devices=devices, policy=policy, max_unit_nodes=1, max_in_flight=256,
                               adaptation=hetsched.Adaptation(replanning=Replanning(quarantine_after=2))) as s:
                half = n // 2
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_load, s, tally, k * n, half, stream, concurrency)
                    await anyio.sleep(0.002 + 0.01 * random.random())
                    policy.armed = True

                    async def replan() -> None:
                        with contextlib.suppress(HetschedError):
                            await s.replan(reason="probe")

                    tg.start_soon(replan)
                    await anyio.to_thread.run_sync(policy.entered.wait, 30.0)
                    fb.fail_device("a")
                    # requests that meet the dead device while the plan made with it is coming
                    tg.start_soon(_load, s, tally, k * n + half, n - half, stream, concurrency)
                tally.add_stats(s)
    else:  # background_compile's switch: a device of the opening plan fails while it compiles
        # the background plan puts even units on the slow backend's device, odd ones on gpuish
        policy = _SlowPolicy(("npuish", "gpuish", "cpuish"), 0.0, odd=("gpuish", "cpuish"))
        with FakeBackend(f"{tag}-quick") as quick, _SlowCompile(f"{tag}-slow", slow_s) as slow:
            devices = [fake_device("cpuish", backend=quick.name, peak_flops=1e9),
                       fake_device("gpuish", backend=quick.name, peak_flops=1e11),
                       fake_device("npuish", backend=slow.name, peak_flops=1e13)]
            async with Session(_chain(), devices=devices, policy=policy, max_unit_nodes=1, max_in_flight=256,
                               adaptation=hetsched.Adaptation(background_compile=True, replanning=Replanning(quarantine_after=2))) as s:
                half = n // 2
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_load, s, tally, k * n, half, stream, concurrency)
                    await anyio.to_thread.run_sync(slow.compiling.wait, 30.0)
                    quick.fail_device("gpuish")  # while the plan still using it compiles
                    tg.start_soon(_load, s, tally, k * n + half, n - half, stream, concurrency)
                tally.add_stats(s)
    tally.rounds += 1


async def replan_race(requests: int, per_round: int, slow_s: float, concurrency: int) -> dict[str, Any]:
    tally = Tally()
    rounds = max(1, requests // per_round)
    for k in range(rounds):
        await _replan_round(k, tally, per_round, slow_s, concurrency)
    return tally.as_dict()


# -- context_kill --------------------------------------------------------------------------------


class _Ctx:
    def __init__(self) -> None:
        self.dead = False


class _CtxStage:
    def __init__(self, backend: _CtxBackend, name: str):
        self._b = backend
        self.name = name
        self.input_names = ("x",)
        self.output_names = ("y",)
        self.hooks = StageHooks(worker_state=self, state_probe=self)

    def worker_state(self, worker: WorkerInfo) -> _Ctx:
        ctx = _Ctx()
        with self._b.lock:
            self._b.contexts.append(ctx)
        return ctx

    def worker_state_alive(self, state: object) -> bool:
        return not (isinstance(state, _Ctx) and state.dead)

    def close_worker_state(self, state: object) -> None:
        pass

    def run(self, feeds: Mapping[str, np.ndarray], state: object = None) -> list[np.ndarray]:
        assert isinstance(state, _Ctx)
        b = self._b
        with b.lock:
            b.runs += 1
            crash = b.crash_next > 0
            if crash:
                b.crash_next -= 1
        if crash:
            state.dead = True  # dies under this run
        if state.dead:
            raise DeviceFailedError(f"context of stage {self.name!r} died", stage=self.name, device="npu")
        return [-np.asarray(feeds["x"])]

    def close(self) -> None:
        pass


class _CtxBackend:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contexts: list[_Ctx] = []
        self.runs = 0
        self.crash_next = 0
        self.hooks = BackendHooks(workers=self)

    def capabilities(self, device: Device) -> Capabilities:
        return Capabilities.everything()

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> _CtxStage:
        return _CtxStage(self, name)

    def worker_cpus(self, device: Device) -> list[tuple[int, ...]]:
        return [(), ()]


async def context_kill(requests: int, kills: int, concurrency: int) -> dict[str, Any]:
    tally = Tally()
    be = _CtxBackend()
    name = f"probe-ctx-{os.getpid()}-{random.random():.6f}"
    register_backend(name, be)
    try:
        async with Session(_chain(1), devices=[fake_device("npu", backend=name, kind="npu")],
                           max_in_flight=256) as s:
            chunk = max(1, requests // (kills + 1))
            first = in_run = idle = 0
            for k in range(kills + 1):
                n = chunk if k < kills else requests - first
                if k < kills and k % 2 == 0:
                    with be.lock:
                        be.crash_next = 1  # the next run's context dies under it
                    in_run += 1
                elif k < kills:
                    with be.lock:
                        live = [c for c in be.contexts if not c.dead]
                    if live:
                        random.choice(live).dead = True  # one dies while idle
                        idle += 1
                await _load1(s, tally, first, n, concurrency)
                first += n
            tally.add_stats(s)
            tally.rounds = kills
            out = tally.as_dict()
            out["contexts_killed_in_run"] = in_run
            out["contexts_killed_idle"] = idle
            out["contexts_built"] = len(be.contexts)
            return out
    finally:
        unregister_backend(name)


async def _load1(s: Session, tally: Tally, first: int, n: int, concurrency: int) -> None:
    """Like _load (run() tasks) for the one-node model of _chain(1): ``y = -x``."""
    tally.requests += n
    got: dict[int, np.ndarray] = {}
    ids = iter(range(first, first + n))

    async def worker() -> None:
        for i in ids:
            try:
                got[i] = (await s.run({"x": _x(i)}))["y"]
            except HetschedError as exc:
                tally.fail(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    tally.completed += len(got)
    for i, y in got.items():
        if not np.array_equal(y, -_x(i)):
            tally.wrong += 1


# -- toolkit_kill --------------------------------------------------------------------------------


def _age_s(pid: int) -> float:
    """Seconds since process ``pid`` started (0 if unknown)."""
    try:
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        up = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, up - start / os.sysconf("SC_CLK_TCK"))


def _toolkit_children() -> list[int]:
    """This process's toolkit worker processes."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    out = []
    for p in pids:
        try:
            if b"_worker_main" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.append(p)
        except OSError:
            continue
    return out


def _serving_pids(s: Session) -> list[int]:
    """The toolkit processes that hold a worker's context now (started, stage built): the
    session's internals, read for this probe only (``proc.alive`` is not asked: polling another
    thread's child would race its worker's own check)."""
    pids = []
    for w in s._scheduler.unique_workers() if s._scheduler is not None else ():
        with w._states_lock:
            states = [v for d in w._all_states for v in d.values()]
        for ctx in states:
            pid = getattr(getattr(ctx, "proc", None), "pid", None)
            if isinstance(pid, int) and _age_s(pid) > 0.0:
                pids.append(pid)
    return pids


async def toolkit_kill(requests: int, every_s: float, concurrency: int, min_age_s: float) -> dict[str, Any]:
    from hetsched import resolve_devices
    from hetsched.testing import build_board_tree

    sys.path.insert(0, _TESTS)
    from _rknn_models import conv_net  # the RKNN tests' small CNN

    tally = Tally()
    model = conv_net(seed=7)
    import onnxruntime as ort

    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    xs = [np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(16)]
    want = [ref.run(None, {"x": x})[0] for x in xs]
    killed: list[int] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="hetsched-failover-probe-") as tmp:
        os.environ["HETSCHED_RKNN_CACHE"] = str(Path(tmp) / "cache")
        root = build_board_tree(Path(tmp) / "root", "rk3588")
        devices = resolve_devices(["npu"], root=root)  # three workers, one per NPU core; no fallback

        def all_npu(problem: Any) -> dict[int, str]:
            return {u.id: "npu" for u in problem.units}

        def killer(s: Session) -> None:
            while not stop.wait(every_s):
                # a process serving a worker (a crash); with --toolkit-min-age-s 0 any toolkit
                # process, those still starting too (a crash loop)
                pids = _serving_pids(s) if min_age_s > 0 else _toolkit_children()
                pids = [p for p in pids if _age_s(p) >= min_age_s]
                if pids:
                    pid = random.choice(pids)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass

        async with Session(model, devices=devices, root=root, policy=all_npu) as s:
            await s.run({"x": xs[0]})
            t = threading.Thread(target=killer, args=(s,), name="probe-killer", daemon=True)
            t.start()
            tally.requests += requests
            ids = iter(range(requests))

            async def worker() -> None:
                for i in ids:
                    try:
                        y = (await s.run({"x": xs[i % len(xs)]}))["y"]
                    except HetschedError as exc:
                        tally.fail(exc)
                        continue
                    tally.completed += 1
                    w = want[i % len(xs)].ravel().astype(np.float64)
                    g = y.ravel().astype(np.float64)
                    if float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w))) < 0.999:
                        tally.wrong += 1

            try:
                async with anyio.create_task_group() as tg:
                    for _ in range(concurrency):
                        tg.start_soon(worker)
            finally:
                stop.set()
                await anyio.to_thread.run_sync(t.join)
            tally.add_stats(s)
    out = tally.as_dict()
    out["processes_killed"] = len(killed)
    return out


# -- main ----------------------------------------------------------------------------------------


def _sum(parts: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("requests", "completed", "failed_promised_retry", "lost", "wrong", "failures", "replans")
    return {k: sum(int(p.get(k, 0)) for p in parts) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="20k+ requests per event loop (several minutes)")
    ap.add_argument("--replan-requests", type=int, default=None, help="replan_race requests per loop")
    ap.add_argument("--per-round", type=int, default=400, help="requests per replan_race session")
    ap.add_argument("--slow-ms", type=float, default=40.0, help="how long the racing plan takes")
    ap.add_argument("--context-requests", type=int, default=None, help="context_kill requests per loop")
    ap.add_argument("--kills", type=int, default=20, help="context deaths per loop (context_kill)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--toolkit-requests", type=int, default=0,
                    help="toolkit_kill requests per loop (0: skip; needs rknn-toolkit2)")
    ap.add_argument("--toolkit-kill-every-s", type=float, default=2.0,
                    help="seconds between kills (a toolkit process takes about a second to start here)")
    ap.add_argument("--toolkit-min-age-s", type=float, default=1.0,
                    help="kill only processes serving a worker, started this long ago (0: any, starting too)")
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=LOOPS)
    a = ap.parse_args()
    if a.per_round < 1 or a.concurrency < 1 or a.kills < 0 or a.slow_ms < 0:
        ap.error("--per-round and --concurrency must be >= 1, --kills and --slow-ms >= 0")
    replan_n = a.replan_requests if a.replan_requests is not None else (25000 if a.long else 5000)
    context_n = a.context_requests if a.context_requests is not None else (25000 if a.long else 5000)
    random.seed(0)
    scenarios: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for loop in a.loops:
        scenarios[f"replan_race/{loop}"] = anyio.run(
            replan_race, replan_n, min(a.per_round, replan_n), a.slow_ms / 1e3, a.concurrency, backend=loop)
        scenarios[f"context_kill/{loop}"] = anyio.run(
            context_kill, context_n, a.kills, a.concurrency, backend=loop)
        if a.toolkit_requests > 0:
            scenarios[f"toolkit_kill/{loop}"] = anyio.run(
                toolkit_kill, a.toolkit_requests, a.toolkit_kill_every_s, min(a.concurrency, 8),
                a.toolkit_min_age_s, backend=loop)
    totals = _sum(list(scenarios.values()))
    result = {**totals, "wall_s": round(time.perf_counter() - t0, 1), "targets": TARGETS,
              "scenarios": scenarios}
    figures = measured("counts; fake backends" + ("; rknn-toolkit2 simulator processes" if a.toolkit_requests
                                                    else ""))
    print(json.dumps(labelled(result, board=host(), figures=figures)))


if __name__ == "__main__":
    main()
