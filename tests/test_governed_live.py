"""A Session-paced governor on a twin tree (issue 13, end to end): few writes in steady state,
frequency lock reported on a tree whose writes never take effect, a dry run that logs every
decision and writes nothing, and a summary of what it did.

Board time is injected (the twin advances only when the test says so), so nothing depends on
how fast this host is.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hetsched._governor import Governor, GovernorConfig, Phase
from hetsched._session._governed import DWELL_S
from hetsched._twin.live import LiveTwin


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# A 30 fps camera loop: board seconds of each phase of one frame.
_FRAME = ((Phase.PREPROCESS, 0.002), (Phase.INFER, 0.006), (Phase.POSTPROCESS, 0.001), (Phase.IDLE, 0.024))


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "sys").rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _loop(gov: Governor, twin: LiveTwin | None, frames: int, clock: _Clock | None = None) -> None:
    """``frames`` frames of :data:`_FRAME`; a live ``twin`` advances by each phase's length (the
    GPU busy in INFER), so board time and the governor's clock are the twin's; else ``clock`` does."""
    for _ in range(frames):
        for phase, seconds in _FRAME:
            gov.on_phase(phase)
            if twin is not None:
                twin.report_utilisation("gpu", 1.0 if phase is Phase.INFER else 0.0)
                twin.advance(seconds)
            elif clock is not None:
                clock.t += seconds


def _governor(root: Path, clock: object, *, dwell: float | None, **kw: object) -> Governor:
    from hetsched._governor._sysfs import SysfsPort

    port = SysfsPort(root, clock=clock, sleep=lambda s: None)  # type: ignore[arg-type]
    port.settle_s = 0.0
    gov = Governor(port=port, handle_signals=False, tick_period_s=0, **kw)  # type: ignore[arg-type]
    gov.engine.dwell_s = dwell
    return gov


def _steady_writes(dwell: float | None, tmp_path: Path, *, autotune: bool) -> tuple[dict[str, float], Governor]:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    gov = _governor(tmp_path, lambda: twin.sim.time_s, dwell=dwell, autotune=autotune,
                    config=GovernorConfig(loop_deadline_s=0.03))
    with gov:
        frames = 0
        while autotune and Phase.INFER not in gov.engine.models() and frames < 600:
            _loop(gov, twin, 30)
            frames += 30
        _loop(gov, twin, 5)
        w0 = dict(gov.statistics().writes_by_domain)
        t0 = twin.sim.time_s
        _loop(gov, twin, 30)  # a board second of steady state
        st = gov.statistics()
        span = twin.sim.time_s - t0
        rates = {d: (n - w0.get(d, 0)) / span for d, n in st.writes_by_domain.items()}
    return rates, gov


def test_per_request_phases_do_not_storm_the_clocks(tmp_path: Path) -> None:
    # Without a dwell every frame writes the domains up for INFER and down for IDLE.
    storm, _ = _steady_writes(None, tmp_path / "storm", autotune=False)
    assert max(storm.values()) > 20
    calm, gov = _steady_writes(DWELL_S, tmp_path / "calm", autotune=True)
    assert gov.engine.tuning_done and Phase.INFER in gov.engine.models()
    assert max(calm.values(), default=0.0) <= 4.0, calm
    st = gov.statistics()
    # the owner (INFER) is the phase tuned; the short phases run at its clocks
    assert st.tuned_phases == (Phase.INFER,)
    assert st.phases[Phase.IDLE].clocks == st.phases[Phase.INFER].clocks


def test_static_tree_reports_every_domain_it_wrote_as_locked(tmp_path: Path) -> None:
    # ``hetsched twin SOC --once``: a snapshot nothing keeps live, so no write ever takes effect.
    LiveTwin("rk3588", tmp_path, noise=False).write_once()
    clock = _Clock()
    gov = _governor(tmp_path, clock, dwell=DWELL_S, autotune=False)
    with gov:
        _loop(gov, None, 120, clock)  # four seconds
        st = gov.statistics()
    written = set(st.writes_by_domain)
    assert len(written) >= 3
    assert set(st.locked_domains) == written


def test_a_live_tree_is_not_reported_locked(tmp_path: Path) -> None:
    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    gov = _governor(tmp_path, lambda: twin.sim.time_s, dwell=DWELL_S, autotune=False)
    with gov:
        _loop(gov, twin, 120)
        st = gov.statistics()
    assert st.writes > 0 and st.locked_domains == ()


def test_dry_run_logs_each_decision_and_writes_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    LiveTwin("rk3588", tmp_path, noise=False).write_once()
    before = _tree_bytes(tmp_path)
    clock = _Clock()
    gov = _governor(tmp_path, clock, dwell=DWELL_S, dry_run=True)
    with caplog.at_level(logging.INFO, logger="hetsched.governor"), gov:
        _loop(gov, None, 10, clock)
        st = gov.statistics()
    lines = [r.getMessage() for r in caplog.records if "dry run:" in r.getMessage()]
    assert st.writes == 0 and st.dry_run
    assert len(lines) == st.decisions_logged > 0
    # phase, domain, from -> to, why
    assert any(line.startswith("governor: dry run: infer: gpu ") and " -> " in line and "(untuned: top clocks)" in line
               for line in lines), lines
    assert _tree_bytes(tmp_path) == before


def test_summary_has_phases_clocks_temperatures_and_write_rates(tmp_path: Path) -> None:
    from hetsched._cli._run_governed import governor_summary

    twin = LiveTwin("rk3588", tmp_path, noise=False)
    twin.advance(0.0)
    gov = _governor(tmp_path, lambda: twin.sim.time_s, dwell=DWELL_S, autotune=False)
    with gov:
        _loop(gov, twin, 30)
        g = governor_summary(gov)
    assert set(g["phases"]) == {"preprocess", "infer", "postprocess", "idle"}
    infer = g["phases"]["infer"]
    assert infer["occurrences"] == 30 and infer["time_s"] == pytest.approx(30 * 0.006, rel=1e-6)
    assert infer["energy_j"] > 0 and infer["clocks_hz"]["gpu"] > 0
    assert g["elapsed_s"] == pytest.approx(30 * 0.033, rel=1e-6)
    assert g["writes"] == sum(g["writes_per_domain"].values()) > 0
    for d, n in g["writes_per_domain"].items():
        assert g["writes_per_domain_per_s"][d] == pytest.approx(n / g["elapsed_s"])
    assert g["peak_temp_c"] and all(20.0 < t < 120.0 for t in g["peak_temp_c"].values())
    assert g["locked_domains"] == []
