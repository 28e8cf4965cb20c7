"""The governor's port onto a real board (or a live twin tree) through the platform layer.

How each domain is driven (decided at its first write, undone by :meth:`restore`):

* cpufreq policy: the ``userspace`` governor and ``scaling_setspeed`` where the policy
  offers it, otherwise ``scaling_min_freq = scaling_max_freq = target`` (works under any
  governor);
* devfreq (GPU, NPU, DMC): ``userspace`` + ``userspace/set_freq``, otherwise
  ``min_freq = max_freq = target``;
* Jetson EMC (bpmp debugfs): ``mrq_rate_locked = 1`` then ``rate``.

Before the first write every such knob is read as raw bytes; :meth:`restore` writes
them back in an order the kernel accepts (governor, then the limits in the order that
never asks for min > max), so the tree ends byte-identical.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._errors import SysfsError
from .._estimators import power_estimator_for
from .._platform import cpufreq, devfreq
from .._platform._fs import SysfsRoot
from .._platform.discovery import discover
from .._platform.jetson import EMC_DIR
from .._platform.telemetry import Telemetry
from .._snapshot import Snapshot
from ._points import DEFAULT_LATENCY_S, DomainSpec

log = logging.getLogger("hetsched.governor")

__all__ = ["SysfsPort"]


@dataclass
class _Domain:
    spec: DomainSpec
    kind: str  # "cpufreq" | "devfreq" | "emc"
    policy: cpufreq.CpufreqPolicy | None = None
    device: devfreq.DevfreqDevice | None = None
    mode: str | None = None  # "setspeed" | "limits" | "emc", chosen at first write
    target: int | None = None


class SysfsPort:
    """A board under ``root`` as a :class:`~hetsched._governor._ports.ClockPort`.

    :param sleep: how to wait for a clock change to take effect (injected for tests).
    :param settle_s: longest wait for a write to show (read-back, userspace governor files);
        the governor re-checks a domain that has not followed at its next decision.
    :param restore_settle_s: longest wait, after restoring, for every restored knob to read
        back as saved (a kernel shows it at once; a live twin on its next update, e.g. a
        ``scaling_setspeed`` that reads ``<unsupported>`` again once the governor is back).
    :raises SysfsError: ``root`` is not a directory.
    :raises SysfsPermissionError: the clock files cannot be read.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | SysfsRoot = "/",
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        settle_s: float = 0.005,
        restore_settle_s: float = 0.5,
    ) -> None:
        self.fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
        self._clock = clock
        self._sleep = sleep
        self.settle_s = settle_s
        self.restore_settle_s = restore_settle_s
        self.platform = discover(self.fs)
        self.soc = self.platform.soc
        self._telemetry: Telemetry | None = None
        self._doms: dict[str, _Domain] = {}
        for pol in cpufreq.read_policies(self.fs):
            if not pol.available_khz:
                continue
            lat = pol.transition_latency_ns
            latency = lat / 1e9 if lat and lat > 0 else DEFAULT_LATENCY_S["cpu"]
            # Within the limits found (nvpmodel's CPU floor, say): the governor works inside them.
            lo = pol.min_khz or 0
            hi = pol.max_khz or pol.available_khz[-1]
            khz = tuple(k for k in pol.available_khz if lo <= k <= hi) or pol.available_khz
            spec = DomainSpec(pol.name, "cpu", tuple(k * 1000 for k in khz), latency)
            self._doms[pol.name] = _Domain(spec, "cpufreq", policy=pol)
        for dev in devfreq.read_devices(self.fs):
            if dev.kind not in ("gpu", "npu", "memory") or not dev.available_hz or dev.kind in self._doms:
                continue
            spec = DomainSpec(dev.kind, dev.kind, dev.available_hz, DEFAULT_LATENCY_S[dev.kind])
            self._doms[dev.kind] = _Domain(spec, "devfreq", device=dev)
        if "memory" not in self._doms:
            emc = self.platform.device("memory")
            if emc is not None and emc.source == "bpmp" and len(emc.frequencies_hz) >= 1:
                spec = DomainSpec("memory", "memory", emc.frequencies_hz, DEFAULT_LATENCY_S["memory"])
                self._doms["memory"] = _Domain(spec, "emc")

    # -- ClockPort ------------------------------------------------------------------

    def domains(self) -> Mapping[str, DomainSpec]:
        return {n: d.spec for n, d in self._doms.items()}

    def now(self) -> float:
        return self._clock()

    def sample(self) -> Snapshot | None:
        if self._telemetry is None:
            estimator = power_estimator_for(self.platform)
            self._telemetry = Telemetry(self.fs, platform=self.platform, clock=self._clock, estimator=estimator)
        return self._telemetry.sample_once()

    def _knobs(self, d: _Domain) -> list[str]:
        if d.kind == "cpufreq":
            assert d.policy is not None
            p = d.policy.path
            return [f"{p}/scaling_governor", f"{p}/scaling_min_freq", f"{p}/scaling_max_freq", f"{p}/scaling_setspeed"]
        if d.kind == "devfreq":
            assert d.device is not None
            p = d.device.path
            return [f"{p}/governor", f"{p}/min_freq", f"{p}/max_freq", f"{p}/userspace/set_freq"]
        return [f"{EMC_DIR}/mrq_rate_locked", f"{EMC_DIR}/rate"]

    def save(self) -> dict[str, dict[str, bytes | None]]:
        """Raw bytes of every knob of every domain (None for files absent now)."""
        return {name: {k: self.fs.read_bytes(k) for k in self._knobs(d)} for name, d in self._doms.items()}

    def restore(self, saved: dict[str, dict[str, bytes | None]]) -> None:
        """Write the saved knobs back (only domains this port wrote); every domain is tried.

        :raises SysfsError: (the first) failure, after trying every domain.
        """
        first: SysfsError | None = None
        restored: list[tuple[_Domain, Mapping[str, bytes | None]]] = []
        for name, d in self._doms.items():
            if d.mode is None:
                continue
            try:
                self._restore_domain(d, saved[name])
                restored.append((d, saved[name]))
            except SysfsError as exc:
                first = first or exc
            d.mode = None
            d.target = None
        if first is not None:
            raise first
        self._await_restored(restored)

    def _await_restored(self, restored: list[tuple[_Domain, Mapping[str, bytes | None]]]) -> None:
        """Bounded wait until every restored knob reads back byte-identical (``restore_settle_s``);
        a domain still off after a while is written again (a live twin that re-rendered a file
        from its old state just as the restore landed)."""

        def off() -> list[tuple[_Domain, Mapping[str, bytes | None]]]:
            return [(d, kn) for d, kn in restored
                    if any(v is not None and self.fs.read_bytes(k) != v for k, v in kn.items())]

        pending = off()
        if not pending or self.restore_settle_s <= 0:
            return
        deadline = self._clock() + self.restore_settle_s
        step = self.restore_settle_s / 32
        for i in range(64):  # bounded even if the injected clock does not move
            self._sleep(step)
            pending = off()
            if not pending or self._clock() >= deadline:
                break
            if i % 8 == 7:
                for d, kn in pending:
                    try:
                        self._restore_domain(d, kn)
                    except SysfsError:
                        pass  # reported by the first pass already, if it failed there
        if pending:
            log.warning("governor: knobs of %s did not read back as saved after restoring",
                        ", ".join(d.spec.name for d, _ in pending))

    def _restore_domain(self, d: _Domain, knobs: Mapping[str, bytes | None]) -> None:
        def value(path: str) -> str | None:
            raw = knobs.get(path)
            return None if raw is None else raw.decode().strip()

        def raw(path: str) -> str:
            # Exactly what was read (newline included): the kernel accepts it, and a
            # plain-file tree ends byte-identical.
            data = knobs.get(path)
            assert data is not None
            return data.decode()

        if d.kind == "emc":
            lock_path, rate_path = self._knobs(d)
            rate, locked = value(rate_path), value(lock_path)
            if locked not in (None, "0") and rate is not None:
                self.fs.write_text(rate_path, raw(rate_path))
            if locked is not None:
                self.fs.write_text(lock_path, raw(lock_path))
            return
        gov_path, min_path, max_path, speed_path = self._knobs(d)
        gov, lo, hi, speed = value(gov_path), value(min_path), value(max_path), value(speed_path)
        if gov is not None and self.fs.read_bytes(gov_path) != knobs.get(gov_path):
            self.fs.write_text(gov_path, raw(gov_path))
        if lo is not None and hi is not None and lo.isdigit() and hi.isdigit():
            cur_max = self.fs.read_int(max_path)
            if cur_max is not None and int(lo) > cur_max:
                self.fs.write_text(max_path, raw(max_path))
                self.fs.write_text(min_path, raw(min_path))
            else:
                self.fs.write_text(min_path, raw(min_path))
                self.fs.write_text(max_path, raw(max_path))
        if gov == "userspace" and speed is not None and speed.isdigit() and self.fs.exists(speed_path):
            self.fs.write_text(speed_path, raw(speed_path))

    def _wait_for(self, ready: Callable[[], bool], latency_s: float) -> bool:
        """Poll ``ready`` until true or the settle time is spent (a kernel applies at once;
        a live twin on its next update)."""
        if ready():
            return True
        if self.settle_s <= 0:
            return False
        deadline = self._clock() + self.settle_s
        step = max(latency_s, 1e-4)
        for _ in range(64):  # bounded even if the injected clock does not move
            if self._clock() >= deadline:
                break
            self._sleep(step)
            if ready():
                return True
        return False

    def write(self, domain: str, hz: int) -> None:
        d = self._doms[domain]
        d.spec.check(hz)
        lat = d.spec.transition_latency_s
        if d.kind == "cpufreq":
            pol = d.policy
            assert pol is not None
            if d.mode is None:
                d.mode = "limits"
                if "userspace" in pol.governors:
                    cpufreq.set_governor(self.fs, pol, "userspace")
                    speed = f"{pol.path}/scaling_setspeed"
                    if self._wait_for(lambda: (self.fs.read_str(speed) or "").isdigit(), lat):
                        d.mode = "setspeed"
            if d.mode == "setspeed":
                cpufreq.set_setspeed(self.fs, pol, hz // 1000)
            else:
                cpufreq.set_limits(self.fs, pol, hz // 1000, hz // 1000)
        elif d.kind == "devfreq":
            dev = d.device
            assert dev is not None
            if d.mode is None:
                d.mode = "limits"
                if "userspace" in dev.governors:
                    devfreq.set_governor(self.fs, dev, "userspace")
                    if self._wait_for(lambda: self.fs.exists(f"{dev.path}/userspace/set_freq"), lat):
                        d.mode = "setspeed"
            if d.mode == "setspeed":
                devfreq.set_userspace_freq(self.fs, dev, hz)
            else:
                devfreq.set_limits(self.fs, dev, hz, hz)
        else:
            if d.mode is None:
                d.mode = "emc"
                self.fs.write_text(f"{EMC_DIR}/mrq_rate_locked", 1)
            self.fs.write_text(f"{EMC_DIR}/rate", hz)
        d.target = hz

    def _read_now(self, d: _Domain) -> int | None:
        if d.kind == "cpufreq":
            assert d.policy is not None
            khz = cpufreq.read_cur_khz(self.fs, d.policy)
            return None if khz is None else khz * 1000
        if d.kind == "devfreq":
            assert d.device is not None
            return self.fs.read_int(f"{d.device.path}/cur_freq")
        return self.fs.read_int(f"{EMC_DIR}/rate")

    def read(self, domain: str) -> int | None:
        """Current frequency; right after a write, waits (bounded) until it shows the target."""
        d = self._doms[domain]
        target = d.target
        if target is not None:
            self._wait_for(lambda: self._read_now(d) == target, d.spec.transition_latency_s)
        return self._read_now(d)
