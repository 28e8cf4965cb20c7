"""The governor's pure parts on plain data: phases, points, model, choice, decision, thermal, advisor, profiles."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import MappingProxyType

import pytest

from hetsched import GovernorError, PowerBudgetError, ProfileError, UnsupportedFrequencyError
from hetsched._governor import (
    BatchMeasurement,
    BoardId,
    DecisionInput,
    DomainSpec,
    GovernorConfig,
    GovernorProfile,
    Measurement,
    OperatingPoint,
    Phase,
    PhaseModel,
    RCFit,
    advise_batch_size,
    choose,
    decide,
    max_point,
    min_point,
    zone_power_cap,
)
from hetsched._governor._thermal import ZoneWindow

from _governor_fakes import domains

MHZ = 1_000_000


# -- Phase ------------------------------------------------------------------------------


def test_phase_values_are_lowercase_names_and_docstring_shows_every_phase() -> None:
    assert [p.value for p in Phase] == [p.name.lower() for p in Phase]
    doc = Phase.__doc__ or ""
    for p in Phase:
        assert p.name in doc, p
    assert Phase("backward") is Phase.BACKWARD
    from hetsched._governor._phase import as_phase

    assert as_phase("infer") is Phase.INFER
    with pytest.raises(GovernorError, match="unknown phase 'sideways'; phases: data, forward"):
        as_phase("sideways")
    assert Phase.FORWARD.is_training and not Phase.FORWARD.is_inference
    assert Phase.INFER.is_inference and not Phase.IDLE.is_training and not Phase.IDLE.is_inference


# -- domains and points -------------------------------------------------------------------


def test_domain_spec_validates_and_navigates_its_table() -> None:
    d = DomainSpec("gpu", "gpu", (300 * MHZ, 600 * MHZ, 900 * MHZ), 5e-3)
    assert d.lower(600 * MHZ) == 300 * MHZ and d.lower(300 * MHZ) is None
    assert d.at_least(301 * MHZ) == 600 * MHZ and d.at_least(5e9) == 900 * MHZ
    with pytest.raises(UnsupportedFrequencyError, match="300000000 600000000 900000000"):
        d.check(400 * MHZ)
    with pytest.raises(UnsupportedFrequencyError, match="ascending"):
        DomainSpec("gpu", "gpu", (900, 300), 1e-3)
    with pytest.raises(UnsupportedFrequencyError):
        DomainSpec("gpu", "gpu", (), 1e-3)


def test_operating_point_is_hashable_and_validated() -> None:
    doms = domains()
    a = OperatingPoint.of({"gpu": 500 * MHZ, "memory": 1000 * MHZ})
    b = OperatingPoint.of([("memory", 1000 * MHZ), ("gpu", 500 * MHZ)])
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a.with_("gpu", 600 * MHZ)["gpu"] == 600 * MHZ and a["gpu"] == 500 * MHZ
    assert "gpu" in a and "npu" not in a and len(a) == 2
    assert max_point(doms)["gpu"] == 1000 * MHZ and min_point(doms)["memory"] == 500 * MHZ
    with pytest.raises(UnsupportedFrequencyError, match="unknown domain 'npu'"):
        OperatingPoint.of({"npu": 1}).validate(doms)
    with pytest.raises(UnsupportedFrequencyError, match="not available on gpu"):
        a.with_("gpu", 550 * MHZ).validate(doms)


# -- model and joint choice ------------------------------------------------------------------


def _model() -> PhaseModel:
    """gpu matters for time, memory barely; both cost power. Centre = max."""
    center = OperatingPoint.of({"gpu": 900 * MHZ, "memory": 2000 * MHZ})
    m = Measurement
    axes = {
        "gpu": {300 * MHZ: m(3.0, 4.0), 600 * MHZ: m(1.5, 6.0), 900 * MHZ: m(1.0, 10.0)},
        "memory": {500 * MHZ: m(1.04, 7.0), 1000 * MHZ: m(1.02, 8.0), 2000 * MHZ: m(1.0, 10.0)},
    }
    return PhaseModel(center, m(1.0, 10.0), MappingProxyType(axes), reference_s=1.0)


def test_separable_prediction_is_exact_on_axes_and_additive_off_them() -> None:
    model = _model()
    p = model.predict(OperatingPoint.of({"gpu": 600 * MHZ, "memory": 2000 * MHZ}))
    assert p == Measurement(1.5, 6.0)
    joint = model.predict(OperatingPoint.of({"gpu": 600 * MHZ, "memory": 500 * MHZ}))
    assert joint.seconds == pytest.approx(1.54) and joint.power_w == pytest.approx(3.0)
    # interpolation between measured frequencies
    assert model.predict(OperatingPoint.of({"gpu": 750 * MHZ})).seconds == pytest.approx(1.25)


def test_choose_minimises_energy_within_slowdown_jointly() -> None:
    model = _model()
    ch = choose(model, slowdown=0.05)
    # Only memory can move within 5 %: 500 MHz (+4 %) saves the most energy.
    assert ch.point == OperatingPoint.of({"gpu": 900 * MHZ, "memory": 500 * MHZ})
    assert ch.within_slowdown and ch.within_power
    loose = choose(model, slowdown=1.0)
    # energy: gpu600+mem500 = 1.54 * 3 = 4.62 J, the least of all combinations within 2x.
    assert loose.point == OperatingPoint.of({"gpu": 600 * MHZ, "memory": 500 * MHZ})


def test_choose_honours_power_cap_then_time() -> None:
    model = _model()
    ch = choose(model, slowdown=0.05, power_cap_w=6.5)
    assert ch.predicted.power_w <= 6.5 and ch.within_power and not ch.within_slowdown
    # the fastest point under 6.5 W
    assert ch.point == OperatingPoint.of({"gpu": 600 * MHZ, "memory": 2000 * MHZ})
    nothing = choose(model, slowdown=0.05, power_cap_w=0.5)
    assert not nothing.within_power
    assert nothing.point == OperatingPoint.of({"gpu": 300 * MHZ, "memory": 500 * MHZ})
    biased = choose(model, slowdown=0.05, power_cap_w=9.0, power_bias_w=2.0)
    assert biased.predicted.power_w + 2.0 <= 9.0


def test_choose_keeps_fixed_domains() -> None:
    ch = choose(_model(), slowdown=1.0, fixed={"memory": 2000 * MHZ})
    assert ch.point["memory"] == 2000 * MHZ and ch.point["gpu"] == 600 * MHZ


# -- decide --------------------------------------------------------------------------------


def _inp(**kw: object) -> DecisionInput:
    doms = domains()
    base: dict[str, object] = dict(
        phase=Phase.FORWARD,
        domains=doms,
        current={"cluster0": 2000 * MHZ, "gpu": 1000 * MHZ, "memory": 2000 * MHZ},
        config=GovernorConfig(),
        expected_phase_s=1.0,
    )
    base.update(kw)
    return DecisionInput(**base)  # type: ignore[arg-type]


def test_decide_idle_lowers_only_domains_worth_switching() -> None:
    d = decide(_inp(phase=Phase.IDLE, expected_phase_s=0.025, successor_expected_s=0.5))
    # 25 ms idle: worth it for the CPU (0.1 ms) and GPU (5 ms x 4 = 20 ms), not the EMC (8 ms x 4 = 32 ms).
    assert dict(d.writes) == {"cluster0": 400 * MHZ, "gpu": 300 * MHZ}
    assert decide(_inp(phase=Phase.IDLE, expected_phase_s=None)).writes == {}
    # the next phase (10 ms) could not raise the GPU again in time: idle leaves it
    d = decide(_inp(phase=Phase.IDLE, expected_phase_s=0.025, successor_expected_s=0.01))
    assert dict(d.writes) == {"cluster0": 400 * MHZ}
    assert decide(_inp(phase=Phase.IDLE, expected_phase_s=0.025, successor_expected_s=None)).writes == {}


def test_decide_tuned_point_and_no_write_when_unchanged() -> None:
    model = PhaseModel(
        OperatingPoint.of({"gpu": 1000 * MHZ}),
        Measurement(1.0, 10.0),
        MappingProxyType({"gpu": {1000 * MHZ: Measurement(1.0, 10.0), 500 * MHZ: Measurement(1.02, 6.0)}}),
        reference_s=1.0,
        best=OperatingPoint.of({"gpu": 500 * MHZ}),
    )
    d = decide(_inp(model=model))
    assert dict(d.writes) == {"gpu": 500 * MHZ} and d.reason == "tuned point"
    again = decide(_inp(model=model, current={"cluster0": 2000 * MHZ, "gpu": 500 * MHZ, "memory": 2000 * MHZ}))
    assert again.writes == {}
    # a phase too short for the GPU's latency: the GPU is not switched
    short = decide(_inp(model=model, expected_phase_s=0.004))
    assert short.writes == {}
    # ... unless the power cap needs it
    capped = decide(_inp(model=model, expected_phase_s=0.004, power_cap_w=7.0))
    assert dict(capped.writes) == {"gpu": 500 * MHZ} and "cap" in capped.reason
    locked = decide(_inp(model=model, locked=frozenset({"gpu"})))
    assert locked.writes == {}


def test_decide_untuned_runs_fast_unless_over_cap() -> None:
    assert decide(_inp()).writes == {}  # already at the top
    low = {"cluster0": 400 * MHZ, "gpu": 300 * MHZ, "memory": 500 * MHZ}
    # 25 ms: the CPU and GPU go to the top, the EMC (8 ms) is not worth switching
    assert dict(decide(_inp(current=low, expected_phase_s=0.025)).writes) == {"cluster0": 2000 * MHZ, "gpu": 1000 * MHZ}
    d = decide(_inp(power_cap_w=5.0, power_now_w=8.0))
    assert dict(d.writes) == {"cluster0": 1600 * MHZ, "gpu": 900 * MHZ, "memory": 1500 * MHZ}
    assert not d.within_cap


def test_decide_tuning_point_is_applied_verbatim() -> None:
    pt = OperatingPoint.of({"gpu": 300 * MHZ, "memory": 2000 * MHZ})
    d = decide(_inp(tuning_point=pt, expected_phase_s=None))
    assert dict(d.writes) == {"gpu": 300 * MHZ} and d.reason == "tuning"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(GovernorError, match=r"slowdown=-0\.1"):
        GovernorConfig(slowdown=-0.1)
    with pytest.raises(GovernorError, match="power_budget_w=0"):
        GovernorConfig(power_budget_w=0)
    assert GovernorConfig(power_budget_w=10.0, power_margin=0.1).budget_cap_w == pytest.approx(9.0)


# -- thermal --------------------------------------------------------------------------------


def _simulate_rc(powers: list[float], *, r: float, tau: float, amb: float, noise: float = 0.0) -> RCFit:
    import random

    rng = random.Random(1)
    temp = amb
    t = 0.0
    fit = RCFit.from_prior()
    win = ZoneWindow()
    for p in powers:
        for _ in range(100):  # 1 s of 10 ms samples
            t_inf = amb + r * p
            temp = t_inf + (temp - t_inf) * math.exp(-0.01 / tau)
            t += 0.01
            win = win.add(t, temp + rng.gauss(0, noise), p)
        s = win.summary()
        assert s is not None
        fit = fit.update(*s)
        win = ZoneWindow()
    return fit


def test_rc_fit_recovers_parameters_and_predicts() -> None:
    powers = [12.0] * 60 + [4.0] * 60 + [9.0] * 60 + [2.0] * 60
    fit = _simulate_rc(powers, r=5.0, tau=25.0, amb=30.0, noise=0.05)
    assert fit.usable
    assert fit.tau_s == pytest.approx(25.0, rel=0.15)
    assert fit.r_c_per_w == pytest.approx(5.0, rel=0.15)
    assert fit.ambient_c == pytest.approx(30.0, abs=2.0)
    # The cap keeps the prediction at the limit.
    cap = fit.power_cap(60.0, 70.0, 5.0)
    assert fit.predict(60.0, cap, 5.0) == pytest.approx(70.0, abs=1e-6)
    # Steady state: cap -> (limit - ambient) / R for a long horizon.
    assert fit.power_cap(60.0, 70.0, 1e4) == pytest.approx((70.0 - fit.ambient_c) / fit.r_c_per_w, rel=1e-3)


def test_zone_power_cap_takes_the_tightest_zone_and_reacts_without_a_fit() -> None:
    fit = _simulate_rc([10.0] * 40 + [3.0] * 40, r=4.0, tau=20.0, amb=25.0)
    cap, zone = zone_power_cap(
        {"a": fit, "b": fit}, {"a": 50.0, "b": 60.0}, {"a": 80.0, "b": 80.0},
        horizon_s=2.0, power_now_w=10.0, reactive_band_c=1.0,
    )
    assert zone == "b" and cap is not None and cap < fit.power_cap(50.0, 80.0, 2.0)
    cap2, zone2 = zone_power_cap({}, {"c": 79.5}, {"c": 80.0}, horizon_s=2.0, power_now_w=10.0, reactive_band_c=1.0)
    assert zone2 == "c" and cap2 == pytest.approx(9.5)
    assert zone_power_cap({}, {"c": 50.0}, {"c": 80.0}, horizon_s=2.0, power_now_w=10.0, reactive_band_c=1.0) == (None, None)


# -- batch advisor ----------------------------------------------------------------------------


def test_batch_advisor_minimises_total_energy_within_memory() -> None:
    ms = [
        BatchMeasurement(16, energy_j=2.0, seconds=0.20, memory_bytes=1e9),
        BatchMeasurement(32, energy_j=3.0, seconds=0.30, memory_bytes=2e9),
        BatchMeasurement(64, energy_j=5.0, seconds=0.55, memory_bytes=4e9),
        BatchMeasurement(128, energy_j=9.0, seconds=1.00, memory_bytes=8e9),
    ]
    # per sample: 0.125, 0.094, 0.078, 0.070 J -> 128 wins without a limit
    assert advise_batch_size(ms, samples_to_converge=1e5).batch_size == 128
    advice = advise_batch_size(ms, samples_to_converge=1e5, memory_limit_bytes=5e9)
    assert advice.batch_size == 64
    assert advice.total_energy_j == pytest.approx(5.0 * 1e5 / 64)
    assert [o.fits_memory for o in advice.options] == [True, True, True, False]
    # idle power while waiting makes long iterations costlier per sample, but not enough here
    assert advise_batch_size(ms, samples_to_converge=1e5, idle_power_w=3.0, wait_s_per_iteration=0.1).batch_size == 128
    # large batches needing many more samples: a user model flips the answer
    slow = advise_batch_size(ms, iterations_to_converge=lambda b: 1e5 / b * (1 + b / 16))
    assert slow.batch_size == 16


def test_batch_advisor_rejects_bad_input() -> None:
    with pytest.raises(GovernorError, match="at least one"):
        advise_batch_size([])
    with pytest.raises(GovernorError, match="positive"):
        advise_batch_size([BatchMeasurement(0, 1.0, 1.0)])
    with pytest.raises(GovernorError, match="measured twice"):
        advise_batch_size([BatchMeasurement(8, 1.0, 1.0), BatchMeasurement(8, 1.0, 1.0)])
    with pytest.raises(GovernorError, match="memory limit"):
        advise_batch_size([BatchMeasurement(8, 1.0, 1.0, memory_bytes=2e9)], memory_limit_bytes=1e9)
    with pytest.raises(GovernorError, match="iterations_to_converge"):
        advise_batch_size([BatchMeasurement(8, 1.0, 1.0)], iterations_to_converge=lambda b: 0.0)


# -- profiles ------------------------------------------------------------------------------------


def _profile() -> GovernorProfile:
    model = _model()
    model = PhaseModel(model.center, model.at_center, model.axes, model.reference_s,
                       OperatingPoint.of({"gpu": 900 * MHZ, "memory": 500 * MHZ}), Measurement(1.04, 7.0))
    board = BoardId.of("fake", {n: s for n, s in domains().items() if n in ("gpu", "memory")})
    return GovernorProfile(board, "resnet-train", 0.05, MappingProxyType({Phase.FORWARD: model}))


def test_profile_round_trips_through_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prof = _profile()
    path = tmp_path / "p.json"
    prof.save(path)
    back = GovernorProfile.load(path, board=prof.board)
    assert back == prof
    assert back.phases[Phase.FORWARD].predict(OperatingPoint.of({"gpu": 600 * MHZ})) == Measurement(1.5, 6.0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="other"), "not a hetsched governor profile"),
        (lambda d: d.update(version=99), "unsupported profile version 99"),
        (lambda d: d["phases"].update(sideways={}), "unknown phase 'sideways'"),
        (lambda d: d["phases"]["forward"].pop("center"), "missing field 'center'"),
        (lambda d: d["phases"]["forward"].update(at_center=[1.0]), "seconds, watts"),
        (lambda d: d["phases"]["forward"]["axes"].update(gpu={"x": [1, 1]}), "phases.forward"),
        (lambda d: d["board"].update(domains={"gpu": "fast"}), "board.domains.gpu"),
        (lambda d: d.update(slowdown=-1), "slowdown"),
    ],
)
def test_profile_errors_name_what_is_wrong(tmp_path, mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = _profile().to_json()
    data = json.loads(json.dumps(data))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message):
        GovernorProfile.load(path)


def test_profile_unreadable_not_json_or_other_board(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProfileError, match="cannot read"):
        GovernorProfile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        GovernorProfile.load(tmp_path / "x.json")
    prof = _profile()
    prof.save(tmp_path / "p.json")
    other = BoardId.of("fake", {"gpu": DomainSpec("gpu", "gpu", (1, 2), 1e-3)})
    with pytest.raises(ProfileError, match="another board"):
        GovernorProfile.load(tmp_path / "p.json", board=other)


def test_power_budget_error_when_profile_cannot_fit() -> None:
    from hetsched._governor import GovernorEngine

    from _governor_fakes import TableBoard, additive_table

    board = TableBoard(additive_table({}, {"cluster0": 0.5, "gpu": 3.0, "memory": 0.5}))
    prof = _profile()
    prof = GovernorProfile(BoardId.of("fake", board.specs), prof.workload, prof.slowdown, prof.phases)
    eng = GovernorEngine(board, config=GovernorConfig(power_budget_w=0.5), profile=prof)
    with pytest.raises(PowerBudgetError, match="phase forward"):
        eng.start()


def test_safety_reads_the_decision_not_its_words() -> None:
    """A capped decision keeps its lowering writes through the dwell, whatever its text says;
    an uncapped one whose words happen to mention a cap does not."""
    from types import MappingProxyType

    from hetsched._governor._decide import Decision, Reason
    from hetsched._governor._dwell import hold_back
    from hetsched._governor._points import OperatingPoint

    point = OperatingPoint.of({"gpu": 300 * MHZ})
    writes = MappingProxyType({"gpu": 300 * MHZ})
    capped = Decision(Phase.INFER, point, writes, None, Reason.LEAST_ENERGY, capped=True)
    assert dict(hold_back(capped, {"gpu": 500 * MHZ}).writes) == {"gpu": 300 * MHZ}
    free = Decision(Phase.INFER, point, writes, None, Reason.CAP_OVER_HYSTERESIS, capped=False)
    assert "cap" in free.reason and dict(hold_back(free, {"gpu": 500 * MHZ}).writes) == {}
    assert capped.reason == "least energy within bounds"
    assert Decision(Phase.INFER, point, writes, None, Reason.LEAST_ENERGY, capped=True,
                    cap_w=7.5).reason == "power cap 7.50 W: least energy within bounds"


def test_a_profile_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        GovernorProfile.load(fifo)
