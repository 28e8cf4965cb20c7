"""Auto-tune, hysteresis, power cap and thermal guard on a table-driven fake board."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest

from hetsched._governor import (
    AxisTuner,
    DomainSpec,
    GovernorConfig,
    GovernorEngine,
    GovernorProfile,
    OperatingPoint,
    Phase,
    PhaseModel,
    Tuner,
    TunerSettings,
    TunerStatistics,
    axis_tuner,
)
from hetsched._governor._model import Measurement

from _governor_fakes import TableBoard, additive_table, domains, make_tuner

MHZ = 1_000_000

# Forward: GPU-bound; backward: memory-bound with some GPU; data: CPU; optimizer: short, CPU.
CYCLES = {
    Phase.DATA: {"cluster0": 0.10e9},
    Phase.FORWARD: {"gpu": 0.20e9, "memory": 0.05e9, "cluster0": 0.01e9},
    Phase.BACKWARD: {"gpu": 0.10e9, "memory": 0.40e9, "cluster0": 0.01e9},
    Phase.OPTIMIZER_STEP: {"cluster0": 0.02e9},
}
WATTS = {"cluster0": 1.0, "gpu": 6.0, "memory": 1.2}
TRAIN = (Phase.DATA, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP)


def table():  # type: ignore[no-untyped-def]
    return additive_table(CYCLES, WATTS, static_w=2.0, fixed_s=0.002)


def brute_force(phase: Phase, tune: list[str], slowdown: float, cap: float | None = None) -> OperatingPoint:
    """The planted optimum: least energy per unit within the bound, by exhaustive search."""
    t = table()
    specs = domains()
    fixed_others = {d: specs[d].max_hz for d in specs}
    ref = t(phase, fixed_others)[0]
    best: tuple[float, OperatingPoint] | None = None
    for combo in itertools.product(*[specs[d].available_hz for d in tune]):
        f = dict(fixed_others)
        f.update(zip(tune, combo, strict=True))
        secs, watts = t(phase, f)
        if secs > ref * (1 + slowdown) + 1e-12 or (cap is not None and watts > cap):
            continue
        e = secs * watts
        if best is None or e < best[0] - 1e-12:
            best = (e, OperatingPoint.of(dict(zip(tune, combo, strict=True))))
    assert best is not None
    return best[1]


def drive(tuner: Tuner, phase: Phase, others: Mapping[str, int]) -> int:
    t = table()
    n = 0
    while (pt := tuner.propose()) is not None:
        f = dict(others)
        f.update(pt.as_dict())
        secs, watts = t(phase, f)
        tuner.record(pt, Measurement(secs, watts))
        n += 1
        assert n < 500
    return n


@pytest.mark.parametrize("phase", [Phase.FORWARD, Phase.BACKWARD])
def test_auto_tune_finds_the_planted_optimum(phase: Phase) -> None:
    specs = domains()
    tune = ["cluster0", "gpu", "memory"]
    planted = brute_force(phase, tune, 0.10)
    assert planted not in (OperatingPoint.of({d: specs[d].max_hz for d in tune}),
                           OperatingPoint.of({d: specs[d].min_hz for d in tune}))
    tuner = make_tuner(specs, tune, slowdown=0.10, repeats=1)
    n = drive(tuner, phase, {})
    model = tuner.model()
    assert model is not None and model.best == planted
    # coordinate descent, not the product: far fewer runs than the 5*8*4 = 160 combinations
    assert n < 40
    assert model.reference_s == pytest.approx(table()(phase, {d: specs[d].max_hz for d in specs})[0])


@pytest.mark.parametrize("phase", [Phase.FORWARD, Phase.BACKWARD])
def test_auto_tune_removes_the_drift_of_a_warming_board(phase: Phase) -> None:
    # Leakage grows as the board warms under the sweep: every run draws 0.4 W more than
    # the one before. Measured in sweep order, later (lower-clock) points would look dearer.
    specs = domains()
    tune = ["cluster0", "gpu", "memory"]
    planted = brute_force(phase, tune, 0.10)
    t = table()
    tuner = make_tuner(specs, tune, slowdown=0.10, repeats=1)
    n = 0
    while (pt := tuner.propose()) is not None:
        secs, watts = t(phase, pt.as_dict())
        tuner.record(pt, Measurement(secs, watts + 0.4 * n))
        n += 1
        assert n < 500
    model = tuner.model()
    assert model is not None and model.best == planted


def test_auto_tune_under_a_power_cap_never_measures_over_it() -> None:
    specs = domains()
    tune = ["cluster0", "gpu", "memory"]
    cap = 6.0
    seen: list[float] = []
    t = table()
    tuner = make_tuner(specs, tune, slowdown=0.05, power_cap_w=cap, repeats=1)
    while (pt := tuner.propose()) is not None:
        secs, watts = t(Phase.FORWARD, pt.as_dict())
        seen.append(watts)
        tuner.record(pt, Measurement(secs, watts))
    model = tuner.model()
    assert model is not None and model.best is not None
    assert max(seen) <= cap
    # the fastest point within the cap (5 % of max is out of reach under it)
    fastest = min(
        (OperatingPoint.of(dict(zip(tune, c, strict=True))) for c in itertools.product(*[specs[d].available_hz for d in tune])
         if t(Phase.FORWARD, dict(zip(tune, c, strict=True)))[1] <= cap),
        key=lambda p: t(Phase.FORWARD, p.as_dict())[0],
    )
    # Points not measured yet are tried only with a margin under the cap (their power is a
    # bound, not a measurement), so the last few percent of it stay unexplored.
    assert t(Phase.FORWARD, model.best.as_dict())[0] <= t(Phase.FORWARD, fastest.as_dict())[0] * 1.06


def run_training(board: TableBoard, engine: GovernorEngine, iterations: int) -> tuple[float, float]:
    t0 = board.t
    energy = 0.0
    for _ in range(iterations):
        for phase in TRAIN:
            energy += board.run(engine, phase)[1]
    return board.t - t0, energy


def test_engine_tunes_every_phase_online_then_saves_energy_within_the_bound() -> None:
    board = TableBoard(table())
    cfg = GovernorConfig(slowdown=0.05, tune_repeats=1)
    engine = GovernorEngine(board, config=cfg, workload="fake-train")
    engine.start()
    run_training(board, engine, 250)
    st = engine.statistics()
    assert set(st.tuned_phases) == set(TRAIN)
    # optimizer step (~22 ms) is too short for the GPU (5 ms) and EMC (8 ms): only the CPU was tuned
    assert set(engine.models()[Phase.OPTIMIZER_STEP].center) == {"cluster0"}
    assert set(engine.models()[Phase.FORWARD].center) == {"cluster0", "gpu", "memory"}
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        assert engine.models()[phase].best == brute_force(phase, ["cluster0", "gpu", "memory"], 0.05)
    gov_t, gov_e = run_training(board, engine, 20)
    engine.close()

    perf = TableBoard(table())
    perf.freq = {n: s.max_hz for n, s in perf.specs.items()}
    perf_t = perf_e = 0.0
    for _ in range(20):
        for phase in TRAIN:
            secs, watts = table()(phase, perf.freq)
            perf_t += secs
            perf_e += secs * watts
    assert gov_t <= perf_t * 1.05 + 20 * 4 * 0.001  # plus the fake's tick rounding
    assert gov_e < perf_e * 0.9


def test_profile_saved_and_reloaded_skips_tuning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    board = TableBoard(table())
    engine = GovernorEngine(board, config=GovernorConfig(tune_repeats=1), workload="fake-train")
    engine.start()
    run_training(board, engine, 250)
    engine.profile().save(tmp_path / "fake.json")
    engine.close()

    board2 = TableBoard(table())
    prof = GovernorProfile.load(tmp_path / "fake.json", board=engine.board)
    engine2 = GovernorEngine(board2, config=GovernorConfig(), profile=prof)
    engine2.start()
    run_training(board2, engine2, 3)
    st = engine2.statistics()
    assert st.tuning_measurements == 0 and set(st.tuned_phases) == set(TRAIN)
    assert board2.freq["gpu"] == engine.models()[Phase.OPTIMIZER_STEP].center.get("gpu", board2.freq["gpu"])


def test_hysteresis_short_phases_write_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A profile wants very different clocks for FORWARD and BACKWARD ...
    board = TableBoard(table())
    engine = GovernorEngine(board, config=GovernorConfig(tune_repeats=1), workload="w")
    engine.start()
    run_training(board, engine, 250)
    prof = engine.profile()
    engine.close()
    fwd, bwd = prof.phases[Phase.FORWARD].best, prof.phases[Phase.BACKWARD].best
    assert fwd is not None and bwd is not None and fwd != bwd

    # ... but here the phases last ~0.1 ms: shorter than 4x every domain's latency.
    tiny = TableBoard(additive_table({p: {d: c * 2e-4 for d, c in cyc.items()} for p, cyc in CYCLES.items()}, WATTS))
    eng = GovernorEngine(tiny, config=GovernorConfig(), profile=prof)
    eng.start()
    tiny.writes.clear()
    for _ in range(3):
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            tiny.run(eng, phase, tick_s=1e-5)
    # No phase can switch any domain, so the loop's longest phase sets them for the whole
    # loop (held domains): a few writes while the first cycles show which phase that is ...
    assert 0 < len(tiny.writes) <= 3 * len(fwd)
    tiny.writes.clear()
    for _ in range(50):
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            tiny.run(eng, phase, tick_s=1e-5)
    # ... and then nothing is written per phase.
    assert tiny.writes == []
    assert eng.statistics().writes_avoided > 0

    # Long phases do switch, and unchanged targets write nothing: one write per change.
    long = TableBoard(table())
    eng = GovernorEngine(long, config=GovernorConfig(), profile=prof)
    eng.start()
    for _ in range(3):
        for phase in (Phase.FORWARD, Phase.BACKWARD):
            long.run(eng, phase)
    changed = {d for d in fwd if fwd[d] != bwd[d]}
    assert changed and {d for _, d, _ in long.writes} <= changed | {d for d in fwd}
    per_cycle = [w for w in long.writes if w[0] > 0.5]
    assert len(per_cycle) <= 2 * len(changed) * 2  # at most one write per changed domain per phase switch


def test_power_budget_is_never_exceeded_tuning_included() -> None:
    budget = 8.0
    board = TableBoard(table())
    board.freq = {n: s.min_hz for n, s in board.specs.items()}
    # Strict (no guarded probes, the default): not even tuning runs over it.
    engine = GovernorEngine(board, config=GovernorConfig(power_budget_w=budget, tune_repeats=1, guarded_probes=False))
    engine.start()
    run_training(board, engine, 300)
    assert set(engine.statistics().tuned_phases) == set(TRAIN)
    assert max(board.power_trace) <= budget
    # and the budget is used, not wasted: the GPU-bound phase runs near it
    fwd = table()(Phase.FORWARD, board.freq)
    assert max(board.power_trace) > 0.7 * budget
    del fwd


def _hot_table():  # type: ignore[no-untyped-def]
    return additive_table(CYCLES, {"cluster0": 2.0, "gpu": 9.0, "memory": 1.5}, static_w=3.0, fixed_s=0.002)


def test_thermal_guard_keeps_the_zone_below_its_trip() -> None:
    trip = 70.0
    # Ungoverned at max clocks, this workload heats the zone past the trip.
    hot = TableBoard(_hot_table(), passive_trip_c=trip)
    hot.freq = {n: s.max_hz for n, s in hot.specs.items()}
    for _ in range(600):
        for phase in TRAIN:
            secs, watts = _hot_table()(phase, hot.freq)
            hot.advance(secs, watts, None, tick_s=0.05)
    assert hot.max_temp > trip + 5

    board = TableBoard(_hot_table(), passive_trip_c=trip)
    board.freq = {n: s.max_hz for n, s in board.specs.items()}
    engine = GovernorEngine(board, config=GovernorConfig(tune_repeats=1, thermal_margin_c=3.0))
    engine.start()
    run_training(board, engine, 600)
    st = engine.statistics()
    assert board.max_temp < trip
    assert st.capped_decisions > 0 and st.thermal_zone == "soc"
    assert board.t > 300  # long enough to have reached the trip ungoverned


class CountingTuner:
    """A tuner of its own behind the :class:`Tuner` seam: it wraps the axis tuner and counts
    what the engine asks of it (only the protocol's members exist here)."""

    def __init__(self, inner: Tuner, calls: dict[str, int]) -> None:
        self._inner = inner
        self.calls = calls

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def propose(self) -> OperatingPoint | None:
        self._count("propose")
        return self._inner.propose()

    def record(self, point: OperatingPoint, measurement: Measurement) -> None:
        self._count("record")
        self._inner.record(point, measurement)

    def reject(self, point: OperatingPoint, power_w: float) -> None:
        self._inner.reject(point, power_w)

    def guarded(self, point: OperatingPoint) -> bool:
        return self._inner.guarded(point)

    def finish(self) -> bool:
        return self._inner.finish()

    def model(self) -> PhaseModel | None:
        return self._inner.model()

    def measured(self) -> list[tuple[OperatingPoint, Measurement]]:
        return self._inner.measured()

    @property
    def center(self) -> OperatingPoint:
        return self._inner.center

    @property
    def measurement_limit(self) -> int:
        return self._inner.measurement_limit

    @property
    def cut_short(self) -> bool:
        return self._inner.cut_short

    @property
    def domains(self) -> tuple[str, ...]:
        return self._inner.domains

    @property
    def done(self) -> bool:
        return self._inner.done

    def statistics(self) -> TunerStatistics:
        return self._inner.statistics()


def test_the_engine_drives_any_tuner_through_the_seam() -> None:
    made: list[TunerSettings] = []
    calls: dict[str, int] = {}

    def factory(domains: Mapping[str, DomainSpec], tune: Sequence[str], settings: TunerSettings) -> Tuner:
        made.append(settings)
        return CountingTuner(axis_tuner(domains, tune, settings), calls)

    assert isinstance(AxisTuner(domains(), ["gpu"], slowdown=0.05), Tuner)
    board = TableBoard(table())
    cfg = GovernorConfig(slowdown=0.05, tune_repeats=1, tune_levels=4)
    engine = GovernorEngine(board, config=cfg, workload="fake-train", tuner_factory=factory)
    engine.start()
    run_training(board, engine, 250)
    engine.close()
    assert set(engine.statistics().tuned_phases) == set(TRAIN)
    assert len(made) == len(TRAIN) and all(s.levels == 4 and s.repeats == 1 for s in made)
    assert calls["record"] > 0 and calls["propose"] >= calls["record"]
    for phase in (Phase.FORWARD, Phase.BACKWARD):  # the same optimum as without the wrapper
        assert engine.models()[phase].best == brute_force(phase, ["cluster0", "gpu", "memory"], 0.05)
