"""``hetsched twin``: --once snapshot, live run stopped cleanly by SIGTERM/SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched._cli import main


def test_twin_once_writes_a_consistent_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["twin", "rk3588", "--root", str(tmp_path), "--once", "--seed", "3"]) == 0
    assert "snapshot written" in capsys.readouterr().out
    pol = tmp_path / "sys/devices/system/cpu/cpufreq/policy0"
    assert (pol / "scaling_available_frequencies").read_text().endswith("1800000 \n")
    assert (tmp_path / "proc/device-tree/compatible").read_bytes() == b"radxa,rock-5b\0rockchip,rk3588\0"
    assert main(["twin", "orin-nx", "--root", str(tmp_path / "nx"), "--once", "--variant", "jp5"]) == 0
    nx = tmp_path / "nx"
    assert (nx / "sys/class/devfreq/17000000.ga10b/device/of_node/name").read_bytes() == b"ga10b\0"
    assert (nx / "etc/nv_tegra_release").read_text().startswith("# R35")
    assert (nx / "sys/class/thermal/thermal_zone0/type").read_text() == "CPU-therm\n"


def test_twin_rejects_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["twin", "exynos", "--root", str(tmp_path)])
    assert main(["twin", "rk3588", "--root", str(tmp_path), "--once", "--variant", "jp6"]) == 1
    assert "UnknownSocError" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["twin", "rk3588", "--root", str(tmp_path), "--speed", "-1"])
    assert info.value.code == 2 and "argument --speed" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_twin_live_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetsched", "twin", "orin-nano", "--root", str(tmp_path), "--speed", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "live under" in line
        assert (tmp_path / "sys/class/thermal/thermal_zone0/temp").is_file()
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped after" in out and signal.Signals(sig).name in err
