"""``hetsched top`` shows per-session load (issue 26): a ``Runtime(publish_load=True)`` writes its
sessions' busy shares to ``run/hetsched/runtime-<pid>.json`` under the root (the governor's state
directory, the same contained walk) and removes it as it closes; ``top`` shows one line per
session of every running runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import numpy as np
import pytest

from hetsched import Adaptation, LiveTwin, Runtime, Session
from hetsched._cli import main
from hetsched._cli._top import format_frame, read_session_view
from hetsched._platform._fs import SysfsRoot
from hetsched._platform.telemetry import Telemetry

from _models import conv_relu_cnn


def test_top_shows_each_session_of_a_runtime_that_publishes_its_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LiveTwin("rk3588", tmp_path, noise=False).write_once()
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    state_file = tmp_path / "run" / "hetsched" / f"runtime-{os.getpid()}.json"
    frames: list[str] = []

    async def serve() -> None:
        no_replan = Adaptation(replanning=None)
        rt = Runtime(root=tmp_path, devices=["gpu"], publish_load=True, replacement=None)
        async with rt, Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="det") as det, \
                Session(conv_relu_cnn(), runtime=rt, adaptation=no_replan, name="cls") as cls:
                for _ in range(3):
                    await det.run(x)
                await cls.run(x)
                await anyio.to_thread.run_sync(rt.publish_load)
                doc = json.loads(state_file.read_text())
                assert doc["pid"] == os.getpid() and doc["kind"] == "runtime"
                assert [s["name"] for s in doc["sessions"]] == ["det", "cls"]
                assert doc["sessions"][0]["completed"] == 3 and doc["sessions"][0]["busy_share"]["gpu"] > 0
                view = read_session_view(SysfsRoot(tmp_path))
                frames.append(format_frame(Telemetry(tmp_path).sample_once(), root=str(tmp_path), interval=1.0,
                                           view=view))
        assert not state_file.exists()  # withdrawn at close
        assert not (tmp_path / "run").exists()  # and the directories its first write made

    anyio.run(serve)
    lines = [ln for ln in frames[0].splitlines() if ln.startswith("session ")]
    assert len(lines) == 2
    det_line, cls_line = lines
    assert det_line.startswith("session det ") and f"runtime pid {os.getpid()}" in det_line
    assert "3/3 done" in det_line and "devices: gpu " in det_line
    assert cls_line.startswith("session cls ") and "1/1 done" in cls_line
    # the busy time is split 3:1 (the same stage, three runs against one)
    assert det_line.split("of the busy time")[0].split()[-1] == "75%"
    assert cls_line.split("of the busy time")[0].split()[-1] == "25%"
    # closed: top shows no session
    assert main(["top", "--root", str(tmp_path), "--interval", "0.02", "--iterations", "1"]) == 0
    assert "session " not in capsys.readouterr().out


def test_top_skips_a_dead_runtimes_file_and_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LiveTwin("rk3588", tmp_path, noise=False).write_once()
    run = tmp_path / "run" / "hetsched"
    run.mkdir(parents=True)
    body = {"format": 1, "kind": "runtime", "time_s": 1.0,
            "sessions": [{"name": "ghost", "priority": 2, "busy_share": {"gpu": 0.5}, "share": 1.0,
                          "requests": 1, "completed": 1}]}
    dead = 2 ** 22 + 12345  # beyond pid_max's default: no such process
    (run / f"runtime-{dead}.json").write_text(json.dumps({**body, "pid": dead}))
    outside = tmp_path.parent / f"outside-{os.getpid()}.json"
    outside.write_text(json.dumps({**body, "pid": os.getpid()}))
    try:
        (run / f"runtime-{os.getpid()}.json").symlink_to(outside)  # a link is never followed
        assert read_session_view(SysfsRoot(tmp_path)).sessions == ()
        assert main(["top", "--root", str(tmp_path), "--interval", "0.02", "--iterations", "1"]) == 0
        assert "ghost" not in capsys.readouterr().out
    finally:
        outside.unlink()
