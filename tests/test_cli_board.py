"""CLI on simulated boards: twin --once, info --root, run --root, demo --soc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetsched._cli import main


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_twin_info_run_on_a_board_tree(soc: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    from hetsched import resolve_devices

    # the convolutions go to an accelerator the board has a backend for (the RK3588's NPU when its
    # toolkit is set up, its Mali only through ncnn on a hardware Vulkan driver: issue 24), unless that
    # accelerator refused them (the NPU's probe run: light_squeezenet's shipped constant weights
    # overflow fp16), and then the summary says why
    defaults = resolve_devices(None, root=root)
    accelerators = {d.name for d in defaults if d.kind != "cpu"}
    assert devices and devices <= {d.name for d in defaults}
    assert devices & accelerators or not accelerators or any(r["device"] in accelerators for r in summary["refused"])
    assert all(row["time_ms_per_run"] > 0 and row["energy_mj_per_run"] >= 0 for row in summary["modelled"])


def test_run_root_without_a_board_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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


# -- boards as roots: --devices with --root / --soc, plan --root, --version ------------------------


@pytest.fixture(scope="module")
def board_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from hetsched.testing import build_board_tree

    return {soc: str(build_board_tree(tmp_path_factory.mktemp(soc), soc)) for soc in ("rk3588", "orin-nx")}


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import hetsched

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"hetsched {hetsched.__version__}"


def test_plan_root_defaults_to_the_boards_devices_and_says_what_it_left_out(
        board_roots: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("HETSCHED_RKNN_PYTHON", str(tmp_path / "no-such-python"))
    import hetsched.backends._ncnn_devices as ncnn_devices

    # as on every real RK3588 today: no Vulkan driver for the Mali, so no backend for it (issue 24)
    monkeypatch.setattr(ncnn_devices, "hardware_reason", lambda: "ncnn is not installed (pip install 'hetsched[ncnn]')")
    assert main(["plan", "light_squeezenet", "--root", board_roots["rk3588"], "--json", "--quiet"]) == 0
    plan = _last_json(capsys)
    assert [d["name"] for d in plan["devices"]] == ["cluster0", "cluster4", "cluster6"]
    gpu_note, note = plan["device_notes"]
    assert gpu_note.startswith("gpu: left out") and "hetsched[ncnn]" in gpu_note
    assert note.startswith("npu: left out") and "hetsched setup rknn" in note
    assert main(["plan", "light_squeezenet", "--root", board_roots["rk3588"], "--quiet"]) == 0
    assert "note: npu: left out" in capsys.readouterr().out
    assert main(["plan", "light_squeezenet", "--root", board_roots["orin-nx"], "--json", "--quiet"]) == 0
    plan = _last_json(capsys)
    assert [d["name"] for d in plan["devices"]] == ["cluster0", "cluster4", "gpu", "dla:0", "dla:1"]
    assert plan["device_notes"] == []


def test_plan_root_honours_board_specs(board_roots: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "light_squeezenet", "--root", board_roots["orin-nx"], "--json", "--quiet",
                 "--devices", "little", "dla:1"]) == 0
    plan = _last_json(capsys)
    assert [(d["name"], d["kind"]) for d in plan["devices"]] == [("cluster0", "cpu"), ("cluster4", "cpu"),
                                                                  ("dla:1", "dla")]
    assert {s["device"] for s in plan["stages"]} <= {"cluster0", "cluster4", "dla:1"}
    assert "device_notes" not in plan
    assert main(["plan", "light_squeezenet", "--root", board_roots["orin-nx"], "--devices", "npu:0"]) == 1
    err = capsys.readouterr().err
    assert "DeviceSpecError" in err and "'npu:0'" in err and "dla:0" in err and "Traceback" not in err


def test_run_root_honours_devices(board_roots: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "light_squeezenet", "--root", board_roots["rk3588"], "--requests", "2", "--json",
                 "--devices", "big", "gpu"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["requests"] == 2
    assert {s["device"] for s in summary["stages"]} <= {"cluster4", "cluster6", "gpu"}
    assert main(["run", "light_squeezenet", "--root", board_roots["rk3588"], "--requests", "1",
                 "--devices", "dla:0"]) == 1
    err = capsys.readouterr().err
    assert "'dla:0'" in err and "rk3588" in err and "npu:0-2" in err


def test_demo_soc_and_root_honour_devices(board_roots: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--soc", "orin-nx", "--requests", "1", "--json", "--devices", "cluster0", "dla:0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["devices"] == ["cluster0", "dla:0"] and summary["soc"] == "orin-nx"
    assert set(summary["stages_per_device"]) <= {"cluster0", "dla:0"}
    assert main(["demo", "--root", board_roots["orin-nx"], "--requests", "1", "--json", "--devices", "gpu"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["devices"] == ["gpu"] and summary["soc"] == "orin-nx"
    assert main(["demo", "--soc", "rk3588", "--requests", "1", "--devices", "npu:0"]) == 1
    err = capsys.readouterr().err
    assert "'npu:0'" in err and "--root" in err
    assert main(["demo", "--soc", "orin-nano", "--requests", "1", "--devices", "dla:0"]) == 1
    err = capsys.readouterr().err
    assert "'dla:0'" in err and "of --soc orin-nano" in err and "gpu" in err
    with pytest.raises(SystemExit, match="--soc and --root"):
        main(["demo", "--soc", "rk3588", "--root", board_roots["rk3588"]])
