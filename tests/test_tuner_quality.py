"""Auto-tune scored against boards whose optimum it does not know (hetsched.testing.TableBoard).

Each phase is a function of the clocks with the coupling of a real SoC (domains working
concurrently or serially, dynamic energy spread over the phase's time, stall power,
leakage); the exhaustive search over every combination is the ground truth.
"""

from __future__ import annotations

import itertools

import pytest

from hetsched._governor import DomainSpec, OperatingPoint
from hetsched._governor._model import Measurement
from hetsched.testing import TableBoard, coupled_phase, loop_measure, tune_on

from _governor_fakes import make_tuner

M = 1_000_000
SPECS = {
    "cpu": DomainSpec("cpu", "cpu", tuple(f * M for f in (400, 600, 800, 1000, 1200, 1400, 1600, 1800)), 1e-4),
    "gpu": DomainSpec("gpu", "gpu", tuple(f * M for f in (300, 450, 600, 750, 900, 1050, 1200)), 5e-3),
    "memory": DomainSpec("memory", "memory", tuple(f * M for f in (500, 1000, 1500, 2000, 2500, 3000)), 8e-3),
}
REF = {d: s.max_hz for d, s in SPECS.items()}
PHASES = {
    # serial work, power set by the clocks alone: what the separable model assumes
    "separable": coupled_phase({"cpu": 0.004, "gpu": 0.010, "memory": 0.006}, {"cpu": 1.5, "gpu": 6.0, "memory": 2.0},
                               ref_hz=REF, overlap=0.0, static_w=2.0),
    # concurrent GPU-bound work with stall power and leakage: lowering one clock changes the others' utilisation
    "coupled_gpu": coupled_phase({"cpu": 0.003, "gpu": 0.012, "memory": 0.007}, {"cpu": 1.5, "gpu": 7.0, "memory": 2.5},
                                 ref_hz=REF, overlap=0.9, static_w=2.0, stall_share=0.3, leak_w={"gpu": 0.8, "cpu": 0.3}),
    # memory-bound, fully overlapped: the core clocks buy nothing until they become the bottleneck
    "coupled_mem": coupled_phase({"cpu": 0.003, "gpu": 0.006, "memory": 0.012}, {"cpu": 1.5, "gpu": 7.0, "memory": 3.0},
                                 ref_hz=REF, overlap=1.0, static_w=1.5, stall_share=0.4, leak_w={"gpu": 0.8}),
    # balanced work, weak voltage scaling, high static power: a flat optimum near the top
    "flat": coupled_phase({"cpu": 0.008, "gpu": 0.008, "memory": 0.008}, {"cpu": 1.0, "gpu": 2.0, "memory": 1.0},
                          ref_hz=REF, overlap=0.6, static_w=4.0, exponent=1.3),
    # steep voltage scaling, little static power: a sharp optimum inside the table
    "sharp": coupled_phase({"cpu": 0.010, "gpu": 0.004, "memory": 0.003}, {"cpu": 4.0, "gpu": 3.0, "memory": 1.0},
                           ref_hz=REF, overlap=0.8, static_w=0.5, exponent=3.0, stall_share=0.2),
}


def board() -> TableBoard:
    return TableBoard(SPECS, PHASES)


def tuned(b: TableBoard, phase: str, slowdown: float, cap: float | None = None) -> OperatingPoint:
    tuner = make_tuner(SPECS, list(SPECS), slowdown=slowdown, power_cap_w=cap, repeats=1)
    runs = tune_on(b, phase, tuner)
    assert runs < 60  # coordinate descent, not the 8*7*6 = 336 combinations
    model = tuner.model()
    assert model is not None and model.best is not None
    return model.best


@pytest.mark.parametrize("slowdown", [0.05, 0.20])
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_tuned_point_is_within_3_percent_of_the_exhaustive_best_energy(phase: str, slowdown: float) -> None:
    b = board()
    opt = b.exhaustive(phase, slowdown=slowdown)
    got = b.measure(phase, tuned(b, phase, slowdown))
    assert got.seconds <= opt.reference.seconds * (1 + slowdown) * (1 + 1e-9)
    assert got.energy_j <= opt.measurement.energy_j * 1.03


def test_the_planted_optima_are_not_trivial() -> None:
    # The boards would not test anything if the answer were a corner of the table.
    b = board()
    inner = [p for p in PHASES if b.exhaustive(p, slowdown=0.20).point not in (b.top(), OperatingPoint.of(
        {d: s.min_hz for d, s in SPECS.items()}))]
    assert len(inner) >= 3


def _best_static_loop(b: TableBoard, slowdown: float) -> Measurement:
    names = list(SPECS)
    ref = loop_measure(b, {p: b.top() for p in PHASES}, list(PHASES))
    best: Measurement | None = None
    for combo in itertools.product(*[SPECS[d].available_hz for d in names]):
        pt = OperatingPoint.of(dict(zip(names, combo, strict=True)))
        m = loop_measure(b, {p: pt for p in PHASES}, list(PHASES))
        if m.seconds <= ref.seconds * (1 + slowdown) and (best is None or m.energy_j < best.energy_j):
            best = m
    assert best is not None
    return best


@pytest.mark.parametrize("slowdown", [0.05, 0.20])
def test_per_phase_schedule_is_never_worse_than_the_best_static_point(slowdown: float) -> None:
    b = board()
    schedule = {p: tuned(b, p, slowdown) for p in PHASES}
    loop = loop_measure(b, schedule, list(PHASES))
    ref = loop_measure(b, {p: b.top() for p in PHASES}, list(PHASES))
    static = _best_static_loop(b, slowdown)
    assert loop.seconds <= ref.seconds * (1 + slowdown) * (1 + 1e-9)
    assert loop.energy_j <= static.energy_j


@pytest.mark.parametrize("cap", [5.0, 8.0])
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_under_a_power_cap_tuning_never_measures_over_it(phase: str, cap: float) -> None:
    b = board()
    tuner = make_tuner(SPECS, list(SPECS), slowdown=0.05, power_cap_w=cap, repeats=1)
    seen: list[float] = []
    while (pt := tuner.propose()) is not None:
        m = b.measure(phase, pt)
        seen.append(m.power_w)
        tuner.record(pt, m)
    model = tuner.model()
    assert model is not None and model.best is not None
    assert max(seen) <= cap
    got = b.measure(phase, model.best)
    lowest = b.measure(phase, OperatingPoint.of({d: s.min_hz for d, s in SPECS.items()}))
    assert got.power_w <= cap and got.seconds < lowest.seconds


# Where the budget binds on a smooth trade the tuner climbs to the fastest point that fits;
# where the fastest point sits behind a cross-coupled ridge (coupled_gpu, flat at 5 W) its
# bounds on unmeasured points keep it lower (open, see the module docstring of _tuner).
@pytest.mark.parametrize(("phase", "cap"), [("separable", 8.0), ("flat", 8.0), ("sharp", 8.0), ("coupled_mem", 5.0)])
def test_under_a_power_cap_the_tuned_point_is_near_the_fastest_that_fits(phase: str, cap: float) -> None:
    b = board()
    opt = b.exhaustive(phase, power_cap_w=cap)
    got = b.measure(phase, tuned(b, phase, 0.05, cap))
    assert got.power_w <= cap
    assert got.seconds <= opt.measurement.seconds * 1.03


@pytest.mark.parametrize("slowdown", [0.05, 0.20])
def test_loop_allocation_spends_the_loop_bound_where_it_saves_most(slowdown: float) -> None:
    # Tuned per phase, every phase keeps within the bound of its own top-clock time; spent
    # over the loop, the same bound buys more (a memory-bound phase slows down almost free).
    from hetsched._governor import Phase
    from hetsched._governor._loop import allocate_loop

    b = board()
    names = sorted(PHASES)
    phases = [Phase.DATA, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER_STEP, Phase.PREPROCESS]
    models = {}
    for ph, name in zip(phases, names, strict=True):
        tuner = make_tuner(SPECS, list(SPECS), slowdown=slowdown, repeats=1)
        tune_on(b, name, tuner)
        models[ph] = tuner.model()
    per_phase = loop_measure(b, {n: models[p].best for p, n in zip(phases, names, strict=True)}, names)  # type: ignore[union-attr, misc]  # every phase was tuned: each has a model
    alloc = allocate_loop({p: m for p, m in models.items() if m is not None}, slowdown)
    joint = loop_measure(b, {n: alloc[p].point for p, n in zip(phases, names, strict=True)}, names)
    ref = loop_measure(b, {n: b.top() for n in names}, names)
    assert joint.energy_j < per_phase.energy_j
    # The allocated points are predicted, not measured: 1 % of the loop for model error.
    assert joint.seconds <= ref.seconds * (1 + slowdown) * 1.01


def _tune_capped(b: TableBoard, phase: str, cap: float, guarded: bool) -> tuple[float, list[tuple[bool, float]]]:
    """Tune under ``cap`` as the governor does (predictions under 96 %, measurements under
    99.5 % of it); the tuned point's seconds, and (guarded?, watts) of every run over 99.5 %."""
    tuner = make_tuner(SPECS, list(SPECS), slowdown=0.05, power_cap_w=cap * 0.96, measured_cap_w=cap * 0.995,
                       repeats=1, guarded=guarded)
    over = []
    while (pt := tuner.propose()) is not None:
        m = b.measure(phase, pt)
        if m.power_w > cap * 0.995:
            over.append((tuner.guarded(pt), m.power_w))
        tuner.record(pt, m)
    model = tuner.model()
    assert model is not None and model.best is not None
    got = b.measure(phase, model.best)
    assert got.power_w <= cap * 0.995
    return got.seconds, over


@pytest.mark.parametrize("cap", [5.0, 6.0, 8.0])
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_guarded_probes_end_no_slower_than_strict_bounds_and_only_they_cross_the_cap(phase: str, cap: float) -> None:
    b = board()
    strict_s, strict_over = _tune_capped(b, phase, cap, guarded=False)
    guarded_s, guarded_over = _tune_capped(b, phase, cap, guarded=True)
    assert strict_over == []
    # A run over the cap is always one the driver was told to watch (and stop at a reading over it).
    assert all(watched for watched, _ in guarded_over)
    assert guarded_s <= strict_s * 1.01


def test_guarded_probes_reach_the_fastest_points_that_fit_on_most_tables() -> None:
    b = board()
    ratios = []
    for phase in sorted(PHASES):
        for cap in (5.0, 6.0, 8.0):
            opt = b.exhaustive(phase, power_cap_w=cap).measurement.seconds
            ratios.append(opt / _tune_capped(b, phase, cap, guarded=True)[0])
    # The coupled tables keep some cases lower (a bottleneck the axes cannot show): the mean,
    # not every case, is near the exhaustive fastest.
    assert sum(ratios) / len(ratios) >= 0.88
    assert sum(r >= 0.97 for r in ratios) >= 7
