"""LiveTwin: the board tree reacts to load and to written clocks as the kernel would."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from hetsched import TwinError
from hetsched._twin.live import LiveTwin
from hetsched.testing import build_board_tree

POL4 = "sys/devices/system/cpu/cpufreq/policy4"
GPU = "sys/class/devfreq/fb000000.gpu"


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text()


def _write(root: Path, rel: str, text: str) -> None:
    with open(root / rel, "w") as f:
        f.write(text)


@pytest.fixture
def rk(tmp_path: Path) -> LiveTwin:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.write_once()
    return twin


def test_cpufreq_limits_clamped_like_the_kernel(rk: LiveTwin) -> None:
    root = rk.root
    _write(root, f"{POL4}/scaling_max_freq", "2000000")  # between OPPs -> highest <= it
    _write(root, f"{POL4}/scaling_min_freq", "1100000\n")  # -> lowest >= it
    rk.advance(0.0)
    assert _read(root, f"{POL4}/scaling_max_freq") == "1800000\n"
    assert _read(root, f"{POL4}/scaling_min_freq") == "1200000\n"
    _write(root, f"{POL4}/scaling_max_freq", "99999999")  # above cpuinfo_max -> clamped
    rk.advance(0.0)
    assert _read(root, f"{POL4}/scaling_max_freq") == "2256000\n"
    _write(root, f"{POL4}/scaling_max_freq", "600000")
    rk.advance(0.0)
    # min above max: the policy shows min = max.
    assert _read(root, f"{POL4}/scaling_min_freq") == "600000\n"
    assert int(_read(root, f"{POL4}/scaling_cur_freq")) == 600000


def test_setspeed_only_under_userspace(rk: LiveTwin) -> None:
    root = rk.root
    assert _read(root, f"{POL4}/scaling_setspeed") == "<unsupported>\n"
    _write(root, f"{POL4}/scaling_setspeed", "1608000")
    rk.advance(0.0)
    assert _read(root, f"{POL4}/scaling_setspeed") == "<unsupported>\n"  # EINVAL: reverted
    st = rk.statistics()
    assert st.writes_rejected == 1 and st.last_rejection and "userspace" in st.last_rejection
    _write(root, f"{POL4}/scaling_governor", "userspace\n")
    rk.advance(0.0)
    _write(root, f"{POL4}/scaling_setspeed", "1500000")  # not an OPP -> lowest available >= it
    rk.advance(0.01)
    assert _read(root, f"{POL4}/scaling_cur_freq") == "1608000\n"
    assert _read(root, f"{POL4}/scaling_setspeed") == "1608000\n"
    assert rk.sim.frequency("cluster4") == 1_608_000_000


def test_invalid_writes_are_rejected_and_reverted(rk: LiveTwin) -> None:
    root = rk.root
    for rel, bad in ((f"{POL4}/scaling_governor", "turbo"), (f"{POL4}/scaling_max_freq", "fast"),
                     (f"{GPU}/max_freq", "-5"), (f"{GPU}/governor", "nvhost_podgov")):  # fmt: skip
        before = _read(root, rel)
        _write(root, rel, bad)
        rk.advance(0.0)
        assert _read(root, rel) == before, rel
    assert rk.statistics().writes_rejected == 4


def test_userspace_set_freq_appears_and_disappears(rk: LiveTwin) -> None:
    root = rk.root
    udir = root / GPU / "userspace"
    assert not udir.exists()
    _write(root, f"{GPU}/governor", "userspace")
    rk.advance(0.0)
    assert (udir / "set_freq").is_file()
    _write(root, f"{GPU}/userspace/set_freq", "650000000")  # -> lowest OPP >= it
    rk.report_utilisation("gpu", 1.0)
    rk.advance(0.5)
    assert _read(root, f"{GPU}/cur_freq") == "700000000\n"
    assert _read(root, f"{GPU}/load") == "100@700000000Hz\n"
    _write(root, f"{GPU}/max_freq", "550000000")  # QoS max shown as written, clock follows
    rk.advance(0.5)
    assert _read(root, f"{GPU}/max_freq") == "550000000\n"
    assert _read(root, f"{GPU}/cur_freq") == "500000000\n"
    _write(root, f"{GPU}/governor", "performance")
    rk.advance(0.0)
    assert not udir.exists()


def test_available_frequencies_and_units(rk: LiveTwin) -> None:
    root = rk.root
    assert _read(root, f"{GPU}/available_frequencies").startswith("1000000000 900000000 ")
    assert _read(root, f"{GPU}/available_frequencies").endswith("300000000 \n")
    assert _read(root, f"{POL4}/scaling_available_frequencies").endswith("2208000 2256000 \n")
    assert _read(root, "sys/devices/system/cpu/cpu5/cpufreq/related_cpus") == "4 5 \n"
    assert os.readlink(root / "sys/class/thermal/thermal_zone0") == "../../devices/virtual/thermal/thermal_zone0"
    assert (root / "sys/class/devfreq/dmc").resolve() == root / "sys/devices/platform/dmc/devfreq/dmc"
    assert _read(root, "sys/kernel/debug/rknpu/load") == "NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\n"


def test_emc_rate_needs_lock(tmp_path: Path) -> None:
    twin = LiveTwin("orin-nx", tmp_path, noise=False)
    twin.write_once()
    emc = tmp_path / "sys/kernel/debug/bpmp/debug/clk/emc"
    assert (emc / "rate").read_text() == "2133000000\n"
    (emc / "rate").write_text("665600000")
    twin.advance(0.1)
    assert (emc / "rate").read_text() == "2133000000\n"  # BPMP ignores it while unlocked
    (emc / "mrq_rate_locked").write_text("1")
    twin.advance(0.0)
    (emc / "rate").write_text("600000000")  # -> lowest supported >= it
    twin.advance(0.1)
    assert (emc / "rate").read_text() == "665600000\n"
    assert twin.sim.frequency("memory") == 665_600_000
    (emc / "mrq_rate_locked").write_text("2")
    twin.advance(0.0)
    assert (emc / "mrq_rate_locked").read_text() == "1\n"
    assert twin.statistics().writes_rejected == 1


def test_permissions_follow_the_kernel(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path / "rk", "rk3588")
    mode = lambda rel: stat.S_IMODE((root / rel).stat().st_mode)  # noqa: E731
    assert mode("sys/kernel/debug") == 0o700
    assert mode("sys/kernel/debug/rknpu/load") == 0o400
    assert mode(f"{POL4}/scaling_max_freq") == 0o644
    assert mode(f"{POL4}/scaling_available_frequencies") == 0o444
    assert mode(f"{POL4}/cpuinfo_cur_freq") == 0o400
    assert mode(f"{POL4}/stats/reset") == 0o200


def _as_nobody(fn: Callable[[], list[str]]) -> list[str]:
    """Run ``fn`` in a forked child that dropped to uid/gid 65534; returns its lines."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, "\n".join(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out.split("\n")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to drop to nobody")
def test_unprivileged_reader_gets_permission_errors() -> None:
    base = Path(tempfile.mkdtemp(prefix="twin-perm-"))
    try:
        os.chmod(base, 0o755)
        root = build_board_tree(base / "rk", "rk3588")
        os.chmod(root, 0o755)

        def probe() -> list[str]:
            out = [(root / POL4 / "scaling_cur_freq").read_text().strip()]
            for rel in ("sys/kernel/debug/rknpu/load", f"{POL4}/cpuinfo_cur_freq"):
                try:
                    (root / rel).read_text()
                    out.append(f"read {rel}")
                except PermissionError:
                    out.append(f"denied {rel}")
            try:
                with open(root / POL4 / "scaling_max_freq", "w") as f:
                    f.write("1")
                out.append("wrote")
            except PermissionError:
                out.append("denied write")
            return out

        out = _as_nobody(probe)
    finally:
        shutil.rmtree(base)
    assert out == ["408000", "denied sys/kernel/debug/rknpu/load", f"denied {POL4}/cpuinfo_cur_freq", "denied write"]


def test_offline_and_flaky_sensors(tmp_path: Path) -> None:
    nx = build_board_tree(tmp_path / "a", "orin-nx")
    assert (nx / "sys/class/thermal/thermal_zone2/type").read_text() == "cv0-thermal\n"
    assert (nx / "sys/class/thermal/thermal_zone2/temp").read_text() == "-256000\n"
    eagain = build_board_tree(tmp_path / "b", "orin-nano", offline_style="eagain")
    assert (eagain / "sys/class/thermal/thermal_zone3/temp").read_text() == ""
    twin = LiveTwin("orin-nx", tmp_path / "c", flaky=1.0)
    twin.advance(0.1)
    root = tmp_path / "c"
    assert (root / "sys/class/thermal/thermal_zone0/temp").read_text() == ""  # unreadable this period
    assert (root / "sys/class/thermal/thermal_zone2/temp").read_text() == "-256000\n"
    twin.flaky = 0.0
    twin.advance(0.1)
    assert int((root / "sys/class/thermal/thermal_zone0/temp").read_text()) > 20000


def test_bad_parameters() -> None:
    with pytest.raises(TwinError, match="speed"):
        LiveTwin("rk3588", "/nonexistent-not-created", speed=0)
    with pytest.raises(TwinError, match="flaky"):
        LiveTwin("rk3588", "/nonexistent-not-created", flaky=2.0)


@pytest.mark.anyio
async def test_live_twin_reacts_to_load(tmp_path: Path) -> None:
    async with LiveTwin("rk3588", tmp_path, speed=200.0, period_s=0.02, noise=False) as twin:
        root = twin.root
        t0 = int(_read(root, "sys/class/thermal/thermal_zone1/temp"))
        stat0 = _read(root, "proc/stat").splitlines()[5]
        for d in ("cluster4", "cluster6", "cluster0"):
            twin.report_utilisation(d, 1.0)
        _write(root, f"{POL4}/scaling_governor", "performance")
        with anyio.fail_after(10):
            # The twin's own task advances board time; nothing signals it, so poll its statistics.
            while twin.statistics().time_s < 60.0:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert _read(root, f"{POL4}/scaling_cur_freq") == "2256000\n"
        assert int(_read(root, "sys/class/thermal/thermal_zone1/temp")) > t0 + 5000
        busy = [int(v) for v in _read(root, "proc/stat").splitlines()[5].split()[1:]]
        assert busy[0] > int(stat0.split()[1]) + 4000  # cpu4 user jiffies grew ~100/s of board time
    st = twin.statistics()
    assert st.updates >= 2 and st.writes_applied == 1
