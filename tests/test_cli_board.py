"""CLI on simulated boards: twin --once, info --root, run --root, demo --soc."""

from __future__ import annotations

import json

import pytest

from hetsched._cli import main


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_twin_info_run_on_a_board_tree(soc: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / soc
    assert main(["twin", soc, "--root", str(root), "--once"]) == 0
    capsys.readouterr()
    assert main(["info", "--root", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["soc"] == soc
    kinds = {d["kind"] for d in info["devices"]}
    assert {"gpu", "memory"} <= kinds
    assert main(["run", "light_squeezenet", "--root", str(root), "--requests", "2", "--max-unit-nodes", "8",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["requests"] == 2
    devices = {row["device"] for row in summary["modelled"]}
    assert "gpu" in devices  # the convolutions go to the board's accelerator
    assert all(row["time_ms_per_run"] > 0 and row["energy_mj_per_run"] >= 0 for row in summary["modelled"])


def test_run_root_without_a_board_is_a_clear_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "light_squeezenet", "--root", str(tmp_path), "--requests", "1"]) == 1
    err = capsys.readouterr().err
    assert "UnknownSocError" in err and str(tmp_path) in err


def test_demo_on_a_simulated_soc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--soc", "rk3588", "--requests", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["soc"] == "rk3588"
    assert summary["max_abs_diff_vs_onnxruntime"] == 0.0
    # The CNN belongs on an accelerator, kept whole (no stage of its own for its constant weights).
    assert summary["stages"] >= 1
    assert set(summary["stages_per_device"]) <= {"cluster0", "cluster4", "cluster6", "gpu", "npu"}
    assert set(summary["stages_per_device"]) & {"gpu", "npu"}
