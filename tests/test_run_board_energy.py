"""``hetsched run --root DIR``: the board's energy (its measured input rail) beside the stages'.

The stage energy (``energy_per_request_j``) is the stages' modelled joules; the board energy
(``board_energy_per_request_j``) is the root's measured board-input rail (``VDD_IN``)
integrated over the run, the idle between frames included. On a live orin-nx twin (its own
process, as beside a real workload) the run samples the rail through the platform layer; the
test records every snapshot the run took and integrates ``VDD_IN`` over them itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _twin_process import twin_process

from hetsched._cli import _run_governed, main
from hetsched._cli._run_governed import BoardEnergy
from hetsched._platform.telemetry import Telemetry
from hetsched._snapshot import Snapshot
from hetsched._twin.live import LiveTwin


@pytest.fixture
def live_orin(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "board"
    root.mkdir()
    with twin_process("orin-nx", root, "sys/kernel/debug/bpmp/debug/clk/emc/rate"):
        yield root


@pytest.fixture
def snapshots(monkeypatch: pytest.MonkeyPatch) -> list[Snapshot]:
    """Every snapshot the run's board-energy telemetry takes (other telemetry, the session's
    own, is not recorded)."""
    taken: list[Snapshot] = []

    class Recording(Telemetry):
        def sample_once(self) -> Snapshot:
            snap = super().sample_once()
            taken.append(snap)
            return snap

    monkeypatch.setattr(_run_governed, "Telemetry", Recording)
    return taken


def _vdd_in_integral(snaps: list[Snapshot]) -> tuple[float, int]:
    """Each reading stands for the time since the previous reading (a rail's mean over the
    interval that just ended); samples without a reading are skipped."""
    energy, last_t, n = 0.0, None, 0
    for snap in snaps:
        p = snap.rails["VDD_IN"].power_w
        if p is None:
            continue
        if last_t is not None:
            energy += p * (snap.time_s - last_t)
        last_t, n = snap.time_s, n + 1
    return energy, n


@pytest.mark.parametrize("pacing", [["--frame-deadline-ms", "33"], []], ids=["paced", "background"])
def test_board_energy_is_the_vdd_in_integral_on_a_live_orin_twin(
    live_orin: Path, snapshots: list[Snapshot], capsys: pytest.CaptureFixture[str], pacing: list[str]
) -> None:
    n = 6
    rc = main(["run", "light_squeezenet", "--root", str(live_orin), "--requests", str(n), "--json", *pacing])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["board_energy_source"] == "measured: VDD_IN"
    assert "board_energy_note" not in out
    energy, readings = _vdd_in_integral(snapshots)
    if pacing:
        assert len(snapshots) == n + 2  # start, every request's end, the end
    assert out["board_energy_samples"] == readings >= 2
    assert out["board_energy_j"] == pytest.approx(energy, rel=1e-9)
    assert out["board_energy_per_request_j"] == pytest.approx(energy / n, rel=1e-9)
    # The board draws for memory, CPUs and idle too: far more than the stages' modelled joules.
    assert out["board_energy_per_request_j"] > out["energy_per_request_j"] > 0
    assert out["energy_per_request_j"] == pytest.approx(out["energy_j"] / n)


def test_rk3588_has_no_measured_board_rail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LiveTwin("rk3588", tmp_path, noise=False).write_once()
    assert main(["run", "light_squeezenet", "--root", str(tmp_path), "--requests", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["board_energy_j"] is None and out["board_energy_per_request_j"] is None
    assert out["board_energy_source"] is None
    assert "no measured board-input rail" in out["board_energy_note"]
    assert out["energy_per_request_j"] > 0  # the stage energy is still modelled
    assert main(["run", "light_squeezenet", "--root", str(tmp_path), "--requests", "2"]) == 0
    human = capsys.readouterr().out
    assert "stage energy:" in human and "board energy: n/a (no measured board-input rail" in human


def test_human_output_has_the_board_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    LiveTwin("orin-nx", tmp_path, noise=False).write_once()
    assert main(["run", "light_squeezenet", "--root", str(tmp_path), "--requests", "2"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("board energy:")]
    assert len(lines) == 1 and "mJ per request (measured: VDD_IN" in lines[0]


def test_each_reading_stands_for_the_time_since_the_one_before(tmp_path: Path) -> None:
    """Injected clock, rail rewritten between samples: energy is sum(p_i * (t_i - t_prev)), a
    sample without a reading skipped (the next one covers its interval)."""
    LiveTwin("orin-nx", tmp_path, noise=False).write_once()
    now = [0.0]
    board = BoardEnergy(tmp_path, clock=lambda: now[0])
    assert board.rail == "VDD_IN"
    rail = next(r for r in Telemetry(tmp_path).platform.rails if r.name == "VDD_IN")
    assert rail.voltage_path is not None and rail.current_path is not None
    (tmp_path / rail.voltage_path).write_text("5000\n")  # mV
    current = tmp_path / rail.current_path
    for t, ma in ((0.0, 1000), (1.0, 2000), (3.0, None), (4.0, 800)):  # 5 W, 10 W, -, 4 W
        now[0] = t
        current.write_text(f"{ma}\n" if ma is not None else "")
        board.sample()
    assert board.samples == 3
    assert board.energy_j == pytest.approx(10.0 * 1.0 + 4.0 * 3.0)
    fields = board.fields(2)
    assert fields["board_energy_per_request_j"] == pytest.approx(11.0)
    assert fields["board_energy_source"] == "measured: VDD_IN"


def test_a_run_without_root_says_why_there_is_no_board_energy() -> None:
    board = BoardEnergy("/nonexistent-hetsched-root")
    assert board.source is None and board.note is not None
    board.sample()  # nothing to read: a no-op, not an error
    fields = board.fields(3)
    assert fields["board_energy_j"] is None and fields["board_energy_note"] == board.note
