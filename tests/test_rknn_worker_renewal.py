"""A killed rknn-toolkit2 worker process costs the runs that were in it, not its NPU worker
(issue 23, item 3), with the real toolkit and its simulator on an rk3588 twin root and no
fallback device. Skipped only when no toolkit environment is found; the toolkit-free version of
the same defect is tests/test_failover_races.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort
import pytest

from hetsched import BackendUnavailableError, Device, EventInfo, Hooks, Session, resolve_devices
from hetsched._rknn.client import ToolkitProcess

from _rknn_models import conv_net

try:
    from hetsched._rknn.env import find_toolkit_python

    find_toolkit_python()
except BackendUnavailableError as _exc:
    pytest.skip(f"no rknn-toolkit2 environment: {_exc}", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hetsched.testing import build_board_tree

    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.fixture(autouse=True)
def _cache_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "rknn-cache"))


def _npu_only(root: Path, spec: str) -> list[Device]:
    (dev,) = resolve_devices([spec], root=root)
    return [dataclasses.replace(dev, options=dict(dev.options))]


def _all_npu(problem: Any) -> dict[int, str]:
    return {u.id: next(d for d in u.candidates if d.startswith("npu")) for u in problem.units}


def _toolkit_children() -> set[int]:
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    out = set()
    for p in pids:
        try:
            if b"_worker_main" in Path(f"/proc/{p}/cmdline").read_bytes() and _state(p) not in (None, "Z"):
                out.add(p)
        except OSError:
            continue
    return out


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited as a whole and can be reaped (peeked with ``WNOWAIT``,
    not reaped: its ``Popen`` does that). /proc's "Z" is not enough: a multi-threaded process's
    leader shows "Z" while its other threads are still exiting, and ``waitpid`` waits for them."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


def _wait_until(done: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


class _Errors(Hooks):
    """The stage errors seen (what the failover counted), for the assertion messages."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def after_stage(self, info: EventInfo) -> None:
        if info.error is not None:
            self.errors.append(str(info.error))


class _KillInFlight:
    """Wraps ``ToolkitProcess.run``: once armed, the next run SIGKILLs its own process just
    before it asks it to run (so the run is in flight in a dead process)."""

    def __init__(self) -> None:
        self.armed = False
        self.killed: list[int] = []
        self._lock = threading.Lock()
        self._orig = ToolkitProcess.run

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        orig = self._orig

        def run(proc: ToolkitProcess, handle: int, inputs: Any, outputs: Any) -> None:
            with self._lock:
                fire, self.armed = self.armed, False
            if fire and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
                self.killed.append(proc.pid)
                _wait_until(lambda: _exited(proc.pid or 0), 10)
            orig(proc, handle, inputs, outputs)

        monkeypatch.setattr(ToolkitProcess, "run", run)


@pytest.mark.anyio
async def test_a_killed_toolkit_process_is_replaced_and_the_npu_keeps_serving(
        twin_root: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One NPU worker, no fallback device. Its toolkit process is killed twice: under a run
    (that run fails, starts over, and succeeds on a new process) and while idle (replaced before
    the next run: no run fails). Today's code failed every later request."""
    model = conv_net(seed=5)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    killer = _KillInFlight()
    killer.install(monkeypatch)
    before = _toolkit_children()
    seen = _Errors()

    def check(out: dict[str, np.ndarray], x: np.ndarray) -> None:
        want = sess.run(None, {"x": x})[0]
        got = out["y"].ravel().astype(np.float64)
        cos = float(got @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want)))
        assert cos >= 0.999

    xs = [np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32) for i in range(12)]
    with anyio.fail_after(300):
        async with Session(model, devices=_npu_only(twin_root, "npu:0"), root=twin_root, policy=_all_npu,
                           hooks=[seen]) as s:
            assert {st.device for st in s.plan.stages} == {"npu:0"}
            check(await s.run({"x": xs[0]}), xs[0])
            first = _toolkit_children() - before
            assert len(first) == 1
            # 1. killed under a run
            killer.armed = True
            for x in xs[:6]:
                check(await s.run({"x": x}), x)
            assert len(killer.killed) == 1 and killer.killed[0] in first
            fo = s.statistics().failover
            assert fo is not None and fo.failures.get("npu:0") == 1, seen.errors  # the run in flight, no more
            second = _toolkit_children() - before
            assert len(second) == 1 and not second & first
            # 2. killed while idle
            (pid,) = second
            os.kill(pid, signal.SIGKILL)
            await anyio.to_thread.run_sync(_wait_until, lambda: _exited(pid), 10.0)
            for x in xs[6:]:
                check(await s.run({"x": x}), x)
            stats = s.statistics()
            assert stats.requests_failed == 0 and stats.requests_completed == 13
            assert stats.failover is not None and stats.failover.failures.get("npu:0") == 1, seen.errors
            assert stats.failover.quarantined == () and stats.failover.unreplaceable == ()
            assert stats.worker_states_renewed == 2
            third = _toolkit_children() - before
            assert len(third) == 1 and not third & (first | second)
    _wait_until(lambda: not _toolkit_children() - before, 10)
    assert not _toolkit_children() - before
    for p in (*first, *second):
        assert _state(p) is None, f"toolkit worker {p} left behind ({_state(p)})"  # reaped: no zombie
