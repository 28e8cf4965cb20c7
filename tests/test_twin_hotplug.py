"""The running twin skips what it cannot write and follows hotplug (issue 23 item 10).

A file replaced by a directory, a link leading out of the root, a removed cpufreq policy: the
live twin used to stop on each. It now skips a path it cannot write and reports it once (not
per tick), and follows a removed policy as a kernel does after a hot-unplug: the policy is not
recreated (no stale ``scaling_setspeed``), its CPUs read offline, the cluster is no longer run.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import anyio
import pytest

from hetsched._platform import SysfsRoot, discover
from hetsched._twin.live import LiveTwin

CPU = "sys/devices/system/cpu"
POL4 = f"{CPU}/cpufreq/policy4"
ZONE1 = "sys/devices/virtual/thermal/thermal_zone1"


@pytest.fixture
def rk(tmp_path: Path) -> LiveTwin:
    twin = LiveTwin("rk3588", tmp_path / "root", noise=False, seed=1)
    twin.write_once()
    twin.advance(0.1)
    return twin


def test_a_file_replaced_by_a_directory_is_skipped_and_reported_once(rk: LiveTwin,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    cur = rk.root / POL4 / "scaling_cur_freq"
    cur.unlink()
    cur.mkdir()
    (rk.root / ZONE1 / "temp").unlink()
    (rk.root / ZONE1 / "temp").mkdir()
    with caplog.at_level(logging.WARNING, logger="hetsched.twin"):
        for _ in range(10):
            rk.advance(0.1)
    assert cur.is_dir()  # left alone, not replaced
    assert set(rk.skipped()) == {f"{POL4}/scaling_cur_freq", f"{ZONE1}/temp"}
    assert all("a directory is in the way" in why for why in rk.skipped().values())
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == 2  # once per path
    assert rk.statistics().updates >= 11
    assert int((rk.root / "sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq").read_text()) > 0


def test_a_value_file_linked_out_of_the_root_is_skipped(rk: LiveTwin, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    cur = rk.root / POL4 / "scaling_cur_freq"
    cur.unlink()
    cur.symlink_to(victim)
    for _ in range(5):
        rk.advance(0.1)
    assert victim.read_text() == "precious\n" and cur.is_symlink()
    assert rk.skipped()[f"{POL4}/scaling_cur_freq"].startswith("PathOutsideRootError")


def test_a_removed_policy_is_followed_as_a_hot_unplug(rk: LiveTwin) -> None:
    root = rk.root
    (root / POL4 / "scaling_governor").write_text("userspace\n")
    rk.advance(0.1)
    (root / POL4 / "scaling_setspeed").write_text("1608000\n")
    rk.advance(0.1)
    assert rk.sim.frequency("cluster4") == 1_608_000_000
    shutil.rmtree(root / POL4)
    for _ in range(5):
        rk.advance(0.1)
    assert not (root / POL4).exists()  # not recreated: no stale scaling_setspeed
    assert (root / f"{CPU}/cpu4/online").read_text() == "0\n" == (root / f"{CPU}/cpu5/online").read_text()
    assert not (root / f"{CPU}/cpu4/cpufreq").exists()
    assert (root / f"{CPU}/online").read_text() == "0-3,6-7\n"
    assert (root / f"{CPU}/offline").read_text() == "4-5\n"
    assert rk.sim.frequency("cluster4") == min(rk.profile.domain("cluster4").available_hz)
    assert rk.sim.utilisation("cluster4") == 0.0
    assert rk.skipped() == {}
    # Readers see two clusters left.
    assert [c.cpus for c in discover(SysfsRoot(root)).cpu_clusters] == [(0, 1, 2, 3), (6, 7)]


@pytest.mark.anyio
async def test_the_running_twin_keeps_going(tmp_path: Path) -> None:
    t = [0.0]
    twin = LiveTwin("rk3588", tmp_path / "root", seed=1, period_s=0.01, clock=lambda: t[0])
    async with twin:
        await anyio.sleep(0.03)
        shutil.rmtree(twin.root / POL4)
        (twin.root / ZONE1 / "temp").unlink()
        (twin.root / ZONE1 / "temp").mkdir()
        n = twin.statistics().updates
        with anyio.fail_after(30):  # a guard, not a measurement
            while twin.statistics().updates < n + 5:
                t[0] += 0.01
                await anyio.sleep(0.01)
    assert "cluster4" in twin.tree.unplugged and f"{ZONE1}/temp" in twin.skipped()
