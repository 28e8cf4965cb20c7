"""``hetsched run MODEL --root DIR --governor phase`` on a live twin: governs, then restores.

The twin runs as its own process (as it would beside a real workload) and the CLI as
another; every knob the governor may touch must be byte-identical afterwards, also
when the run is stopped with SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetsched.testing import dvfs_knobs


def _knobs(root: Path) -> dict[str, bytes]:
    return dvfs_knobs(root)


def _settled_knobs(root: Path, want: dict[str, bytes], *, timeout_s: float = 10.0) -> dict[str, bytes]:
    """The knobs once the twin has caught up: it polls the tree, so a devfreq ``userspace/``
    directory (which a kernel removes the moment the governor changes back) goes on the
    twin's next update, not at the restoring write itself."""
    deadline = time.monotonic() + timeout_s
    knobs = _knobs(root)
    while knobs != want and time.monotonic() < deadline:
        time.sleep(0.05)
        knobs = _knobs(root)
    return knobs


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetsched", *args]


@pytest.fixture
def live_twin(tmp_path: Path):
    root = tmp_path / "board"
    root.mkdir()
    twin = subprocess.Popen(_cli("twin", "rk3588", "--root", str(root)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (root / "sys/devices/system/cpu/cpufreq/policy4/scaling_governor").exists():
            if time.monotonic() > deadline or twin.poll() is not None:
                raise AssertionError("the twin did not start")
            time.sleep(0.05)
        time.sleep(0.3)  # one full update, so every file is written
        yield root
    finally:
        twin.send_signal(signal.SIGTERM)
        twin.wait(timeout=30)


def test_governed_run_restores_every_knob(live_twin: Path) -> None:
    before = _knobs(live_twin)
    assert len(before) >= 15
    done = subprocess.run(_cli("run", "light_squeezenet", "--root", str(live_twin), "--governor", "phase",
                               "--requests", "6", "--max-unit-nodes", "8", "--json"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["governor"]["phase_switches"] > 0 and summary["governor"]["writes"] > 0
    assert _settled_knobs(live_twin, before) == before


def test_sigterm_restores_every_knob(live_twin: Path) -> None:
    before = _knobs(live_twin)
    run = subprocess.Popen(_cli("run", "light_squeezenet", "--root", str(live_twin), "--governor", "phase",
                                "--requests", "1000000", "--max-unit-nodes", "8"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # Wait until the governor has really taken the clocks over.
        while _knobs(live_twin) == before:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the governor never wrote a clock"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    assert "clocks restored" in err
    assert _settled_knobs(live_twin, before) == before


def test_governor_needs_root_dir() -> None:
    from hetsched._cli import main

    with pytest.raises(SystemExit, match="--governor needs --root"):
        main(["run", "light_squeezenet", "--governor", "phase", "--requests", "1"])


def test_frame_deadline_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsched._cli import main
    from hetsched.testing import build_board_tree

    build_board_tree(tmp_path, "rk3588")
    rc = main(["run", "light_squeezenet", "--root", str(tmp_path), "--governor", "phase", "--frame-deadline-ms", "0",
               "--requests", "1"])
    assert rc != 0
    assert "loop_deadline_s=0.0" in capsys.readouterr().err
