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

Never change a knob that cannot be put back: a domain whose saved knobs are no value a
restore could write (binary bytes, a governor not in the available list, a file that
exists but reads nothing) is left alone, with a warning naming the file, both when the
port is made (it is not offered to the governor) and at :meth:`save` (its writes are
dropped). A restore tries every knob of every domain and reports all that failed at the
end (:attr:`SysfsPort.restore_failures`). Its :func:`~hetsched._governor._knobs.write_back`
is shared with ``hetsched restore``, which puts back what a governor that died (SIGKILL, OOM,
power loss) saved; :meth:`save` does it first when it finds such a file, so a dead run's
clocks are never taken for the board's own.

The root's governor state directory (``run/hetsched``: the lock, the state file, the saved
knobs) is owned by the port's :attr:`~SysfsPort.state_dir`
(:class:`~hetsched._governor._state_dir.StateDir`, the port's ``state_dir`` capability, through
which the engine publishes too). One governor per root: :meth:`save` first takes the root's
governor lock (:class:`GovernorBusyError` when another governor holds it, before anything is
read back or written); :meth:`restore` puts the knobs back and then closes the state directory
(the state file, the saved file once every knob is back, then the lock).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._errors import GovernorBusyError, SysfsError, SysfsPermissionError
from .._estimators import power_estimator_for
from .._platform import cpufreq, devfreq
from .._platform._fs import SysfsRoot, parse_name
from .._platform.discovery import discover
from .._platform.jetson import EMC_DIR
from .._platform.telemetry import Telemetry
from .._snapshot import Snapshot
from ._knobs import Knobs, by_role, expected_knobs, unrestorable, write_back
from ._points import DEFAULT_LATENCY_S, DomainSpec
from ._state_dir import StateDir

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
    refused: str | None = None  # why its knobs could not be restored: never written
    saved: Knobs | None = None  # what save() read (None before)


class SysfsPort:
    """A board under ``root`` as a :class:`~hetsched._governor._ports.ClockPort`.

    :param sleep: how to wait for a clock change to take effect (injected for tests).
    :param settle_s: longest wait for a write to show (read-back, userspace governor files);
        the governor re-checks a domain that has not followed at its next decision.
    :param restore_settle_s: longest wait, after restoring, for every restored knob to read
        back as saved (a kernel shows it at once; a live twin on its next update, e.g. a
        ``scaling_setspeed`` that reads ``<unsupported>`` again once the governor is back).
    :param recover: at :meth:`save`, first put back what a governor that died on this root
        saved (its file under ``run/hetsched``, its pid gone); ``hetsched doctor --probe``
        turns it off (it only looks).
    :raises SysfsError: ``root`` is not a directory.
    :raises SysfsPermissionError: the clock files cannot be read.
    """

    integrates_samples_by_telemetry = True
    """A board's rail energy is the telemetry's trapezoid of the samples the governor takes."""

    def __init__(
        self,
        root: str | os.PathLike[str] | SysfsRoot = "/",
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        settle_s: float = 0.005,
        restore_settle_s: float = 0.5,
        recover: bool = True,
    ) -> None:
        self.fs = root if isinstance(root, SysfsRoot) else SysfsRoot(root)
        self._clock = clock
        self._sleep = sleep
        self.settle_s = settle_s
        self.restore_settle_s = restore_settle_s
        self.recover = recover
        self.state_dir: StateDir | None = StateDir(self.fs)
        """The root's governor state directory (lock, state file, saved knobs): the port's capability."""
        self._state = self.state_dir
        self.refused: dict[str, str] = {}
        """Domains left alone (never written): their knobs could not be restored (why)."""
        self.restore_failures: dict[str, str] = {}
        """Knobs the last :meth:`restore` could not put back: path -> why."""
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
        try:
            now = self._read_knobs()
        except SysfsPermissionError:
            now = {}  # save() raises it where the caller decides (strict or not)
        # What a governor that died saved is what save() will find once it has put it back.
        for knobs in self._state.dead_saved_knobs().values():
            for path, raw in knobs.items():
                for mine in now.values():
                    if path in mine:
                        mine[path] = raw
        for name in list(self._doms):
            why = self._refusal(self._doms[name], now.get(name, {}))
            if why is not None:
                self.refused[name] = why
                del self._doms[name]
                log.warning("governor: leaving %s alone (not governed): %s, so it could not be restored", name, why)

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

    def _read_knobs(self) -> dict[str, dict[str, bytes | None]]:
        return {name: {k: self.fs.read_bytes(k) for k in self._knobs(d)} for name, d in self._doms.items()}

    def _refusal(self, d: _Domain, knobs: Knobs) -> str | None:
        """Why this domain's knobs, as read now, could not be put back after governing it."""
        governors: tuple[str, ...] = ()
        if d.policy is not None:
            governors = d.policy.governors
        elif d.device is not None:
            governors = d.device.governors
        by = by_role(knobs)
        needed = ["lock", "rate"] if d.kind == "emc" else ["min", "max"]
        if d.kind != "emc" and "userspace" in governors:
            needed.append("governor")
        for role in needed:
            if role not in by:
                continue
            path, raw = by[role]
            if raw is None:
                if self.fs.exists(path):
                    return f"{path} exists but reads nothing"
                continue
            why = unrestorable(path, raw, governors if role == "governor" else ())
            if why is not None:
                return f"{path} {why}"
        return None

    def save(self) -> dict[str, dict[str, bytes | None]]:
        """Raw bytes of every knob of every domain (None for files absent now).

        With ``recover``, what a governor that died on this root left changed is put back
        first (a warning says so); a knob that could not be is saved as that governor saved
        it, never as the changed value found now. A domain whose knobs could not be restored
        is left alone from now on (warned, its writes dropped). The root's governor lock is
        taken first and held until the restore (released again when this raises).

        :raises GovernorBusyError: another governor holds the root's lock (or an older
            version's governor that has no lock still runs, by its saved file's pid); nothing
            was saved or written.
        :raises PathOutsideRootError: the lock's directory or file is a link leading outside the root.
        :raises SysfsPermissionError: a knob may not be read, or the lock may not be created.
        :raises SysfsError: the lock cannot be taken for another reason (a link, not a file).
        """
        fresh = not self._state.locked
        if fresh:
            self._state.lock()
        try:
            carried = self._recover_dead() if self.recover else {}
            saved = self._read_knobs()
        except BaseException:
            if fresh:
                self.release_lock()
            raise
        for knobs in saved.values():
            for path in knobs:
                if path in carried:
                    knobs[path] = carried[path]
        for name, d in self._doms.items():
            d.saved = saved[name]
            why = self._refusal(d, saved[name])
            if why is not None and d.refused is None and d.mode is None:
                d.refused = why
                self.refused[name] = why
                log.warning("governor: leaving %s alone (not governed): %s, so it could not be restored", name, why)
        return saved

    def _recover_dead(self) -> dict[str, bytes]:
        out = self._state.restore_saved()  # under the lock this holds: a locked file is a dead governor's
        if out.status == "refused":
            # Only an older version's file (no lock) whose pid runs: never save its clocks as ours.
            raise GovernorBusyError(f"not governing {self.fs.root}: {out.message}", root=str(self.fs.root), pid=out.pid)
        if out.status != "nothing":
            log.warning("governor: before saving the clocks: %s", out.message)
        return dict(out.left)

    def restore(self, saved: dict[str, dict[str, bytes | None]]) -> None:
        """Write the saved knobs back (only domains this port wrote); every knob of every
        domain is tried, what failed is kept in :attr:`restore_failures`. Then the state
        directory is closed, also when this raises: the state file goes, the saved knobs only
        when every knob is back, then the governor lock (:meth:`StateDir.close`).

        :raises SysfsPermissionError: a knob could not be written for want of permission
            (the message lists every knob left changed).
        :raises SysfsError: some other knob could not be put back (the message names each).
        """
        restored = False
        try:
            self._restore(saved)
            restored = True
        finally:
            self._state.close(restored=restored)

    @property
    def locked(self) -> bool:
        """Whether this port holds the root's governor lock now."""
        return self._state.locked

    def release_lock(self) -> None:
        """Drop the root's governor lock (its file removed, see :mod:`hetsched._governor._lock`); idempotent."""
        self._state.unlock()

    def _restore(self, saved: dict[str, dict[str, bytes | None]]) -> None:
        failed: dict[str, SysfsError | str] = {}
        restored: list[tuple[_Domain, Knobs]] = []
        for name, d in self._doms.items():
            if d.mode is None:
                continue
            knobs = saved.get(name)
            if knobs is None:
                failed[name] = f"{name}: nothing saved for it"
            else:
                failed.update(self._restore_domain(d, knobs) or {})
                restored.append((d, knobs))
            d.mode = None
            d.target = None
        self._await_restored(restored, failed)
        self.restore_failures = {p: str(why) for p, why in failed.items()}
        if failed:
            text = "; ".join(self.restore_failures.values())
            for p, why in self.restore_failures.items():
                log.warning("governor: could not restore %s: %s", p, why)
            errs = [e for e in failed.values() if isinstance(e, SysfsError)]
            denied = next((e for e in errs if isinstance(e, SysfsPermissionError)), None)
            if denied is not None:
                raise SysfsPermissionError(denied.errno, f"{len(failed)} clock knobs left changed: {text}") from denied
            raise SysfsError(errno.EIO, f"{len(failed)} clock knobs left changed: {text}") from (errs[0] if errs else None)

    def _await_restored(self, restored: list[tuple[_Domain, Knobs]], failed: Mapping[str, object]) -> None:
        """Bounded wait until every restored knob reads back byte-identical (``restore_settle_s``).

        A knob the restore itself writes that reads back otherwise after a wait was overwritten
        meanwhile (a live twin re-rendering a file from the state it had before the writes, its
        poll having read the file just before the restore wrote it): its domain is written again
        at once, at every wait, and once more when the time is up. It used to be written again
        only every eighth wait, which a loaded host (each sleep overshooting) never reached
        before the deadline: the restore then ended with a knob left changed. Files the kernel
        renders (a set-speed file) are only waited for.
        """
        expect = [(d, kn, {p: v for p, v in expected_knobs(kn, rendered=True).items() if p not in failed},
                   {p: v for p, v in expected_knobs(kn).items() if p not in failed}) for d, kn in restored]

        def read(path: str) -> bytes | None:
            try:
                return self.fs.read_bytes(path)
            except SysfsError:
                return None

        def off() -> list[tuple[_Domain, Knobs, dict[str, bytes], dict[str, bytes]]]:
            return [e for e in expect if any(read(k) != v for k, v in e[2].items())]

        def rewrite(pending: list[tuple[_Domain, Knobs, dict[str, bytes], dict[str, bytes]]]) -> None:
            for d, kn, _, written in pending:
                if any(read(k) != v for k, v in written.items()):
                    self._restore_domain(d, kn)

        pending = off()
        if not pending or self.restore_settle_s <= 0:
            return
        deadline = self._clock() + self.restore_settle_s
        step = self.restore_settle_s / 32
        for _ in range(64):  # bounded even if the injected clock does not move
            self._sleep(step)
            pending = off()
            if not pending:
                return
            rewrite(pending)
            if self._clock() >= deadline:
                break
        self._sleep(step)  # the last rewrite's chance to show
        pending = off()
        if pending:
            self._report_unsettled([(d, kn, ex) for d, kn, ex, _ in pending], read)

    @staticmethod
    def _report_unsettled(pending: list[tuple[_Domain, Knobs, dict[str, bytes]]],
                          read: Callable[[str], bytes | None]) -> None:
        """Log each knob still not as saved after the wait: path, saved bytes, read-back bytes.

        A warning when a knob the restore writes is off: its clock is left changed. A set-speed
        file off while every written knob reads back as saved is none: the kernel renders
        ``scaling_setspeed`` from the policy's governor (``show_scaling_setspeed`` in
        ``drivers/cpufreq/cpufreq.c`` prints ``<unsupported>`` unless the governor has
        ``show_setspeed``), nothing can write it, and it follows the restored governor at the
        kernel's next update: at once on a board, at the next poll on a twin (one advanced by
        hand, or a task of the event loop this restore holds, has not polled meanwhile). That
        is logged at info level.
        """
        changed: dict[str, list[str]] = {}
        rendered: list[str] = []
        for d, kn, ex in pending:
            written = expected_knobs(kn)
            for p, v in ex.items():
                now = read(p)
                if now == v:
                    continue
                what = f"{d.spec.name} {p}: saved {v!r}, reads {now!r}"
                if p in written:
                    changed.setdefault(d.spec.name, []).append(what)
                else:
                    rendered.append(what)
        if changed:
            log.warning("governor: knobs of %s did not read back as saved after restoring: %s",
                        ", ".join(changed), "; ".join([w for ws in changed.values() for w in ws] + rendered))
        elif rendered:
            log.info("governor: restored; the kernel has not re-rendered from the restored governor yet "
                     "(it does at its next update): %s", "; ".join(rendered))

    def _restore_domain(self, d: _Domain, knobs: Knobs) -> dict[str, SysfsError | str]:
        """Write one domain's knobs back (:func:`write_back`): path -> why not, for each that failed."""
        return write_back(self.fs, knobs)

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
        if d.refused is not None:
            return  # never change a knob that cannot be put back (warned at save)
        lat = d.spec.transition_latency_s
        if d.kind == "cpufreq":
            pol = d.policy
            assert pol is not None
            if d.mode is None:
                d.mode = "limits"
                if "userspace" in pol.governors and self._may_setspeed(d):
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
                if "userspace" in dev.governors and self._may_setspeed(d):
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

    def _may_setspeed(self, d: _Domain) -> bool:
        """Whether the set-speed file may be written: not when the board already runs
        ``userspace`` with a set-speed value that could not be written back (the limits are used)."""
        if d.saved is None:
            return True
        by = by_role(d.saved)
        gov = by.get("governor", ("", None))[1]
        if gov is None or parse_name(gov) != "userspace" or "speed" not in by:
            return True
        path, raw = by["speed"]
        return raw is None or unrestorable(path, raw) is None

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
