"""udev: device enumeration and a uevent monitor (hotplug, thermal trip events).

libudev cannot be pointed at another sysfs root: ``SYSFS_PATH`` was honoured only
up to udev 182, and pyudev's ``Context.sys_path`` is "fixed since udev 183"
(soc-sysfs.md §5). So udev is used only when the injected root *is* ``/``; for
any other root (a twin, a fixture) it reports itself unavailable and callers
rely on the sysfs walk of :mod:`~hetsched._platform.discovery`, which is the
source of truth anyway. It is equally "unavailable" (never an error) when
libudev is missing or netlink sockets are not permitted, as in containers.

Thermal trips arrive as ``change`` uevents on ``thermal_zoneN``; plain
temperature changes emit none, so telemetry still polls.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio

from .._errors import RuntimeStateError
from ._fs import SysfsRoot

__all__ = [
    "UdevDevice",
    "UdevEvent",
    "UdevMonitor",
    "UdevMonitorStatistics",
    "UdevStatus",
    "enumerate_devices",
    "udev_status",
]

DEFAULT_SUBSYSTEMS = ("thermal", "devfreq", "cpu", "hwmon", "power_supply")

ContextFactory = Callable[[], Any]


@dataclass(frozen=True)
class UdevStatus:
    available: bool
    reason: str
    """Why not, when unavailable (or ``"ok"``)."""


@dataclass(frozen=True)
class UdevMonitorStatistics:
    available: bool
    reason: str
    events_received: int
    subsystems: tuple[str, ...]


@dataclass(frozen=True)
class UdevDevice:
    subsystem: str
    sys_name: str
    sys_path: str


@dataclass(frozen=True)
class UdevEvent:
    """One uevent: ``action`` is ``add``, ``remove``, ``change``, ``online``, ``offline``..."""

    action: str
    subsystem: str
    sys_name: str
    sys_path: str


def _default_context() -> Any:
    import pyudev  # a required dependency, but it loads libudev lazily and may fail here

    return pyudev.Context()


def _open_context(fs: SysfsRoot, factory: ContextFactory | None) -> tuple[Any | None, UdevStatus]:
    if not fs.is_host_root:
        return None, UdevStatus(False, f"libudev always reads /sys; root {str(fs.root)!r} is not the host root")
    try:
        ctx = (factory or _default_context)()
    except (ImportError, OSError) as exc:
        return None, UdevStatus(False, f"libudev unavailable: {exc}")
    return ctx, UdevStatus(True, "ok")


def udev_status(root: str | os.PathLike[str] | SysfsRoot = "/", *, context_factory: ContextFactory | None = None) -> UdevStatus:
    """Whether udev enumeration can describe ``root`` (see module doc)."""
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    return _open_context(fs, context_factory)[1]


def enumerate_devices(
    root: str | os.PathLike[str] | SysfsRoot = "/",
    subsystem: str = "thermal",
    *,
    context_factory: ContextFactory | None = None,
) -> list[UdevDevice]:
    """Devices of ``subsystem`` known to udev; ``[]`` when udev is unavailable for this root."""
    fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
    ctx, _ = _open_context(fs, context_factory)
    if ctx is None:
        return []
    try:
        devices = list(ctx.list_devices(subsystem=subsystem))
    except (OSError, ImportError):
        return []
    return sorted(
        (UdevDevice(subsystem=subsystem, sys_name=d.sys_name, sys_path=d.sys_path) for d in devices),
        key=lambda d: d.sys_path,
    )


class UdevMonitor:
    """Async stream of kernel uevents for some subsystems; empty when udev is unavailable.

    ::

        async with UdevMonitor("/") as mon:
            async for event in mon:          # ends at once when mon.status.available is False
                ...

    :raises RuntimeStateError: iterating outside ``async with``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | SysfsRoot = "/",
        *,
        subsystems: Iterable[str] = DEFAULT_SUBSYSTEMS,
        context_factory: ContextFactory | None = None,
    ) -> None:
        self._fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
        self._subsystems = tuple(subsystems)
        self._factory = context_factory
        self._monitor: Any | None = None
        self._entered = False
        self.status = UdevStatus(False, "not started")
        self.events_received = 0

    def statistics(self) -> UdevMonitorStatistics:
        return UdevMonitorStatistics(
            available=self.status.available,
            reason=self.status.reason,
            events_received=self.events_received,
            subsystems=self._subsystems,
        )

    async def __aenter__(self) -> UdevMonitor:
        ctx, status = _open_context(self._fs, self._factory)
        if ctx is not None:
            try:
                import pyudev

                monitor = pyudev.Monitor.from_netlink(ctx, source="kernel")
                for subsystem in self._subsystems:
                    monitor.filter_by(subsystem)
                monitor.start()
                self._monitor = monitor
            except (OSError, ImportError, ValueError) as exc:
                status = UdevStatus(False, f"cannot open a uevent socket: {exc}")
        self.status = status
        self._entered = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # pyudev closes the netlink socket when the monitor is released.
        self._monitor = None
        self._entered = False

    def __aiter__(self) -> UdevMonitor:
        return self

    async def __anext__(self) -> UdevEvent:
        if not self._entered:
            raise RuntimeStateError("UdevMonitor used outside 'async with'")
        if self._monitor is None:
            raise StopAsyncIteration
        return await self.receive()

    async def receive(self) -> UdevEvent:
        """Wait for the next uevent (use ``anyio.fail_after`` to bound the wait).

        :raises RuntimeStateError: outside ``async with`` or udev unavailable (check ``status``).
        """
        if self._monitor is None:
            raise RuntimeStateError(f"no uevent monitor: {self.status.reason}")
        monitor = self._monitor
        while True:
            device = monitor.poll(timeout=0)
            if device is not None:
                self.events_received += 1
                return UdevEvent(
                    action=device.action or "",
                    subsystem=device.subsystem or "",
                    sys_name=device.sys_name,
                    sys_path=device.sys_path,
                )
            await anyio.wait_readable(monitor.fileno())
