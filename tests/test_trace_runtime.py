"""A Runtime's trace (issue 26): ``Runtime(trace=PATH)`` writes one Chrome trace for every
session attached to it, with a track (process) per session for its requests and its stage
slices on the shared device workers labelled by session; ``Session(trace=)`` on a private
runtime keeps writing its own file (tests/test_trace.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from hetsched import Priority, Runtime, Session

from _models import neg_relu_chain

pytestmark = pytest.mark.anyio


def _processes(trace: dict[str, Any]) -> dict[str, int]:
    return {e["args"]["name"]: e["pid"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


async def test_a_runtimes_trace_has_a_track_per_session(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "board.json"
    x = {"x": np.ones(16, np.float32)}
    async with Runtime(devices=["cpu:0", "cpu:1"], trace=path, replacement=None) as rt:
        async with Session(neg_relu_chain(), runtime=rt, name="det", max_unit_nodes=1) as det, \
                   Session(neg_relu_chain(), runtime=rt, name="cls", max_unit_nodes=1) as cls, \
                   anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(lambda: det.run(x, priority=Priority.HIGH))
                tg.start_soon(cls.run, x)
        # a session attaching later under a taken name gets its own track too
        async with Session(neg_relu_chain(), runtime=rt, name="det") as det2:
            await det2.run(x)
            assert det2.name == "det#2"
    trace = json.loads(path.read_text())
    procs = _processes(trace)
    assert {"requests det", "requests cls", "requests det#2"} <= set(procs)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for session, count in (("det", 3), ("cls", 3), ("det#2", 1)):
        reqs = [e for e in slices if e.get("cat") == "request" and e["pid"] == procs[f"requests {session}"]]
        assert len(reqs) == count  # request ids are per session: each session's on its own track
        assert {e["args"]["session"] for e in reqs} == {session}
        assert sorted(e["args"]["request_id"] for e in reqs) == sorted({e["args"]["request_id"] for e in reqs})
        stages = [e for e in slices if e.get("cat") == "stage" and e["args"].get("session") == session]
        assert len(stages) % count == 0 and stages  # the plan's stages, once per request
        assert all(e["name"].startswith(f"{session}: ") for e in stages)
        # every stage slice sits on a device worker's track, and belongs to one of its requests
        device_pids = {pid for name, pid in procs.items() if name.startswith("device ")}
        assert {e["pid"] for e in stages} <= device_pids
        assert {e["args"]["request_id"] for e in stages} == {e["args"]["request_id"] for e in reqs}
    det_prio = {e["args"]["priority"] for e in slices
                if e.get("cat") == "request" and e["pid"] == procs["requests det"]}
    assert det_prio == {"HIGH"}
    # slices of one track never overlap, the sessions' request lanes included
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in itertools.pairwise(spans))


async def test_a_session_on_a_private_runtime_still_writes_its_own_trace(tmp_path: Path, anyio_backend: str) -> None:
    path = tmp_path / "one.json"
    async with Session(neg_relu_chain(), devices=["cpu:0"], trace=path, max_unit_nodes=1) as s:
        await s.run({"x": np.ones(16, np.float32)})
    trace = json.loads(path.read_text())
    procs = _processes(trace)
    assert "requests" in procs and not any(n.startswith("requests ") for n in procs)
    stages = [e for e in trace["traceEvents"] if e.get("cat") == "stage"]
    assert stages and all("session" not in e["args"] and ":" not in e["name"] for e in stages)
