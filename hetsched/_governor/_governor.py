"""The public phase-aware DVFS governor."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType, TracebackType
from typing import Any

import anyio

from .._errors import RuntimeStateError, SysfsPermissionError
from ._decide import GovernorConfig
from ._engine import GovernorEngine, GovernorStatistics
from ._phase import Phase, as_phase
from ._ports import ClockPort, SimPort
from ._profile import GovernorProfile

__all__ = ["Governor", "GovernorWarning"]

log = logging.getLogger("hetsched.governor")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GovernorWarning(UserWarning):
    """The governor could not govern (no permission, ``strict=False``) and the run goes on ungoverned."""


def _exit_for(signum: int) -> BaseException:
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return SystemExit(128 + signum)


class Governor:
    """Phase-aware DVFS governor: sets every clock domain per program phase.

    ::

        with Governor(root="/", slowdown=0.05, power_budget_w=10) as gov:   # sync (training)
            with gov.phase(Phase.FORWARD):
                ...
        async with Governor(root=twin_root) as gov:                          # async (a Session)
            gov.on_phase(Phase.INFER)

    Every knob it may touch (governor, min, max, set-speed, EMC lock) is saved before
    the first write and restored on normal exit, on exceptions, on cancellation (the
    restore is synchronous, so no checkpoint can interrupt it) and on SIGTERM/SIGINT (restored, then ``SystemExit(143)`` or
    ``KeyboardInterrupt`` is raised as the default handlers would). Signals are handled
    only when entered from the main thread.

    :param root: sysfs root of the board (``"/"``) or of a live twin.
    :param slowdown: allowed time per unit of work over the performance point (0.05 = 5 %).
    :param power_budget_w: hard cap on predicted total power, or None.
    :param config: every tuning knob (overrides ``slowdown``/``power_budget_w``).
    :param profile: a :class:`GovernorProfile` or the path of one saved as JSON.
    :param workload: name stored in the profile this run learns.
    :param autotune: sweep operating points for phases the profile lacks.
    :param dry_run: decide and log, never write.
    :param strict: without permission to write, raise (True) or warn and run ungoverned (False).
    :param clock: monotonic seconds (injected for tests).
    :param tick_period_s: telemetry period of the async form's thermal-guard task.
    :param handle_signals: restore on SIGTERM/SIGINT (main thread only).
    :param port: where decisions go, for a board hetsched has no profile for (or a
        simulation): any :class:`ClockPort`. It lists the domains it may set
        (:class:`DomainSpec`: ascending frequency table, transition latency), gives a
        monotonic ``now()`` and a telemetry ``sample()`` (a :class:`Snapshot` with the
        board's power, or None), ``save()`` returns every knob ``write()`` may change so
        that ``restore()`` can put it back, ``write(domain, hz)`` makes the frequency
        effective (the governor checks ``hz`` against the table first) and ``read(domain)``
        returns the frequency the domain runs at (None if unknown; a domain that keeps not following writes is
        reported as frequency-locked and left alone). Its ``soc`` names the board in
        profiles. When given, ``root`` and ``clock`` are not used. Exceptions the port
        raises propagate from the call that made it act (``with``, :meth:`on_phase`,
        :meth:`tick`), except :class:`SysfsPermissionError`, which ``strict=False``
        turns into a :class:`GovernorWarning` and an ungoverned run.
    :raises GovernorError: an invalid config value.
    :raises ProfileError: the profile is unreadable, malformed or for another board.
    :raises SysfsError: ``root`` is not a directory (without ``port``).

    Entering (``with``/``async with``) raises :class:`PowerBudgetError` when the budget is
    below what the profile says is reachable, and :class:`SysfsPermissionError` when the
    clocks cannot be read or written and ``strict`` is True (with ``strict=False`` a
    :class:`GovernorWarning` is issued and the run goes on ungoverned).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        slowdown: float = 0.05,
        power_budget_w: float | None = None,
        config: GovernorConfig | None = None,
        profile: GovernorProfile | str | os.PathLike[str] | None = None,
        workload: str = "default",
        autotune: bool = True,
        dry_run: bool = False,
        strict: bool = True,
        clock: Callable[[], float] = time.monotonic,
        tick_period_s: float = 0.05,
        handle_signals: bool = True,
        port: ClockPort | None = None,
    ) -> None:
        if config is None:
            config = GovernorConfig(slowdown=slowdown, power_budget_w=power_budget_w)
        if port is None:
            from ._sysfs import SysfsPort

            port = SysfsPort(root, clock=clock)
        loaded = profile if profile is None or isinstance(profile, GovernorProfile) else GovernorProfile.load(profile)
        self.strict = strict
        self.tick_period_s = tick_period_s
        self.handle_signals = handle_signals
        self._engine = GovernorEngine(
            port, config=config, profile=loaded, autotune=autotune, dry_run=dry_run, workload=workload
        )
        self._entered = False
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        self._signalled: int | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._phase_stack: list[Phase] = []
        self._lock = threading.RLock()

    @classmethod
    def simulated(cls, board: Any, **kwargs: Any) -> Governor:
        """A governor driving a :class:`hetsched._twin.sim.SimBoard` in virtual time (no files, no signals)."""
        kwargs.setdefault("handle_signals", False)
        return cls(port=SimPort(board), **kwargs)

    # -- properties -----------------------------------------------------------------

    @property
    def engine(self) -> GovernorEngine:
        return self._engine

    @property
    def config(self) -> GovernorConfig:
        return self._engine.config

    @property
    def current_phase(self) -> Phase | None:
        return self._engine.phase

    def profile(self) -> GovernorProfile:
        """What auto-tune learned so far (save it with ``.save(path)``)."""
        return self._engine.profile()

    def statistics(self) -> GovernorStatistics:
        return self._engine.statistics()

    # -- phase switching ------------------------------------------------------------------

    def on_phase(self, phase: Phase | str) -> None:
        """The program enters ``phase`` (the hook a Session or hetsched.train calls).

        Cheap and non-blocking (sysfs writes only when a target changes); safe to call
        from any thread.

        :raises RuntimeStateError: the governor is not entered (or already closed).
        :raises SysfsPermissionError: a write was refused and ``strict`` is True.
        :raises GovernorError: ``phase`` is not a :class:`Phase` name.
        """
        phase = as_phase(phase)
        if not self._entered or self._closed:
            raise RuntimeStateError("Governor.on_phase outside 'with Governor(...)' / 'async with Governor(...)'")
        self._guarded(self._engine.enter, phase)

    @contextmanager
    def phase(self, phase: Phase | str) -> Iterator[None]:
        """``with gov.phase(Phase.BACKWARD): ...``: ``phase`` for the block.

        A block nested in another ``phase()`` block gives the outer block its phase back
        when it ends; a top-level block leaves its phase on until the next switch (so a
        loop of blocks switches exactly once per block, with no spurious phase between).
        """
        phase = as_phase(phase)
        self.on_phase(phase)
        self._phase_stack.append(phase)
        try:
            yield
        finally:
            self._phase_stack.pop()
            if self._phase_stack and self._entered and not self._closed:
                self.on_phase(self._phase_stack[-1])

    def tick(self) -> None:
        """One telemetry tick (thermal guard) for callers driving the governor themselves."""
        if self._entered and not self._closed:
            self._guarded(self._engine.tick)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        # Session hooks may call from device worker threads while the ticker runs in the
        # event loop: one engine call at a time (each is short and never awaits).
        with self._lock:
            if self._closed:
                # A hook that raced the shutdown (it passed the entry check while the clocks
                # were being restored): writing now would undo the restore.
                return
            if self._engine.ungoverned:
                return  # strict=False after a permission error: hands off the board
            try:
                fn(*args)
            except SysfsPermissionError as exc:
                if self.strict:
                    raise
                self._fallback(exc)

    def _fallback(self, exc: SysfsPermissionError) -> None:
        warnings.warn(
            f"hetsched governor running ungoverned (strict=False): {exc}", GovernorWarning, stacklevel=4
        )
        with suppress(SysfsPermissionError):
            self._engine.close()
        self._engine.go_ungoverned(str(exc))

    # -- sync context manager ----------------------------------------------------------

    def _start(self) -> None:
        if self._entered:
            raise RuntimeStateError("this Governor is already entered; create a new one")
        if self._closed:
            raise RuntimeStateError("this Governor was closed; create a new one")
        try:
            self._engine.start()
        except SysfsPermissionError as exc:
            if self.strict:
                raise
            self._fallback(exc)
        self._entered = True

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with self._lock:
                self._engine.close()
        except SysfsPermissionError as exc:
            if self.strict:
                raise
            warnings.warn(f"hetsched governor could not restore every clock: {exc}", GovernorWarning, stacklevel=3)

    def __enter__(self) -> Governor:
        self._start()
        self._install_signal_handlers()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._finish()
        finally:
            self._uninstall_signal_handlers()

    def _install_signal_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            # Restore first, then behave like the default handler would.
            self._signalled = signum
            self._finish()
            raise _exit_for(signum)

        for sig in _SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _uninstall_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # -- async context manager ---------------------------------------------------------

    async def __aenter__(self) -> Governor:
        # Inside an event loop never block on a clock change: a domain that has not
        # followed yet is checked again at the next decision or tick.
        self._engine.port.settle_s = 0.0
        self._start()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            if self.handle_signals and threading.current_thread() is threading.main_thread():
                await tg.start(self._watch_signals)
            if self.tick_period_s > 0:
                tg.start_soon(self._ticker)
        except BaseException:
            tg.cancel_scope.cancel()
            try:
                # Shielded: an outer cancellation must not cut the wait for the helpers
                # short (they are cancelled already); the restore follows in any case.
                with anyio.CancelScope(shield=True):
                    await tg.__aexit__(None, None, None)
            finally:
                self._finish()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        tg.cancel_scope.cancel()
        try:
            if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
                # The body's own error: stop the helpers and let it propagate as it is
                # (not wrapped in an exception group by the helpers' task group).
                await tg.__aexit__(None, None, None)
                suppressed: bool | None = False
            else:
                suppressed = await tg.__aexit__(exc_type, exc, tb)
        finally:
            # Synchronous (no checkpoint), so a cancellation cannot interrupt the restore.
            self._finish()
        if self._signalled is not None:
            raise _exit_for(self._signalled)
        return suppressed

    async def _ticker(self) -> None:
        while True:
            await anyio.sleep(self.tick_period_s)
            self.tick()

    async def _watch_signals(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(*_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                log.warning("governor: signal %d: restoring clocks", signum)
                self._signalled = int(signum)
                self._finish()  # synchronous: nothing to shield
                assert self._tg is not None
                self._tg.cancel_scope.cancel()
                return
