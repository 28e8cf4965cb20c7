"""The budget-filling strategy on its own (issue 25): guarded probes admitted by the physical bound
under the measured cap, dropped when a run measured over it; a watched choice that did not fit
falls back to the pass's own. And the axis tuner without the strategy watches nothing."""

from __future__ import annotations

from hetsched._governor import DomainSpec, OperatingPoint
from hetsched._governor._model import Measurement
from hetsched._governor._tuner_budget import BudgetFilling

from _governor_fakes import make_tuner

M = 1_000_000


def _pt(gpu_mhz: int) -> OperatingPoint:
    return OperatingPoint.of({"gpu": gpu_mhz * M})


def _strategy(cap_w: float) -> BudgetFilling:
    return BudgetFilling(cap_w, "time", time_tie=0.005)


def test_a_step_up_is_admitted_as_a_guarded_probe_only_if_its_physical_bound_fits() -> None:
    centre = _pt(300)
    # The least power measured is the static floor (1 W); the centre draws 3 W, so doubling the clock
    # bounds the step at 1 + 2 * 2 = 5 W.
    samples = {centre: [Measurement(0.1, 3.0)], _pt(200): [Measurement(0.15, 1.0)]}
    fits = _strategy(5.1)
    assert fits.admit(centre, "gpu", 600 * M, {}, samples)
    assert fits.guarded(_pt(600)) and not fits.guarded(_pt(450))
    too_tight = _strategy(4.9)
    assert not too_tight.admit(centre, "gpu", 600 * M, {}, samples)
    assert not too_tight.guarded(_pt(600))
    # Nothing measured at the centre yet: nothing to bound a step with.
    assert not _strategy(100.0).admit(centre, "gpu", 600 * M, {}, {})


def test_a_guarded_probe_measured_over_the_cap_is_reported_and_then_no_longer_watched() -> None:
    centre = _pt(300)
    samples = {centre: [Measurement(0.1, 3.0)], _pt(200): [Measurement(0.15, 1.0)]}
    s = _strategy(5.1)
    assert s.admit(centre, "gpu", 600 * M, {}, samples)
    assert not s.over_cap(_pt(600), Measurement(0.05, 5.0))
    assert s.over_cap(_pt(600), Measurement(0.05, 5.5))
    assert not s.over_cap(_pt(450), Measurement(0.05, 9.0))  # not a probe: not the strategy's to judge
    s.discard(_pt(600))
    assert not s.guarded(_pt(600))


def test_without_a_watched_choice_the_verified_point_is_the_one_judged() -> None:
    s = _strategy(5.0)
    assert s.after_verify(_pt(600), {_pt(600): [Measurement(0.05, 6.0)]}) == _pt(600)


def test_the_axis_tuner_without_the_strategy_runs_no_guarded_probe() -> None:
    specs = {"gpu": DomainSpec("gpu", "gpu", tuple(f * M for f in (300, 400, 500, 600, 700, 800)), 1e-3)}
    for guarded in (False, True):
        tuner = make_tuner(specs, ["gpu"], slowdown=0.05, power_cap_w=6.0, measured_cap_w=6.0, repeats=1,
                           guarded=guarded)
        watched = 0
        while (pt := tuner.propose()) is not None:
            watched += tuner.guarded(pt)
            ghz = pt["gpu"] / 1e9
            tuner.record(pt, Measurement(0.03 / ghz, 1.0 + 8.0 * ghz**2))
        assert (watched > 0) is guarded
