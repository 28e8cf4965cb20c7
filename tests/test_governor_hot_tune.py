"""Auto-tune started on a board already at its hot thermal steady state (hetsched issue 13).

On such a board the thermal guard holds the board back for good, and tuning used to wait for
that to end: it never did, no phase was ever tuned. The simulated boards run in virtual time
(the board's own clock); nothing here depends on wall time.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hetsched import Governor, GovernorConfig, Phase, PhaseWork, SimBoard
from hetsched._governor import OperatingPoint, PhaseModel, Tuner, TunerConfig
from hetsched._governor._meter import PhaseLedger
from hetsched._governor._model import Measurement
from hetsched._governor._tuning import PhaseTuning

from _governor_fakes import additive_table, domains, make_tuner

M, G = 1e6, 1e9
TICK_S = 0.05
AMBIENT_C = 45.0  # an edge box in a closed enclosure: `performance` throttles here at steady state
WARM_S = 240.0  # past the heatsinks' time constants: the hot steady state
MAX_ITERATIONS = 1000
"""The bound on training iterations a tune on the hot board may take (it takes about half)."""

Step = tuple[Phase, PhaseWork]

# The training loop of benchmarks/_governor_cases.py: DataLoader on the CPUs, a GPU-bound
# forward, a memory-bound backward, a short optimizer step.
TRAIN: dict[str, list[Step]] = {
    "rk3588": [
        (Phase.DATA, PhaseWork({"cluster0": 50 * M, "cluster4": 70 * M, "cluster6": 70 * M}, 0.3 * G, overlap=0.9)),
        (Phase.FORWARD, PhaseWork({"gpu": 90 * M, "cluster0": 70 * M, "cluster4": 110 * M, "cluster6": 110 * M},
                                  1.2 * G, overlap=0.85)),
        (Phase.BACKWARD, PhaseWork({"gpu": 110 * M, "cluster0": 120 * M, "cluster4": 200 * M, "cluster6": 200 * M},
                                   4.2 * G, overlap=0.85)),
        (Phase.OPTIMIZER_STEP, PhaseWork({"gpu": 6 * M, "cluster4": 10 * M}, 0.5 * G, fixed_s=0.008, overlap=0.9)),
    ],
    "orin-nx": [
        (Phase.DATA, PhaseWork({"cluster0": 50 * M, "cluster4": 50 * M}, 0.3 * G, overlap=0.9)),
        (Phase.FORWARD, PhaseWork({"gpu": 75 * M, "cluster0": 75 * M, "cluster4": 85 * M}, 3.0 * G, overlap=0.85)),
        (Phase.BACKWARD, PhaseWork({"gpu": 95 * M, "cluster0": 140 * M, "cluster4": 160 * M}, 11.0 * G,
                                   overlap=0.85)),
        (Phase.OPTIMIZER_STEP, PhaseWork({"gpu": 5 * M, "cluster0": 10 * M}, 1.5 * G, fixed_s=0.006, overlap=0.9)),
    ],
}


def run(board: SimBoard, steps: Sequence[Step], gov: Governor | None, iterations: int) -> None:
    tick = None if gov is None else (lambda b: gov.tick())
    for _ in range(iterations):
        for phase, work in steps:
            if gov is not None:
                gov.on_phase(phase)
            board.execute(work, tick_s=TICK_S, on_tick=tick)


def hot_board(soc: str) -> SimBoard:
    """A board in service: run under its booted kernel governors to the hot steady state."""
    board = SimBoard(soc, ambient_c=AMBIENT_C, seed=2)
    while board.time_s < WARM_S:
        run(board, TRAIN[soc], None, 10)
    return board


@pytest.mark.parametrize("soc", ["orin-nx", "rk3588"])
def test_auto_tune_on_a_hot_board_finishes_without_extra_throttling(soc: str) -> None:
    steps = TRAIN[soc]
    config = GovernorConfig(slowdown=0.04)

    board = hot_board(soc)
    st0 = board.statistics()
    iterations = 0
    with Governor.simulated(board, config=config, autotune=True) as gov:
        while iterations == 0 or not gov.engine.tuning_done:  # done is vacuous before any phase
            run(board, steps, gov, 1)
            iterations += 1
            assert iterations <= MAX_ITERATIONS, gov.statistics().phases
        stats = gov.statistics()
    tuned_events = board.statistics().throttle_events - st0.throttle_events
    tuned_throttled_s = board.statistics().throttled_time_s - st0.throttled_time_s

    # The premise: the guard held the board back while it was tuned (what used to stall it).
    assert stats.capped_decisions > 0
    for phase, _ in steps:
        ph = stats.phases[phase]
        assert ph.tuned or ph.untunable, (phase, ph)
    assert Phase.BACKWARD in stats.tuned_phases  # the long phase, that sets the board's heat
    assert stats.tuning_cut_short == ()  # finished by converging, not by the effort bound

    # The same window on the same hot board under the governor without auto-tune.
    board = hot_board(soc)
    st0 = board.statistics()
    with Governor.simulated(board, config=config, autotune=False) as gov:
        run(board, steps, gov, iterations)
    untuned_events = board.statistics().throttle_events - st0.throttle_events
    untuned_throttled_s = board.statistics().throttled_time_s - st0.throttled_time_s
    assert tuned_events <= untuned_events
    assert tuned_throttled_s <= untuned_throttled_s + 1e-9


# -- the effort bound ------------------------------------------------------------------

CYCLES = {Phase.BACKWARD: {"gpu": 0.10e9, "memory": 0.40e9, "cluster0": 0.01e9}}
WATTS = {"cluster0": 1.0, "gpu": 6.0, "memory": 1.2}


def test_a_tuner_at_its_measurement_limit_ends_on_the_best_point_measured() -> None:
    table = additive_table(CYCLES, WATTS, static_w=2.0, fixed_s=0.002)
    specs = domains()
    tuner = make_tuner(specs, ["gpu", "memory"], slowdown=0.05, max_measurements=9)
    assert tuner.measurement_limit == 9
    measured: dict[OperatingPoint, Measurement] = {}
    while (pt := tuner.propose()) is not None:
        f = {d: s.max_hz for d, s in specs.items()}
        f.update(pt.as_dict())
        m = Measurement(*table(Phase.BACKWARD, f))
        tuner.record(pt, m)
        measured[pt] = m
        assert tuner.statistics().measurements <= 9
    st = tuner.statistics()
    assert (st.measurements, st.done, st.cut_short, st.measurement_limit) == (9, True, True, 9)
    model = tuner.model()
    assert model is not None and model.best in measured
    # The least energy among the points measured within the bound (the top clocks' time + 5 %).
    ref = min(m.seconds for p, m in measured.items() if p == OperatingPoint.of({"gpu": specs["gpu"].max_hz,
                                                                                "memory": specs["memory"].max_hz}))
    within = {p: m for p, m in measured.items() if m.seconds <= ref * 1.05}
    assert model.best == min(within, key=lambda p: within[p].energy_j)


def test_a_tuner_left_alone_takes_its_natural_limit_and_stops_short_of_it() -> None:
    table = additive_table(CYCLES, WATTS, static_w=2.0, fixed_s=0.002)
    specs = domains()
    tuner = make_tuner(specs, ["gpu", "memory", "cluster0"], slowdown=0.05)
    n = 0
    while (pt := tuner.propose()) is not None:
        f = {d: s.max_hz for d, s in specs.items()}
        f.update(pt.as_dict())
        tuner.record(pt, Measurement(*table(Phase.BACKWARD, f)))
        n += 1
    st = tuner.statistics()
    assert st.done and not st.cut_short
    assert n == st.measurements < st.measurement_limit


def test_finish_without_a_measured_centre_leaves_the_tuner_running() -> None:
    tuner = make_tuner(domains(), ["gpu"], slowdown=0.05)
    assert tuner.finish() is False
    assert not tuner.done and tuner.propose() is not None


def _tuning_started() -> tuple[PhaseTuning, Tuner, dict[Phase, PhaseModel]]:
    book = PhaseLedger()
    for _ in range(3):
        book.record(Phase.BACKWARD, 0.5, 5.0)
    models: dict[Phase, PhaseModel] = {}
    tuning = PhaseTuning(models, book)
    tuning.start(Phase.BACKWARD, domains=domains(), locked=(), config=GovernorConfig(), dwell_s=None)
    tuner = tuning.tuners[Phase.BACKWARD]
    return tuning, tuner, models


def test_occurrences_that_never_measure_end_in_untunable_within_the_bound() -> None:
    tuning, tuner, _models = _tuning_started()
    bound = TunerConfig().occurrences_per_measurement * tuner.measurement_limit
    for _ in range(bound):
        assert tuning.propose(Phase.BACKWARD, hold=True) is None
        assert Phase.BACKWARD in tuning.tuners
    assert tuning.held == bound
    assert tuning.propose(Phase.BACKWARD, hold=True) is None
    assert Phase.BACKWARD not in tuning.tuners
    assert Phase.BACKWARD in tuning.untunable and Phase.BACKWARD in tuning.cut_short


def test_occurrences_past_the_bound_end_on_what_was_measured() -> None:
    table = additive_table(CYCLES, WATTS, static_w=2.0, fixed_s=0.002)
    specs = domains()
    tuning, tuner, models = _tuning_started()
    bound = TunerConfig().occurrences_per_measurement * tuner.measurement_limit
    first = tuning.propose(Phase.BACKWARD)
    assert first is not None
    f = {d: s.max_hz for d, s in specs.items()}
    f.update(first.as_dict())
    tuner.record(first, Measurement(*table(Phase.BACKWARD, f)))
    for _ in range(bound - 1):
        tuning.propose(Phase.BACKWARD, hold=True)  # a zone near its trip: nothing measured
    assert Phase.BACKWARD in tuning.tuners
    assert tuning.propose(Phase.BACKWARD) is None
    assert Phase.BACKWARD in tuning.cut_short and Phase.BACKWARD not in tuning.untunable
    model = models[Phase.BACKWARD]
    assert model.best == first and tuner.statistics().cut_short
