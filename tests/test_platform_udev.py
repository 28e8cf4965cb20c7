"""udev enumeration and the uevent monitor: real on the host root, 'unavailable' elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from hetsched import RuntimeStateError
from hetsched._platform import UdevMonitor, enumerate_devices, udev_status


def _no_libudev() -> Any:
    raise ImportError("libudev.so.1: cannot open shared object file")


def test_other_root_is_unavailable(tmp_path: Path) -> None:
    status = udev_status(tmp_path)
    assert not status.available and "/sys" in status.reason
    assert enumerate_devices(tmp_path, "thermal") == []


def test_missing_libudev_is_unavailable() -> None:
    status = udev_status("/", context_factory=_no_libudev)
    assert not status.available and "libudev" in status.reason
    assert enumerate_devices("/", "cpu", context_factory=_no_libudev) == []


def test_host_enumeration_matches_sysfs() -> None:
    status = udev_status("/")
    if not status.available:
        pytest.skip(f"udev unavailable on this host: {status.reason}")
    cpus = enumerate_devices("/", "cpu")
    sysfs_cpus = sorted(p.name for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"))
    assert sorted(d.sys_name for d in cpus) == sysfs_cpus


@pytest.mark.anyio
async def test_monitor_unavailable_iterates_nothing(tmp_path: Path) -> None:
    async with UdevMonitor(tmp_path) as mon:
        assert not mon.status.available
        events = [e async for e in mon]
        assert events == []
        with pytest.raises(RuntimeStateError, match="no uevent monitor"):
            await mon.receive()


@pytest.mark.anyio
async def test_monitor_outside_async_with() -> None:
    mon = UdevMonitor("/", context_factory=_no_libudev)
    with pytest.raises(RuntimeStateError, match="async with"):
        await mon.__anext__()


@pytest.mark.anyio
async def test_monitor_on_host_waits_and_can_be_bounded() -> None:
    async with UdevMonitor("/", subsystems=("thermal",)) as mon:
        if not mon.status.available:
            pytest.skip(f"no uevent socket here: {mon.status.reason}")
        # no thermal uevents happen in a container: the wait must be cancellable, not hang
        with anyio.move_on_after(0.05) as scope:
            await mon.receive()
        assert scope.cancelled_caught


@pytest.mark.anyio
async def test_monitor_receives_a_real_synthetic_uevent() -> None:
    # Writing "change" to a device's uevent file makes the kernel emit a (harmless) synthetic uevent.
    async with UdevMonitor("/", subsystems=("cpu",)) as mon:
        if not mon.status.available:
            pytest.skip(f"no uevent socket here: {mon.status.reason}")
        try:
            await anyio.Path("/sys/devices/system/cpu/cpu0/uevent").write_text("change")
        except OSError as exc:
            pytest.skip(f"cannot trigger a uevent here: {exc}")
        with anyio.fail_after(5):
            event = await mon.receive()
        assert (event.action, event.subsystem) == ("change", "cpu")
        assert event.sys_path.startswith("/sys/devices/system/cpu/cpu")
        st = mon.statistics()
        assert st.events_received == 1 and st.available and st.subsystems == ("cpu",)
