"""``hetsched top`` shows what a session does: per-device load on a live twin, the governor's phase and targets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsched._cli import main
from hetsched._cli._top import SessionView, format_frame, read_session_view
from hetsched._governor._engine import GovernorEngine
from hetsched._governor._phase import Phase
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform._fs import SysfsRoot
from hetsched._platform.telemetry import Telemetry
from hetsched._twin.live import LiveTwin
from hetsched._twin.loadfile import LoadReporter
from hetsched.testing import build_board_tree


def test_session_load_per_device_on_a_live_twin(tmp_path: Path) -> None:
    root = tmp_path / "live"
    twin = LiveTwin("rk3588", root, noise=False)
    twin.advance(0)
    reporter = LoadReporter.for_root(root)
    assert reporter is not None
    with reporter:
        reporter.report("gpu", 0.08)
        reporter.report("npu", 0.03)
        view = read_session_view(SysfsRoot(root))
        twin.advance(0.1)
    assert view.live_twin and view.reporters == (os.getpid(),)
    snap = Telemetry(root).sample_once()
    frame = format_frame(snap, root=str(root), interval=1.0, view=view)
    load = next(line for line in frame.splitlines() if line.startswith("load"))
    assert f"pids {os.getpid()}" in load
    assert "gpu 80%" in load and "npu 30%" in load
    assert read_session_view(SysfsRoot(tmp_path)) == SessionView()  # no twin, no governor


def test_top_shows_the_governor_phase_and_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "live"
    twin = LiveTwin("rk3588", root)
    twin.advance(0)
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s
        twin.advance(s)

    engine = GovernorEngine(SysfsPort(root, clock=lambda: t[0], sleep=sleep))
    engine.start()
    for _ in range(6):
        sleep(0.2)
        engine.enter(Phase.IDLE)
        sleep(0.2)
        engine.enter(Phase.INFER)
    targets = dict(engine.current)
    assert main(["top", "--root", str(root), "--interval", "0.02", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    gov = next(line for line in out.splitlines() if line.startswith("governor"))
    assert f"pid {os.getpid()}" in gov and "phase infer" in gov
    assert f"cluster4={round(targets['cluster4'] / 1e6)}" in gov and f"gpu={round(targets['gpu'] / 1e6)}" in gov
    engine.close()
    assert main(["top", "--root", str(root), "--interval", "0.02", "--iterations", "1"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("governor")]


def test_dead_governor_and_trips_in_the_frame(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_board_tree(tmp_path / "rk", "rk3588")
    (root / "sys/devices/virtual/thermal/thermal_zone0/temp").write_text("80000\n")
    view = SessionView(governor_pid=999999, governor_alive=False)
    frame = format_frame(Telemetry(root).sample_once(), root=str(root), interval=1.0, view=view)
    assert "soc-thermal=80.0C/75/115!" in frame  # at or above the passive trip: marked
    assert "bigcore0-thermal=" in frame and "/115" in frame
    assert "pid 999999, which is not running" in frame and "hetsched doctor" in frame
    assert "power " in frame  # rail power (estimated on RK3588)
