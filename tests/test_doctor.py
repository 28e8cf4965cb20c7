"""``hetsched doctor``: each check on a twin tree with its fault planted, and a healthy twin clean."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hetsched._cli import main
from hetsched._cli._doctor_checks import Finding, SdkState, SensorRead, check_sdks, check_sensors, oscillation
from hetsched._cli._doctor_checks_read import findings, read_board, restore_saved_clocks
from hetsched._governor._engine import GovernorEngine
from hetsched._governor._phase import Phase
from hetsched._governor._state_dir import pid_alive
from hetsched._governor._state_walk import RUN_DIR, SAVED_FILE, STATE_FILE
from hetsched._governor._sysfs import SysfsPort
from hetsched._twin.live import LiveTwin
from hetsched.testing import build_board_tree, dvfs_knobs

SDK = SdkState("1.0", ("CPUExecutionProvider",), rknn_toolkit="not set up")
RK_CPU4 = "sys/devices/system/cpu/cpufreq/policy4"
RK_GPU = "sys/devices/platform/fb000000.gpu/devfreq/fb000000.gpu"
RK_SOC_ZONE = "sys/devices/virtual/thermal/thermal_zone0"
EMC = "sys/kernel/debug/bpmp/debug/clk/emc"


def _tree(tmp_path: Path, soc: str = "rk3588", **kw: Any) -> Path:
    return build_board_tree(tmp_path / soc, soc, **kw)


def _doctor(root: Path, **kw: object) -> list[Finding]:
    kw.setdefault("window_s", 0)
    kw.setdefault("sdk", SDK)
    return findings(read_board(root, **kw))  # type: ignore[arg-type]


def _bad(found: list[Finding], check: str | None = None) -> list[Finding]:
    return [f for f in found if f.status != "ok" and (check is None or f.check == check)]


class _Stepper:
    """A clock and sleep that move together; ``on_sleep`` plants the next reading."""

    def __init__(self, on_sleep: Callable[[int], object] | None = None) -> None:
        self.t = 0.0
        self.n = 0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.n += 1
        if self.on_sleep is not None:
            self.on_sleep(self.n)


@pytest.mark.parametrize(("soc", "kw"), [("rk3588", {}), ("rk3588", {"variant": "mainline"}), ("orin-nx", {}),
                                         ("orin-nx", {"offline_style": "eagain"}), ("orin-agx", {})])
def test_healthy_twin_has_no_warning(tmp_path: Path, soc: str, kw: dict[str, str]) -> None:
    step = _Stepper()
    found = _doctor(_tree(tmp_path, soc, **kw), window_s=1.0, sleep=step.sleep, clock=step.clock)
    assert _bad(found) == []
    sim = [f for f in found if f.check == "simulated"]
    assert len(sim) == 1 and "simulated" in sim[0].message
    assert {"freq-limits", "thermal", "sensors", "governor", "permissions", "sdk"} <= {f.check for f in found}
    assert step.n >= 3  # a real window was taken


def test_cli_json_fields_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    assert main(["doctor", "--root", str(root), "--json", "--window", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out and all({"check", "status", "subject", "message", "hint"} <= set(f) for f in out)
    assert {f["status"] for f in out} == {"ok"}
    (root / RK_SOC_ZONE / "temp").write_text("120000\n")  # above the critical trip: a failure
    assert main(["doctor", "--root", str(root), "--window", "0"]) == 1
    text = capsys.readouterr().out
    assert "[FAIL] thermal" in text and "soc-thermal" in text and "fix:" in text


def test_bad_window_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["doctor", "--root", str(tmp_path), "--window", "-1"])
    assert info.value.code == 2 and "argument --window" in capsys.readouterr().err


def test_live_twin_root_says_simulated(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path / "live")
    twin.advance(0)  # opens its load channel, as a running twin has
    sim = [f for f in _doctor(tmp_path / "live") if f.check == "simulated"]
    assert "live SoC twin" in sim[0].message


# -- frequency caps, locks, probe ----------------------------------------------------------------


def test_frequency_cap_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / RK_CPU4 / "scaling_max_freq").write_text("1416000\n")
    bad = _bad(_doctor(root), "freq-limits")
    assert [f.subject for f in bad] == ["cluster4"]
    assert "1416 MHz" in bad[0].message and "scaling_max_freq" in bad[0].message and "2256000" in bad[0].hint


def test_devfreq_pinned_and_emc_locked(tmp_path: Path) -> None:
    rk = _tree(tmp_path)
    (rk / RK_GPU / "min_freq").write_text("1000000000\n")
    bad = _bad(_doctor(rk), "freq-limits")
    assert [(f.subject, "pinned" in f.message) for f in bad] == [("gpu", True)]
    orin = _tree(tmp_path, "orin-nx")
    (orin / EMC / "mrq_rate_locked").write_text("1\n")
    bad = _bad(_doctor(orin), "freq-limits")
    assert [f.subject for f in bad] == ["memory"] and "mrq_rate_locked" in bad[0].message


def test_probe_static_tree_reports_a_lock_and_restores(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = dvfs_knobs(root)
    step = _Stepper()
    found = _doctor(root, probe=True, probe_settle_s=0.05, sleep=step.sleep, clock=step.clock)
    probe = [f for f in found if f.check == "probe"]
    # Nothing answers writes in a plain tree: every domain's clock stays where it was.
    assert probe and all(f.status == "warn" and "do not take effect" in f.message for f in probe)
    assert dvfs_knobs(root) == before


def test_probe_live_twin_writes_take_effect(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path / "live")
    twin.advance(0)
    step = _Stepper()
    step.on_sleep = lambda n: twin.advance(0.02)
    before = dvfs_knobs(tmp_path / "live")
    found = _doctor(tmp_path / "live", probe=True, sleep=step.sleep, clock=step.clock)
    probe = [f for f in found if f.check == "probe"]
    assert len(probe) == 6 and all(f.status == "ok" for f in probe), probe
    twin.advance(0.02)  # the twin drops userspace/set_freq on its next update, as the kernel does at once
    assert dvfs_knobs(tmp_path / "live") == before


# -- nvpmodel ----------------------------------------------------------------------------------


def _install_nvpmodel(root: Path, *, enabled: bool, running: bool) -> None:
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / "nvpmodel.service").write_text("[Service]\nExecStart=/usr/sbin/nvpmodel -f /etc/nvpmodel.conf\n")
    if enabled:
        (units / "multi-user.target.wants").mkdir(exist_ok=True)
        os.symlink("../nvpmodel.service", units / "multi-user.target.wants/nvpmodel.service")
    if running:
        (root / "run/systemd/units").mkdir(parents=True)
        os.symlink("0123456789abcdef", root / "run/systemd/units/invocation:nvpmodel.service")


@pytest.mark.parametrize(("enabled", "running", "word"), [(True, False, "enabled"), (False, True, "running")])
def test_nvpmodel_service_on_a_jetson(tmp_path: Path, enabled: bool, running: bool, word: str) -> None:
    root = _tree(tmp_path, "orin-nx")
    _install_nvpmodel(root, enabled=enabled, running=running)
    bad = _bad(_doctor(root), "nvpmodel")
    assert len(bad) == 1 and word in bad[0].message and "mode 2" in bad[0].message
    assert "systemctl disable" in bad[0].hint


def test_nvpmodel_installed_but_off_and_not_a_jetson(tmp_path: Path) -> None:
    orin = _tree(tmp_path, "orin-nx")
    _install_nvpmodel(orin, enabled=False, running=False)
    assert _bad(_doctor(orin)) == []
    rk = _tree(tmp_path)
    _install_nvpmodel(rk, enabled=True, running=True)
    assert [f for f in _doctor(rk) if f.check == "nvpmodel"] == []


# -- thermal -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("milli", "status"), [("80000", "warn"), ("116000", "fail")])
def test_zone_at_a_trip(tmp_path: Path, milli: str, status: str) -> None:
    root = _tree(tmp_path)
    (root / RK_SOC_ZONE / "temp").write_text(milli + "\n")
    bad = _bad(_doctor(root), "thermal")
    assert [(f.subject, f.status) for f in bad] == [("soc-thermal", status)]


def test_oscillating_zone(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    temp = root / "sys/devices/virtual/thermal/thermal_zone5/temp"  # gpu-thermal
    step = _Stepper(lambda n: temp.write_text(f"{round(60000 + 6000 * math.sin(n * math.pi / 3))}\n"))
    found = _doctor(root, window_s=3.0, interval_s=0.125, sleep=step.sleep, clock=step.clock)
    bad = _bad(found, "thermal")
    assert [f.subject for f in bad] == ["gpu-thermal"] and "oscillates" in bad[0].message
    assert "about every 0.75 s" in bad[0].message


def test_oscillation_detector() -> None:
    assert oscillation([(i * 0.1, 50.0 + i * 0.3) for i in range(40)]) is None  # heating up is no swing
    assert oscillation([(i * 0.1, 50.0 + (0.5 if i % 2 else 0.0)) for i in range(40)]) is None  # noise
    osc = oscillation([(i * 0.1, 50.0 + (4.0 if (i // 5) % 2 else 0.0)) for i in range(40)])
    assert osc is not None and osc[1] == pytest.approx(4.0) and osc[2] == pytest.approx(1.0)


@pytest.mark.parametrize(("trip", "value", "words"), [
    ("trip_point_2_temp", "70000", "not above the passive"),
    ("trip_point_0_temp", "900000", "absurd"),
    ("trip_point_0_temp", "hot", "reads 'hot"),
    ("trip_point_0_temp", "25000", "room temperature"),
])
def test_wrong_trip_points(tmp_path: Path, trip: str, value: str, words: str) -> None:
    root = _tree(tmp_path)
    (root / RK_SOC_ZONE / trip).write_text(value + "\n")
    bad = _bad(_doctor(root), "thermal-trips")
    assert bad and all(f.subject == "soc-thermal" for f in bad) and any(words in f.message for f in bad), bad


# -- sensors -----------------------------------------------------------------------------------


def test_garbage_sensor_names_the_file(tmp_path: Path) -> None:
    root = _tree(tmp_path, "orin-nx")
    rail = next(root.glob("sys/devices/platform/bus@0/*/i2c-1/1-0040/hwmon/hwmon*/curr1_input"))
    rail.write_text("x7f\n")
    bad = _bad(_doctor(root), "sensors")
    assert len(bad) == 1 and bad[0].status == "fail" and bad[0].subject.endswith("curr1_input")
    (root / "sys/devices/virtual/thermal/thermal_zone0/temp").write_text("999000\n")
    rail.write_text("825\n")
    bad = _bad(_doctor(root), "sensors")
    assert [f.subject for f in bad] == ["sys/devices/virtual/thermal/thermal_zone0/temp"] and "impossible" in bad[0].message


def test_flaky_sensor(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    temp = root / RK_SOC_ZONE / "temp"
    step = _Stepper(lambda n: temp.write_text("" if n % 2 else "41000\n"))
    bad = _bad(_doctor(root, window_s=1.0, sleep=step.sleep, clock=step.clock), "sensors")
    assert len(bad) == 1 and bad[0].subject.endswith("thermal_zone0/temp") and "flaky" in bad[0].message


def test_unreadable_sensor() -> None:
    # Root reads every file whatever its mode, so the read side is given as read.
    bad = _bad(check_sensors([SensorRead("sys/x/temp", "temp", (), denied=True)]))
    assert bad[0].status == "warn" and "permission" in bad[0].message and bad[0].subject == "sys/x/temp"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_sensor_in_a_tree(tmp_path: Path) -> None:  # pragma: no cover - root on CI
    root = _tree(tmp_path)
    (root / RK_SOC_ZONE / "temp").chmod(0)
    bad = _bad(_doctor(root), "sensors")
    assert any("permission" in f.message and f.subject.endswith("thermal_zone0/temp") for f in bad)


# -- a governor that died, permissions ------------------------------------------------------------


def _governed_twin(tmp_path: Path) -> tuple[LiveTwin, GovernorEngine, Path]:
    root = tmp_path / "live"
    twin = LiveTwin("rk3588", root)
    twin.advance(0)
    step = _Stepper(lambda n: twin.advance(0.01))
    engine = GovernorEngine(SysfsPort(root, clock=step.clock, sleep=step.sleep))
    engine.start()
    for _ in range(8):
        step.sleep(0.05)
        engine.enter(Phase.INFER)
        step.sleep(0.05)
        engine.enter(Phase.IDLE)
    assert engine.statistics().writes > 0
    return twin, engine, root


def test_governor_that_died_left_clocks_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _twin, engine, root = _governed_twin(tmp_path)
    before_restore = dvfs_knobs(root)
    assert (root / RUN_DIR / SAVED_FILE).is_file() and (root / RUN_DIR / STATE_FILE).is_file()
    # Its process is alive here: the governor is running, nothing is wrong.
    assert _bad(_doctor(root), "governor") == []
    assert [f for f in _doctor(root) if f.check == "freq-limits" and "running hetsched governor" in f.message]
    # Pretend it died (its pid gone): the clocks it changed are reported.
    bad = _bad(_doctor(root, alive=lambda pid: False), "governor")
    assert len(bad) == 1 and bad[0].status == "fail" and "died" in bad[0].message
    assert bad[0].subject == f"{RUN_DIR}/{SAVED_FILE}"
    written = restore_saved_clocks(root, alive=lambda pid: False)
    assert written and not (root / RUN_DIR / SAVED_FILE).exists()
    assert dvfs_knobs(root) != before_restore
    engine.close()  # nothing left to remove but its state file
    assert not (root / "run").exists()
    assert _bad(_doctor(root), "governor") == []


def test_governor_closed_cleanly_leaves_nothing(tmp_path: Path) -> None:
    _twin, engine, root = _governed_twin(tmp_path)
    engine.close()
    assert not (root / "run").exists()
    assert _bad(_doctor(root, alive=lambda pid: False), "governor") == []


def test_stale_state_of_a_dead_pid(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(done.stdout)
    assert not pid_alive(pid)
    (root / RUN_DIR).mkdir(parents=True)
    knob = f"{RK_CPU4}/scaling_governor"
    (root / RUN_DIR / SAVED_FILE).write_text(json.dumps({"pid": pid, "knobs": {"cluster4": {knob: "ondemand\n"}}}))
    bad = _bad(_doctor(root), "governor")
    assert len(bad) == 1 and bad[0].status == "warn" and "stale" in bad[0].message
    (root / knob).write_text("performance\n")
    bad = _bad(_doctor(root), "governor")
    assert bad[0].status == "fail" and knob in bad[0].message
    (root / RUN_DIR / STATE_FILE).write_text("{not json")
    assert any("unreadable governor state" in f.message for f in _bad(_doctor(root), "governor"))


def test_clock_knob_not_writable(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    uid = os.geteuid()
    if uid == 0:  # judge for an unprivileged owner of the tree
        uid = 4242
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    (root / RK_GPU / "max_freq").chmod(0o444)
    bad = _bad(_doctor(root, euid=uid), "permissions")
    assert [f.subject for f in bad] == ["gpu"] and "max_freq" in bad[0].message and "ungoverned" in bad[0].message


# -- SDKs --------------------------------------------------------------------------------------


def test_sdk_hints_on_a_board_not_on_a_twin() -> None:
    none = SdkState("1.0", ("CPUExecutionProvider",), rknn_toolkit="not set up")
    board = _bad(check_sdks("rk3588", none, simulated=False))
    assert [f.subject for f in board] == ["rknn-toolkit-lite2"] and "hetsched[rknn]" in board[0].hint
    jetson = _bad(check_sdks("orin-nx", none, simulated=False))
    assert {f.subject for f in jetson} == {"tensorrt", "onnxruntime-gpu"}
    assert _bad(check_sdks("orin-nx", none, simulated=True)) == []
    full = SdkState("1.0", ("TensorrtExecutionProvider", "CUDAExecutionProvider"), tensorrt=True)
    assert _bad(check_sdks("orin-nx", full, simulated=False)) == []
    assert _bad(check_sdks(None, SdkState(None), simulated=True))[0].subject == "onnxruntime"
