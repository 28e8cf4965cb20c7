"""LiveTwin: a simulated board's sysfs tree, kept live under a root.

``async with LiveTwin("rk3588", root) as twin:`` materialises the tree and owns one task
that, every ``period_s`` of the injected clock, advances the physics by
``elapsed * speed`` board seconds, applies the writes the runtime made to the writable
knobs (kernel semantics: :mod:`hetsched._twin.kernel`), and rewrites the dynamic files
(frequencies, loads, temperatures, rail readings, ``/proc/stat``).

Rejected writes (``EINVAL`` on a board: unknown governor, non-numeric value, setspeed
without the userspace governor, ...) cannot fail a regular file's ``write()``; the twin
instead restores the file's previous content on its next poll and counts the rejection
(:class:`LiveTwinStatistics`). A knob found empty is assumed to be mid-write and is
re-read on the next poll before being treated as invalid.

The session's work (:mod:`hetsched._twin.loadfile`): while the twin runs (``async with``, or
once :meth:`LiveTwin.advance` has been called) it keeps a load channel under its root, to
which simulated stages append their *modelled* busy board-seconds per domain. Each update
reads what was reported since the last one and turns it into that period's utilisation,
``busy_board_s / board_seconds`` of the period (``elapsed * speed``: both are board
seconds, so at ``speed=10`` a session that keeps the GPU busy in modelled time for one
wall second fills a tenth of the ten board seconds simulated), capped at 1.0, where
several workers on one domain, or a host faster than the modelled board, would report more.
A :meth:`LiveTwin.report_utilisation` background value adds to it (capped at 1.0): both
are busy fractions of the same period, as :class:`~hetsched._twin.sim.SimBoard` combines a
background load with its own work. The period's utilisation drives the physics of that
period, so loads, temperatures, rail powers, the kernel-like governors and energy follow the
session. The channel is removed when the ``async with`` block ends; a snapshot-only tree
(:meth:`LiveTwin.write_once` alone, ``hetsched twin --once``) never has one, so no session
writes into a tree nobody reads.

Flaky sensors (``flaky=p``): on each update every online thermal zone's ``temp`` is,
with probability ``p``, left empty for that period (a board's read fails with EAGAIN and
yields no data).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType

import anyio
import anyio.abc

from .._errors import RuntimeStateError, TwinError
from .kernel import WriteRejected, parse_uint, resolve_ceil, resolve_floor
from .loadfile import LoadChannel, LoadChannelStatistics
from .profiles import SocProfile, get_profile
from .sim import SimBoard
from .state import BoardState, boot_state
from .tree import BoardTree, OfflineStyle

__all__ = ["LiveTwin", "LiveTwinStatistics"]


@dataclass(frozen=True)
class LiveTwinStatistics:
    time_s: float
    """Board (virtual) seconds simulated."""
    updates: int
    """Tree refreshes written."""
    writes_applied: int
    writes_rejected: int
    last_rejection: str | None
    """``path: reason`` of the latest rejected write."""
    energy_j: float
    peak_temp_c: float
    throttle_events: int
    reported_busy_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Board seconds of work the session reported per domain (the load channel), all periods."""
    load_channel: LoadChannelStatistics | None = None
    """The load channel's counters (the last channel's once the twin stopped); None before one was opened."""


class LiveTwin:
    """A live, simulated board tree under ``root``. See the module docstring.

    Args:
        soc: profile name or :class:`SocProfile`.
        root: directory to materialise into (created if missing).
        speed: board seconds per clock second (1 = real time).
        seed: noise seed.
        clock: seconds source; default ``anyio.current_time`` inside the task (honours a mock
            clock), ``time.monotonic`` outside.
        period_s: clock seconds between updates.
        flaky: probability that an online zone's temp is unreadable for one period.

    Raises:
        TwinError: bad ``speed``/``period_s``/``flaky`` or ``root`` not a directory.
        UnknownSocError: unknown ``soc`` or ``variant``.

    Every write, read, link and delete of the tree stays inside ``root``: a symlink planted in
    it that leads out makes the first snapshot (:meth:`write_once`, ``hetsched twin --once``)
    raise :class:`~hetsched.PathOutsideRootError` (see :mod:`hetsched._twin.tree_walk`). Once
    the twin runs (:meth:`advance`), a path it cannot write -- a link out of the root, a
    directory where a file belongs -- is skipped and reported once per path (a warning, and
    :meth:`skipped`), never followed; a removed cpufreq policy is followed as a hot-unplug.
    """

    def __init__(
        self,
        soc: str | SocProfile,
        root: str | os.PathLike[str],
        *,
        variant: str | None = None,
        speed: float = 1.0,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        period_s: float = 0.1,
        ambient_c: float = 25.0,
        noise: bool = True,
        flaky: float = 0.0,
        offline_style: OfflineStyle = "-256000",
    ) -> None:
        if not (isinstance(speed, (int, float)) and math.isfinite(speed) and speed > 0):
            raise TwinError(f"speed = {speed!r}: must be a finite number > 0")
        if not (isinstance(period_s, (int, float)) and period_s > 0):
            raise TwinError(f"period_s = {period_s!r}: must be > 0")
        if not 0.0 <= flaky <= 1.0:
            raise TwinError(f"flaky = {flaky!r}: must be a probability in [0, 1]")
        self.profile = get_profile(soc) if isinstance(soc, str) else soc
        self.tree = BoardTree(root, self.profile, variant, offline_style=offline_style)
        self.variant = self.tree.variant
        self.root = self.tree.root
        self.speed = float(speed)
        self.period_s = float(period_s)
        self.flaky = float(flaky)
        self._clock = clock
        self.sim = SimBoard(self.profile, ambient_c=ambient_c, seed=seed, noise=noise, variant=self.variant)
        self._state: BoardState = boot_state(self.profile, self.variant)
        self._jiffies = [[float(v) for v in row] for row in self._state.cpu_jiffies]
        self._materialised = False
        self._updates = 0
        self._applied = 0
        self._rejected = 0
        self._last_rejection: str | None = None
        self._maybe_partial: set[Path] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._running = False
        self._last_clock: float | None = None
        self._load: LoadChannel | None = None
        self._load_stats: LoadChannelStatistics | None = None
        self._bg_util: dict[str, float] = {}
        self._session_util: dict[str, float] = {}
        self._reported: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LiveTwin:
        if self._running:
            raise RuntimeStateError("LiveTwin is already running")
        self.write_once()
        self._open_load()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._running = True
        self._tg.start_soon(self._run, name=f"LiveTwin({self.profile.name})")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tg = self._tg
        self._tg = None
        self._running = False
        if tg is None:
            return None
        tg.cancel_scope.cancel()
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        finally:
            if self._load is not None:
                self._load_stats = self._load.statistics()
                self._load.remove()
                self._load = None  # a twin entered again makes a fresh channel

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        try:
            return anyio.current_time()
        except Exception:  # no event loop: plain monotonic time
            return time.monotonic()

    async def _run(self) -> None:
        self._last_clock = self._now()
        while True:
            await anyio.sleep(self.period_s)
            now = self._now()
            dt = max(0.0, now - (self._last_clock if self._last_clock is not None else now))
            self._last_clock = now
            self.advance(dt * self.speed)

    # ------------------------------------------------------------------ synchronous API

    def write_once(self) -> Path:
        """Write a consistent snapshot of the board now (creating the tree if needed); returns the root.

        Raises:
            PathOutsideRootError: a symlink in an existing tree leads a path out of the root
                (refused before anything outside is touched).
            TwinError: a file or directory of the tree is in the way, or the root cannot be made.
        """
        if not self._materialised:
            self.sim.board_state(self._state)
            self._fill_jiffies()
            self.tree.materialise(self._state)
            self._materialised = True
        else:
            self._render()
        return self.root

    def advance(self, board_seconds: float) -> None:
        """Apply pending writes, advance the physics by ``board_seconds``, rewrite the tree.

        Raises:
            TwinError: negative ``board_seconds``; the twin's load channel under the root is a
                symlink or not a directory (checked when the twin first opens it).
            PathOutsideRootError: a symlink planted in the tree leads a knob or file out of the
                root (refused: nothing outside is read or written).
        """
        if not board_seconds >= 0:
            raise TwinError(f"advance({board_seconds!r}): must be >= 0")
        with self.tree.batch():  # one set of directory descriptors for the poll and the render
            if not self._materialised:
                self.write_once()
            self.tree.lenient = True  # running: skip and report what cannot be written (module doc)
            self._follow_hotplug()
            load = self._open_load()
            self.poll_writes()
            if board_seconds > 0:
                # Read only when time passes: work reported during a zero-length update is the next
                # period's.
                self._apply_load(load.read(), board_seconds)
                self.sim.step(board_seconds)
                self._account_jiffies(board_seconds)
            self._render()

    def _follow_hotplug(self) -> None:
        """A CPU domain whose cpufreq policy directory went (its CPUs hot-unplugged, or the
        directory linked out of the root) is no longer simulated as running: idle at its lowest
        clock, its CPUs offline, the policy not recreated (:meth:`BoardTree.unplug`)."""
        for d in self.profile.domains:
            if d.kind != "cpu" or d.name in self.tree.unplugged or self.tree.policy_present(d):
                continue
            self.tree.unplug(d)
            self._bg_util.pop(d.name, None)
            self._session_util.pop(d.name, None)
            self.sim.set_utilisation(d.name, 0.0)
            self.sim.kernel_limits(d.name, max_hz=d.available_hz[0])

    def skipped(self) -> Mapping[str, str]:
        """Root-relative paths the running twin could not write, read or delete (a directory in
        the way, a link out of the root), each with why; each was reported once."""
        return MappingProxyType(dict(self.tree.skipped))

    def report_utilisation(self, domain: str, util: float) -> None:
        """A workload reports ``domain``'s busy fraction (0..1) until changed.

        The session's reported work adds to it (see the module docstring).

        Raises:
            TwinError: unknown domain or util outside [0, 1].
        """
        self.sim.set_utilisation(domain, util)  # validates domain and range
        self._bg_util[domain] = float(util)
        session = self._session_util.get(domain, 0.0)
        if session:
            self.sim.set_utilisation(domain, min(1.0, util + session))

    def _open_load(self) -> LoadChannel:
        if self._load is None:
            self._load = LoadChannel.create(self.root)
        return self._load

    def _apply_load(self, busy: Mapping[str, float], board_seconds: float) -> None:
        """Set each domain's utilisation for the period from the busy seconds reported in it."""
        for d in self.profile.domains:
            name = d.name
            if name in self.tree.unplugged:
                continue
            b = busy.get(name, 0.0)
            if b:
                self._reported[name] = self._reported.get(name, 0.0) + b
            u = min(1.0, b / board_seconds)
            if u == self._session_util.get(name, 0.0):
                continue
            self._session_util[name] = u
            self.sim.set_utilisation(name, min(1.0, self._bg_util.get(name, 0.0) + u))

    def statistics(self) -> LiveTwinStatistics:
        s = self.sim.statistics()
        return LiveTwinStatistics(
            time_s=s.time_s,
            updates=self._updates,
            writes_applied=self._applied,
            writes_rejected=self._rejected,
            last_rejection=self._last_rejection,
            energy_j=s.energy_j,
            peak_temp_c=s.peak_temp_c,
            throttle_events=s.throttle_events,
            reported_busy_s=MappingProxyType(dict(self._reported)),
            load_channel=self._load_stats if self._load is None else self._load.statistics(),
        )

    # ------------------------------------------------------------------ rendering

    def _account_jiffies(self, dt: float) -> None:
        for d in self.profile.domains:
            u = self.sim.utilisation(d.name)
            for c in d.cpus:
                row = self._jiffies[c]
                row[0] += u * dt * 100.0
                row[3] += (1.0 - u) * dt * 100.0

    def _fill_jiffies(self) -> None:
        self._state.cpu_jiffies = [[int(v) for v in row] for row in self._jiffies]

    def _render(self) -> None:
        st = self.sim.board_state(self._state)
        if self.flaky > 0.0:
            for k, t in enumerate(st.zone_temps_c):
                if t is not None and self.sim.noise.chance(self.flaky):
                    st.zone_temps_c[k] = math.nan
        self._fill_jiffies()
        self._render_state(st)
        self._updates += 1

    def _render_state(self, st: BoardState) -> None:
        self.tree.render(st)

    # ------------------------------------------------------------------ kernel write handling

    def poll_writes(self) -> int:
        """Apply (or reject and revert) every knob the runtime changed since the last update.

        Returns the number of writes seen.

        Raises:
            PathOutsideRootError: a knob, or a directory above it, was replaced by a symlink
                leading out of the root (it is neither read nor written).
        """
        with self.tree.batch():
            return self._poll_writes()

    def _poll_writes(self) -> int:
        seen = 0
        changed: list[tuple[int, int, int, Path, str, str, bytes]] = []
        for order, (path, (domain, knob)) in enumerate(self.tree.knobs.items()):
            mine = self.tree.written(path)
            got = self.tree.read(path)  # contained: a knob linked out of the root raises
            if got is None:
                continue
            now, mtime = got
            if mine is not None and now == mine:
                self._maybe_partial.discard(path)
                continue
            if not now.strip() and path not in self._maybe_partial:
                self._maybe_partial.add(path)
                continue
            self._maybe_partial.discard(path)
            # Mode switches (governor, EMC lock) sort before values written in the same tick.
            rank = 0 if knob in ("scaling_governor", "governor", "mrq_rate_locked") else 1
            changed.append((mtime, rank, order, path, domain, knob, now))
        # A kernel applies each write when it happens: replay them in the order they were made
        # (file modification time), not in the order the knobs are listed.
        changed.sort(key=lambda c: (c[0], c[1], c[2]))
        for _mtime, _rank, _order, path, domain, knob, now in changed:
            seen += 1
            try:
                self._apply(domain, knob, now.decode("ascii", "replace"))
            except WriteRejected as exc:
                self._rejected += 1
                self._last_rejection = f"{path.relative_to(self.root)}: {exc}"
            else:
                self._applied += 1
            # Show what the kernel shows now (the new value, or the old one restored), unless
            # the knob was written again since it was read here (tree_files.TreeFiles.forget).
            self.tree.forget(path, seen=now)
        if seen:
            self.sim.board_state(self._state)
            self._fill_jiffies()
            try:
                self._render_state(self._state)
            finally:
                self.tree.clear_seen()
        return seen

    def _apply(self, domain: str, knob: str, text: str) -> None:
        sim = self.sim
        d = self.profile.domain(domain)
        avail = list(d.available_hz)
        if knob in ("scaling_governor", "governor"):
            gov = text.strip()
            try:
                sim.set_governor(domain, gov)
            except TwinError:
                raise WriteRejected(f"governor {gov!r} is not available") from None
            return
        if knob in ("mrq_rate_locked",):
            v = parse_uint(text)
            if v not in (0, 1):
                raise WriteRejected(f"mrq_rate_locked accepts 0 or 1, not {v}")
            self._state.emc_locked = bool(v)
            if v:
                cur = sim.frequency(domain)
                sim.set_governor(domain, "userspace")
                sim.kernel_limits(domain, setspeed_hz=cur)
            else:
                sim.set_governor(domain, "bpmp")
            return
        value = parse_uint(text)
        if knob == "emc_iso_cap":
            self._state.emc_iso_cap_hz = value
            sim.kernel_limits(domain, max_hz=avail[-1] if value == 0 else resolve_floor(avail, value))
            return
        if knob == "rate":
            # Accepted by debugfs either way; BPMP only honours it while the rate is locked.
            if self._state.emc_locked:
                _lo, hi, _ = sim.user_limits(domain)
                sim.kernel_limits(domain, setspeed_hz=resolve_ceil(avail, min(max(value, avail[0]), hi)))
            return
        if d.kind == "cpu":
            hz = value * 1000
            lo_c, hi_c = avail[0], avail[-1]
            clamped = min(max(hz, lo_c), hi_c)
            if knob == "scaling_min_freq":
                sim.kernel_limits(domain, min_hz=resolve_ceil(avail, clamped))
            elif knob == "scaling_max_freq":
                sim.kernel_limits(domain, max_hz=resolve_floor(avail, clamped))
            elif knob == "scaling_setspeed":
                if sim.governor(domain) != "userspace":
                    raise WriteRejected("scaling_setspeed needs the userspace governor")
                sim.kernel_limits(domain, setspeed_hz=hz)
            return
        # devfreq: PM-QoS requests in kHz precision, not rounded to OPPs.
        if knob == "min_freq":
            hz = avail[0] if value == 0 else -(-value // 1000) * 1000
            sim.kernel_limits(domain, min_hz=min(max(hz, avail[0]), avail[-1]))
        elif knob == "max_freq":
            hz = avail[-1] if value == 0 else (value // 1000) * 1000
            sim.kernel_limits(domain, max_hz=min(max(hz, avail[0]), avail[-1]))
        elif knob == "set_freq":
            if sim.governor(domain) != "userspace":
                raise WriteRejected("set_freq needs the userspace governor")
            sim.kernel_limits(domain, setspeed_hz=value)
