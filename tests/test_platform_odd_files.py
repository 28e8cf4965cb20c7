"""One odd telemetry file never stops a tool (issue 23 item 8).

A directory where a value belongs, a link leading out of the root, a FIFO and garbage are all the
same thing to every reader: an unreadable file, skipped, reported once. ``doctor`` names a link out
of the root as the ``PathOutsideRootError`` it is, and is the last tool to stop on a broken tree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hetsched._cli import main
from hetsched._platform import SysfsRoot, Telemetry

from _platform_trees import rk3588_tree, write_tree

ZONE1_TEMP = "sys/devices/virtual/thermal/thermal_zone1/temp"
CUR4 = "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq"
GPU_LOAD = "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu/load"
NPU_LOAD = "sys/kernel/debug/rknpu/load"
ODD_FILES = (ZONE1_TEMP, CUR4, GPU_LOAD, NPU_LOAD)


def _directory(p: Path, outside: Path) -> None:
    p.mkdir()


def _link_out(p: Path, outside: Path) -> None:
    p.symlink_to(outside)


def _fifo(p: Path, outside: Path) -> None:
    os.mkfifo(p)


def _garbage(p: Path, outside: Path) -> None:
    p.write_bytes(b"\xff\x00zz")


KINDS: dict[str, Callable[[Path, Path], None]] = {
    "directory": _directory, "link-out-of-root": _link_out, "fifo": _fifo, "garbage": _garbage,
}


@pytest.fixture(params=sorted(KINDS))
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, Path]:
    """A ROCK 5B tree whose four telemetry files are all of one odd kind; returns (kind, root, outside)."""
    outside = tmp_path / "outside"
    outside.write_text("123\n")
    root = write_tree(tmp_path / "root", rk3588_tree())
    for rel in ODD_FILES:
        (root / rel).unlink()
        KINDS[request.param](root / rel, outside)
    return request.param, root, outside


def test_telemetry_samples_around_odd_files(broken: tuple[str, Path, Path]) -> None:
    kind, root, outside = broken
    fs = SysfsRoot(root)
    t = [100.0]
    tm = Telemetry(fs, clock=lambda: t[0], capacity=4)
    for _ in range(3):
        snap = tm.sample_once()
        t[0] += 0.5
    assert snap.domains["cluster0"].freq_hz == 816_000_000  # the rest of the board reads on
    assert snap.domains["cluster4"].freq_hz in (None, 816_000_000)  # cpuinfo_cur_freq stands in
    assert snap.zones["soc-thermal"].temp_c == pytest.approx(44.384)
    assert snap.zones["bigcore0-thermal"].temp_c is None
    assert outside.read_text() == "123\n"
    if kind in ("directory", "link-out-of-root"):
        bad = fs.unreadable()
        assert set(bad) >= {ZONE1_TEMP, CUR4}
        if kind == "link-out-of-root":
            assert all(why.startswith("PathOutsideRootError") for why in bad.values())
        else:
            assert set(bad.values()) == {"is a directory"}


@pytest.mark.parametrize("argv", [["info", "--json"], ["top", "--interval", "0.01", "--iterations", "2"]])
def test_info_and_top_run_on(broken: tuple[str, Path, Path], argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, root, outside = broken
    assert main([*argv, "--root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert "error:" not in err and "Traceback" not in err
    assert out.strip()
    assert outside.read_text() == "123\n"


def test_doctor_reports_each_odd_file_once(broken: tuple[str, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    kind, root, _ = broken
    rc = main(["doctor", "--root", str(root), "--json", "--window", "0"])
    out, err = capsys.readouterr()
    assert "error:" not in err and "Traceback" not in err
    found = json.loads(out)
    sensors = [f for f in found if f["check"] == "sensors" and f["status"] != "ok"]
    if kind == "fifo":  # an empty read, as a flaky sensor that never answers: nothing wrong to say
        assert rc in (0, 1)
        return
    assert rc == 1
    subjects = [f["subject"] for f in sensors]
    assert len(subjects) == len(set(subjects))  # once per file
    assert {ZONE1_TEMP, CUR4} <= set(subjects)
    if kind == "link-out-of-root":
        assert all("PathOutsideRootError" in f["message"] for f in sensors)
    elif kind == "directory":
        assert all("is a directory" in f["message"] for f in sensors)


def test_doctor_is_the_last_to_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Whole subtrees linked out of the root, value files as directories: doctor still reports.
    root = write_tree(tmp_path / "root", rk3588_tree())
    for rel in ("sys/class/thermal/thermal_zone2", "sys/class/devfreq/dmc"):
        (root / rel).unlink()
        (root / rel).symlink_to("/etc")
    (root / "sys/devices/system/cpu/cpufreq/policy9").symlink_to("/etc")
    for rel in ("proc/stat", "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq",
                "sys/devices/system/cpu/cpufreq/policy6/scaling_governor"):
        (root / rel).unlink()
        (root / rel).mkdir()
    rc = main(["doctor", "--root", str(root), "--window", "0"])
    out, err = capsys.readouterr()
    assert rc == 1 and "error:" not in err
    assert "sys/class/thermal/thermal_zone2: unreadable: PathOutsideRootError" in out
    assert "policy0/scaling_max_freq: unreadable: is a directory" in out
