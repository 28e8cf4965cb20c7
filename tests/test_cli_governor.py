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
from collections.abc import Iterator
from pathlib import Path

import pytest
from _twin_process import twin_process

from hetsched.testing import dvfs_knobs


def _knobs(root: Path) -> dict[str, bytes]:
    return dvfs_knobs(root)


def _settled_knobs(root: Path, want: dict[str, bytes], *, timeout_s: float = 30.0) -> dict[str, bytes]:
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
def live_twin(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "board"
    root.mkdir()
    with twin_process("rk3588", root, "sys/devices/system/cpu/cpufreq/policy4/scaling_governor"):
        yield root


def test_governed_run_restores_every_knob(live_twin: Path) -> None:
    before = _knobs(live_twin)
    assert len(before) >= 15
    done = subprocess.run(_cli("run", "light_squeezenet", "--root", str(live_twin), "--governor", "phase",
                               "--requests", "6", "--max-unit-nodes", "8", "--json", "--frame-deadline-ms", "40"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    gov = summary["governor"]
    assert gov["phase_switches"] > 0 and gov["writes"] > 0
    assert gov["writes"] == sum(gov["writes_per_domain"].values())
    assert set(gov["writes_per_domain_per_s"]) == set(gov["writes_per_domain"])
    assert {"infer", "idle"} <= set(gov["phases"]) and gov["phases"]["infer"]["clocks_hz"]
    assert gov["peak_temp_c"] and isinstance(gov["locked_domains"], list)
    # frame-paced: judged on the twin's modelled (board) latency, energy per request reported
    assert summary["latency_source"] == "modelled" and summary["deadline_misses"] >= 0
    assert summary["energy_per_request_j"] == pytest.approx(summary["energy_j"] / 6)
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


@pytest.mark.parametrize("gap_s", [0.005, 0.015])
def test_a_second_sigterm_during_the_restore_is_held(live_twin: Path, gap_s: float) -> None:
    # The signal receiver used to close with the run it cancelled: a second SIGTERM a few ms
    # after the first then fell to the default handler and killed the restore half-way.
    before = _knobs(live_twin)
    run = subprocess.Popen(_cli("run", "light_squeezenet", "--root", str(live_twin), "--governor", "phase",
                                "--requests", "1000000", "--max-unit-nodes", "8"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _knobs(live_twin) == before:
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the governor never wrote a clock"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        time.sleep(gap_s)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    assert "clocks restored" in err
    assert _settled_knobs(live_twin, before) == before


def test_dry_run_prints_each_decision_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsched._cli import main
    from hetsched.testing import build_board_tree

    build_board_tree(tmp_path, "rk3588")
    before = _knobs(tmp_path)
    rc = main(["run", "light_squeezenet", "--root", str(tmp_path), "--governor", "phase", "--dry-run",
               "--requests", "3", "--max-unit-nodes", "8", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    lines = [line for line in out.err.splitlines() if line.startswith("governor: dry run: ")]
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert len(lines) == summary["governor"]["decisions_logged"] > 0
    assert all(" -> " in line and line.endswith(")") for line in lines)
    assert summary["governor"]["writes"] == 0 and summary["governor"]["dry_run"]
    assert _knobs(tmp_path) == before


def test_governor_needs_root_dir() -> None:
    from hetsched._cli import main

    with pytest.raises(SystemExit, match="--governor needs --root"):
        main(["run", "light_squeezenet", "--governor", "phase", "--requests", "1"])


def test_frame_deadline_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsched._cli import main
    from hetsched.testing import build_board_tree

    build_board_tree(tmp_path, "rk3588")
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["run", "light_squeezenet", "--root", str(tmp_path), "--governor", "phase", "--frame-deadline-ms", "0",
              "--requests", "1"])
    assert info.value.code == 2
    assert "argument --frame-deadline-ms: '0': must be a positive number" in capsys.readouterr().err


def test_strict_budget_needs_a_budget_and_the_governor(tmp_path: Path) -> None:
    from hetsched._cli import main
    from hetsched.testing import build_board_tree

    build_board_tree(tmp_path, "rk3588")
    with pytest.raises(SystemExit, match="--strict-budget needs --governor phase and --power-budget"):
        main(["run", "light_squeezenet", "--root", str(tmp_path), "--governor", "phase", "--strict-budget",
              "--requests", "1"])


@pytest.mark.parametrize("strict", [False, True])
def test_a_budgeted_run_reports_its_budget_and_probe_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          strict: bool) -> None:
    from hetsched._cli import main
    from hetsched.testing import build_board_tree

    build_board_tree(tmp_path, "rk3588")
    rc = main(["run", "light_squeezenet", "--root", str(tmp_path), "--governor", "phase", "--dry-run",
               "--power-budget", "5", *(["--strict-budget"] if strict else []),
               "--requests", "2", "--max-unit-nodes", "8", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    gov = json.loads(out.out.strip().splitlines()[-1])["governor"]
    assert gov["power_budget_w"] == 5.0
    assert gov["guarded_probes"] is (not strict)
    assert gov["guarded_probes_stopped"] == 0
