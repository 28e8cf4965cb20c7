"""The governor on sysfs trees: restore on every exit path, frequency lock, dry run, permissions."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from hetsched import SysfsPermissionError
from hetsched._governor import Governor, GovernorWarning, Phase
from hetsched._governor._sysfs import SysfsPort
from hetsched._platform._fs import SysfsRoot
from hetsched._twin.live import LiveTwin
from hetsched.testing import build_board_tree, dvfs_knobs


def knobs(root: Path) -> dict[str, bytes]:
    """Every knob the governor may touch, as raw bytes (absent ones simply missing)."""
    out = dvfs_knobs(root)
    assert out
    return out


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Live:
    """A live twin tree driven by hand: the 'kernel' applies writes whenever the port waits."""

    def __init__(self, soc: str, root: Path) -> None:
        self.twin = LiveTwin(soc, root, noise=False)
        self.root = self.twin.write_once()
        self.clock = Clock()

    def sleep(self, s: float) -> None:
        self.clock.t += s
        self.twin.advance(0.0)

    def port(self) -> SysfsPort:
        return SysfsPort(self.root, clock=self.clock, sleep=self.sleep)

    def governor(self, **kw: object) -> Governor:
        kw.setdefault("handle_signals", False)
        kw.setdefault("autotune", False)
        kw.setdefault("tick_period_s", 0)
        return Governor(port=self.port(), clock=self.clock, **kw)  # type: ignore[arg-type]

    def drive(self, gov: Governor, cycles: int = 3) -> None:
        for _ in range(cycles):
            for phase in (Phase.FORWARD, Phase.IDLE):
                gov.on_phase(phase)
                self.clock.t += 0.2
                self.twin.advance(0.2)


@pytest.fixture(params=["rk3588", "orin-nx"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Live:
    return Live(request.param, tmp_path)


def _changed_then_restored(live: Live, body: Callable[[Governor], None], **kw: object) -> Governor:
    before = knobs(live.root)
    gov = live.governor(**kw)
    seen: dict[str, dict[str, bytes]] = {}

    def run(g: Governor) -> None:
        live.drive(g)
        seen["during"] = knobs(live.root)
        body(g)

    with gov:
        run(gov)
    live.twin.advance(0.0)
    assert seen["during"] != before, "the governor never wrote anything"
    assert knobs(live.root) == before
    return gov


def test_restores_every_knob_on_normal_exit(live: Live) -> None:
    gov = _changed_then_restored(live, lambda g: None)
    st = gov.statistics()
    assert st.writes > 0 and st.restored and not st.locked_domains
    # Domains did follow the writes on the live twin (no false frequency lock).
    assert live.twin.statistics().writes_rejected == 0


def test_restores_every_knob_on_exception(live: Live) -> None:
    before = knobs(live.root)
    during = {}
    with pytest.raises(RuntimeError, match="diverged"), live.governor() as gov:
        live.drive(gov)
        during = knobs(live.root)
        raise RuntimeError("training diverged")
    live.twin.advance(0.0)
    assert during != before and knobs(live.root) == before


def test_restores_on_sigterm_and_reraises_as_exit(live: Live) -> None:
    before = knobs(live.root)
    old = signal.getsignal(signal.SIGTERM)
    gov = live.governor(handle_signals=True)
    with pytest.raises(SystemExit) as info, gov:
        live.drive(gov)
        assert knobs(live.root) != before
        os.kill(os.getpid(), signal.SIGTERM)
        live.drive(gov)  # not reached: the handler raises
    assert info.value.code == 128 + signal.SIGTERM
    live.twin.advance(0.0)
    assert knobs(live.root) == before
    assert signal.getsignal(signal.SIGTERM) is old


def test_restores_on_sigint_with_keyboard_interrupt(live: Live) -> None:
    before = knobs(live.root)
    gov = live.governor(handle_signals=True)
    with pytest.raises(KeyboardInterrupt), gov:
        live.drive(gov)
        os.kill(os.getpid(), signal.SIGINT)
    live.twin.advance(0.0)
    assert knobs(live.root) == before


@pytest.mark.anyio
async def test_restores_on_cancellation(live: Live) -> None:
    before = knobs(live.root)
    during = {}
    with anyio.CancelScope() as scope:
        async with live.governor() as gov:
            live.drive(gov)
            during = knobs(live.root)
            scope.cancel()
            await anyio.sleep(10)
    assert scope.cancelled_caught
    live.twin.advance(0.0)
    assert during != before and knobs(live.root) == before


@pytest.mark.anyio
async def test_restores_on_exception_async(live: Live) -> None:
    before = knobs(live.root)
    with pytest.raises(ValueError, match="bad batch"):
        async with live.governor(tick_period_s=0.001) as gov:
            live.drive(gov)
            await anyio.sleep(0.01)
            raise ValueError("bad batch")
    live.twin.advance(0.0)
    assert knobs(live.root) == before


@pytest.mark.anyio
async def test_restores_on_sigterm_async(live: Live) -> None:
    before = knobs(live.root)
    with pytest.raises(SystemExit) as info:
        async with live.governor(handle_signals=True) as gov:
            live.drive(gov)
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.sleep(10)
    assert info.value.code == 128 + signal.SIGTERM
    live.twin.advance(0.0)
    assert knobs(live.root) == before


def test_phase_context_manager_switches_and_returns(live: Live) -> None:
    with live.governor() as gov:
        with gov.phase(Phase.FORWARD):
            assert gov.current_phase is Phase.FORWARD
            with gov.phase(Phase.BACKWARD):
                # (mypy keeps the narrowing of the line above across the switch)
                assert gov.current_phase is Phase.BACKWARD  # type: ignore[comparison-overlap]
            assert gov.current_phase is Phase.FORWARD
        assert gov.current_phase is Phase.FORWARD  # top level: on until the next switch
        with gov.phase("data"):
            assert gov.current_phase is Phase.DATA
        assert gov.statistics().phase_switches == 4
    with pytest.raises(Exception, match="outside"):
        gov.on_phase(Phase.DATA)


# -- frequency lock ----------------------------------------------------------------------


def test_frequency_lock_is_detected_reported_and_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A static tree: the knob files take the writes, but nothing ever changes the
    # current frequency (as when nvpmodel re-applies its mode).
    root = build_board_tree(tmp_path, "rk3588")
    before = knobs(root)
    clock = Clock()

    def sleep(s: float) -> None:
        clock.t += s

    port = SysfsPort(root, clock=clock, sleep=sleep)
    writes: list[str] = []
    real_write = SysfsRoot.write_text

    def spy(self: SysfsRoot, rel: object, value: object) -> None:
        writes.append(str(rel))
        real_write(self, rel, value)  # type: ignore[arg-type]

    monkeypatch.setattr(SysfsRoot, "write_text", spy)
    gov = Governor(port=port, clock=clock, autotune=False, handle_signals=False, tick_period_s=0)
    with gov:
        # Phases held longer than the lock grace period (0.5 s), so an unfollowed write is
        # judged before the next phase supersedes it.
        for _ in range(6):
            for phase in (Phase.FORWARD, Phase.IDLE):
                gov.on_phase(phase)
                clock.t += 0.6
        st = gov.statistics()
        assert {"cluster0", "cluster4", "cluster6", "gpu"} <= set(st.locked_domains)
        n = len(writes)
        for _ in range(3):
            for phase in (Phase.FORWARD, Phase.IDLE):
                gov.on_phase(phase)
                clock.t += 0.2
        assert len(writes) == n, "locked domains must be left alone"
    assert knobs(root) == before


# -- dry run and permissions -----------------------------------------------------------------


def test_dry_run_decides_but_writes_nothing(live: Live) -> None:
    before = knobs(live.root)
    with live.governor(dry_run=True) as gov:
        live.drive(gov)
        assert knobs(live.root) == before
    st = gov.statistics()
    assert st.writes == 0 and st.dry_run
    assert any(d.writes for d in gov.engine.history)


def _deny_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def denied(self: SysfsRoot, rel: object, value: object) -> None:
        raise SysfsPermissionError(errno.EACCES, f"permission denied writing {rel}: run as root")

    monkeypatch.setattr(SysfsRoot, "write_text", denied)


def test_permission_error_is_raised_when_strict(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    _deny_writes(monkeypatch)
    with pytest.raises(SysfsPermissionError, match="permission denied"), live.governor() as gov:
        live.drive(gov)


def test_permission_error_warns_and_runs_ungoverned_when_not_strict(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    before = knobs(live.root)
    _deny_writes(monkeypatch)
    with pytest.warns(GovernorWarning, match="ungoverned"), live.governor(strict=False) as gov:
        live.drive(gov, cycles=5)
        assert gov.statistics().ungoverned
    assert knobs(live.root) == before


def test_real_root_governor_reads_board_through_discovery(tmp_path: Path) -> None:
    root = build_board_tree(tmp_path, "orin-nx")
    gov = Governor(root, autotune=False, handle_signals=False, clock=Clock())
    specs = gov.engine.domains
    assert set(specs) == {"cluster0", "cluster4", "gpu", "memory"}
    # nvpmodel's CPU floor (729.6 MHz) bounds what the governor will ask for
    assert specs["cluster0"].min_hz == 729_600_000
    assert gov.engine.board.soc == "orin-nx"


@pytest.mark.anyio
async def test_async_governor_beside_a_running_live_twin(tmp_path: Path) -> None:
    """As under a Session: the twin is a task in the same event loop and applies writes on its
    own schedule; the governor never blocks on it, finds no false frequency lock, restores."""
    async with LiveTwin("rk3588", tmp_path, noise=False, period_s=0.01, speed=1.0) as twin:
        await anyio.sleep(0.03)
        before = knobs(twin.root)
        async with Governor(tmp_path, autotune=False, handle_signals=False, tick_period_s=0.01) as gov:
            for _ in range(6):
                for phase in (Phase.PREPROCESS, Phase.INFER, Phase.IDLE):
                    gov.on_phase(phase)
                    await anyio.sleep(0.06)
            during = knobs(twin.root)
            st = gov.statistics()
        await anyio.sleep(0.05)
        after = knobs(twin.root)
    assert st.writes > 0 and not st.locked_domains
    assert during != before
    assert after == before
    assert twin.statistics().writes_rejected == 0


def test_clocks_applied_late_are_not_mistaken_for_a_lock(tmp_path: Path) -> None:
    # A live twin applies writes at its own pace (here every 0.2 s of board time), as a
    # driver or another process would: the governor must wait out its grace period.
    twin = LiveTwin("rk3588", tmp_path)
    twin.write_once()
    clock = Clock()
    port = SysfsPort(tmp_path, clock=clock, sleep=lambda s: None)
    port.settle_s = 0.0
    gov = Governor(port=port, clock=clock, autotune=False, handle_signals=False, tick_period_s=0)
    with gov:
        for i in range(40):
            gov.on_phase(Phase.FORWARD if i % 2 == 0 else Phase.IDLE)
            clock.t += 0.05
            if i % 4 == 3:
                twin.advance(0.2)
        assert gov.statistics().locked_domains == ()
        assert gov.statistics().writes > 0
