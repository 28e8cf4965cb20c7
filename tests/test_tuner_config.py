"""The auto-tune's constants live in one validated TunerConfig, and each one reaches the tuner
(issue 25): through ``GovernorConfig.tuner`` for the governor, ``TunerSettings.config`` for a
tuner made by the factory."""

from __future__ import annotations

from typing import Any

import pytest

from hetsched import GovernorConfig, GovernorError
from hetsched._governor import DomainSpec, Phase, TunerConfig, TunerSettings, axis_tuner
from hetsched._governor._meter import PhaseLedger
from hetsched._governor._model import Measurement
from hetsched._governor._tuning import PhaseTuning
from hetsched.lowlevel import TunerConfig as PublicTunerConfig

from _governor_fakes import domains

MHZ = 1_000_000


@pytest.mark.parametrize(("field", "value"), [
    ("explore_margin", 0.5), ("time_tie", -0.01), ("verify_tries", -1), ("slope_factor", 0.5),
    ("occurrences_per_measurement", 0), ("tune_after", 0), ("joint_flat", 0.9),
])
def test_an_out_of_range_constant_is_refused_by_name(field: str, value: float) -> None:
    kwargs: dict[str, Any] = {field: value}  # one field by name, whatever its type
    with pytest.raises(GovernorError, match=field):
        TunerConfig(**kwargs)


def test_the_governor_carries_the_tuner_config_and_lowlevel_exports_it() -> None:
    assert GovernorConfig().tuner == TunerConfig()
    assert PublicTunerConfig is TunerConfig
    cfg = GovernorConfig(tuner=TunerConfig(explore_margin=0.1))
    assert cfg.tuner.explore_margin == 0.1
    assert set(TunerConfig().as_dict()) >= {"explore_margin", "centre_tie", "budget_passes", "verify_tries"}


def _started(tune_after: int, occurrences: int) -> PhaseTuning:
    book = PhaseLedger()
    for _ in range(occurrences):
        book.record(Phase.BACKWARD, 0.5, 5.0)
    tuning = PhaseTuning({}, book)
    cfg = GovernorConfig(tuner=TunerConfig(tune_after=tune_after))
    tuning.start(Phase.BACKWARD, domains=domains(), locked=(), config=cfg, dwell_s=None)
    return tuning


def test_tune_after_decides_when_the_driver_starts_a_tune() -> None:
    assert Phase.BACKWARD in _started(tune_after=3, occurrences=3).tuners
    assert Phase.BACKWARD not in _started(tune_after=5, occurrences=3).tuners
    assert Phase.BACKWARD in _started(tune_after=5, occurrences=5).tuners


def test_the_effort_constants_set_the_measurement_limit() -> None:
    specs = domains()
    base = axis_tuner(specs, ["gpu", "memory"], TunerSettings(slowdown=0.05, repeats=2))
    more = axis_tuner(specs, ["gpu", "memory"], TunerSettings(
        slowdown=0.05, repeats=2, config=TunerConfig(spare_runs=7, spare_passes=3)))
    per_pass = sum(min(5, len(specs[d].available_hz)) + 1 for d in ("gpu", "memory")) + 2
    assert more.measurement_limit - base.measurement_limit == 2 * (per_pass + 3)


def _first_step_up(config: TunerConfig) -> int:
    """Under a cap the tune starts at the lowest point; the gpu clock of its first step up."""
    specs = {"gpu": DomainSpec("gpu", "gpu", tuple(f * MHZ for f in range(300, 1100, 100)), 1e-3)}
    tuner = axis_tuner(specs, ["gpu"], TunerSettings(slowdown=0.05, power_cap_w=50.0, levels=3, repeats=1,
                                                     guarded=False, config=config))
    centre = tuner.propose()
    assert centre is not None and centre["gpu"] == 300 * MHZ
    tuner.record(centre, Measurement(0.1, 3.0))
    step = tuner.propose()
    assert step is not None
    return step["gpu"]


def test_smallest_step_first_climbs_from_the_next_clock_under_a_cap() -> None:
    assert _first_step_up(TunerConfig()) == 400 * MHZ
    assert _first_step_up(TunerConfig(smallest_step_first=False)) > 400 * MHZ
