"""``hetsched info`` and ``hetsched top``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetsched._cli import main

from _platform_trees import orin_nx_tree, rk3588_tree, write_tree


def _info_json(capsys: pytest.CaptureFixture[str], root: Path | str) -> dict:
    assert main(["info", "--root", str(root), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_json_rk3588(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = _info_json(capsys, write_tree(tmp_path, rk3588_tree()))
    assert info["soc"] == "rk3588"
    clusters = info["cpu_clusters"]
    assert [c["cpus"] for c in clusters] == [[0, 1, 2, 3], [4, 5], [6, 7]]
    assert clusters[0]["frequencies_khz"] == [408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000]
    assert all(c["governor"] == "ondemand" for c in clusters)
    devs = {d["kind"]: d for d in info["devices"]}
    assert set(devs) == {"gpu", "npu", "memory"}
    assert devs["gpu"]["name"] == "fb000000.gpu" and devs["gpu"]["max_freq_hz"] == 1000000000
    assert devs["gpu"]["frequencies_hz"][0] == 300000000  # ascending although the driver prints descending
    assert devs["memory"]["name"] == "dmc" and devs["memory"]["frequencies_hz"][-1] == 2112000000
    zone = info["thermal_zones"][0]
    assert zone["type"] == "soc-thermal" and zone["temp_c"] == pytest.approx(44.384)
    assert [(t["temp_c"], t["type"]) for t in zone["trips"]] == [(75.0, "passive"), (85.0, "passive"), (115.0, "critical")]
    assert info["power_rails"] and {r["source"] for r in info["power_rails"]} == {"estimated"}


def test_info_json_orin_nx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = _info_json(capsys, write_tree(tmp_path, orin_nx_tree()))
    assert info["soc"] == "orin-nx" and info["jetpack"] == "6"
    assert [(r["name"], r["source"]) for r in info["power_rails"]] == [
        ("VDD_IN", "measured"),
        ("VDD_CPU_GPU_CV", "measured"),
        ("VDD_SOC", "measured"),
    ]
    cv0 = next(z for z in info["thermal_zones"] if z["type"] == "cv0-thermal")
    assert cv0["temp_c"] == 48.0  # this fixture's cv zones are readable (EAGAIN cases are in the discovery tests)


def test_info_host_root(capsys: pytest.CaptureFixture[str]) -> None:
    info = _info_json(capsys, "/")
    assert info["soc"] is None  # this x86 host is no SoC board
    assert isinstance(info["cpu_clusters"], list) and isinstance(info["thermal_zones"], list)


def test_info_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--root", str(write_tree(tmp_path, rk3588_tree()))]) == 0
    out = capsys.readouterr().out
    assert "SoC:       rk3588" in out and "cluster4" in out and "fb000000.gpu" in out
    assert "soc-thermal" in out and "estimated" in out


def test_info_bad_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["info", "--root", str(tmp_path / "missing")])
    assert info.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_top_iterations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_tree(tmp_path, orin_nx_tree())
    assert main(["top", "--root", str(root), "--interval", "0.02", "--iterations", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("hetsched top") == 3
    assert "soc=orin-nx" in out and "cluster0" in out and "nvhost_podgov" in out
    assert "GR3D_FREQ 54%@[306]" in out and "VDD_IN 4831mW" in out  # tegrastats-style line
    assert "\x1b[" not in out  # no screen control when not a terminal


@pytest.mark.parametrize(("args", "msg"), [(["--interval", "0"], "interval"), (["--iterations", "0"], "iterations")])
def test_top_bad_args(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], msg: str) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["top", "--root", str(tmp_path), *args])
    assert info.value.code == 2 and f"argument --{msg}" in capsys.readouterr().err


@pytest.mark.parametrize("soc", ["rk3588", "orin-nx"])
def test_twin_once_then_info(tmp_path: Path, capsys: pytest.CaptureFixture[str], soc: str) -> None:
    from hetsched._cli import build_parser

    if "twin" not in build_parser().format_help():
        pytest.skip("the twin subcommand is not there yet")
    assert main(["twin", soc, "--root", str(tmp_path), "--once"]) == 0
    capsys.readouterr()
    info = _info_json(capsys, tmp_path)
    assert info["soc"] == soc
    kinds = sorted(d["kind"] for d in info["devices"])
    assert kinds == (["gpu", "memory", "npu"] if soc == "rk3588" else ["gpu", "memory"])
    sources = {r["source"] for r in info["power_rails"]}
    assert sources == ({"estimated"} if soc == "rk3588" else {"measured"})
    assert main(["top", "--root", str(tmp_path), "--interval", "0.02", "--iterations", "2"]) == 0
    assert capsys.readouterr().out.count(f"soc={soc}") == 2
