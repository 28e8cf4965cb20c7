"""Under a power budget the governor fills it: the most work per second whose every phase fits.

The audit (issue 13): on Orin NX training at a 15 W budget the governor ran at 10.8 W mean
and 0.83x the best static point that fits, because it still minimised energy under the cap
and its tuner only ever raised one domain at a time (a data loader on two CPU clusters is
as slow as the slower one: raising either alone buys nothing). The board here is a table
with that structure; the best static point is found by exhaustive search.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest

from hetsched._governor import GovernorConfig, GovernorEngine, Phase
from hetsched.testing import coupled_phase

from _governor_fakes import TableBoard, domains

SPECS = domains()
REF = {d: s.max_hz for d, s in SPECS.items()}
TWO_CLUSTERS = {**SPECS, "cluster4": SPECS["cluster0"].__class__("cluster4", "cpu", SPECS["cluster0"].available_hz, 1e-4)}
REF4 = {**REF, "cluster4": REF["cluster0"]}
FUNCS = {
    # the loader's share of a step: both CPU clusters, concurrently
    Phase.DATA: coupled_phase({"cluster0": 0.030, "cluster4": 0.030, "memory": 0.004}, {"cluster0": 2.0, "cluster4": 2.0,
                              "memory": 1.0}, ref_hz=REF4, overlap=1.0, static_w=2.0, leak_w={"gpu": 0.5}),
    Phase.FORWARD: coupled_phase({"gpu": 0.040, "memory": 0.015, "cluster0": 0.004}, {"gpu": 9.0, "memory": 2.0,
                                 "cluster0": 1.0}, ref_hz=REF4, overlap=0.9, static_w=2.0, stall_share=0.3,
                                 leak_w={"gpu": 0.5}),
    Phase.BACKWARD: coupled_phase({"gpu": 0.030, "memory": 0.045, "cluster0": 0.004}, {"gpu": 8.0, "memory": 3.0,
                                  "cluster0": 1.0}, ref_hz=REF4, overlap=0.9, static_w=2.0, stall_share=0.3,
                                  leak_w={"gpu": 0.5}),
}
LOOP = (Phase.DATA, Phase.FORWARD, Phase.BACKWARD)
BUDGET = 9.0


def table(phase: Phase, f: Mapping[str, int]) -> tuple[float, float]:
    fn = FUNCS.get(phase)
    if fn is None:  # idle
        return 1.0, 2.0
    return fn(f)


def best_static_within(cap: float) -> float:
    """Seconds per loop of the fastest single point whose every phase stays under ``cap``."""
    names = list(TWO_CLUSTERS)
    best = None
    for combo in itertools.product(*[TWO_CLUSTERS[d].available_hz for d in names]):
        f = dict(zip(names, combo, strict=True))
        runs = [table(p, f) for p in LOOP]
        if all(w <= cap for _, w in runs):
            t = sum(s for s, _ in runs)
            best = t if best is None else min(best, t)
    assert best is not None
    return best


def _governed_loop() -> tuple[TableBoard, GovernorEngine, float]:
    board = TableBoard(table, specs=dict(TWO_CLUSTERS))
    engine = GovernorEngine(board, config=GovernorConfig(power_budget_w=BUDGET, tune_repeats=1))
    engine.start()
    for _ in range(400):
        for p in LOOP:
            board.run(engine, p)
        if engine.tuning_done and len(engine.models()) == len(LOOP):
            break
    assert set(engine.models()) == set(LOOP)
    board.power_trace.clear()
    t0 = board.t
    n = 30
    for _ in range(n):
        for p in LOOP:
            board.run(engine, p)
    engine.close()
    return board, engine, (board.t - t0) / n


def test_budget_holds_and_a_phase_that_draws_little_runs_fast() -> None:
    board, engine, _ = _governed_loop()
    # Never above the budget (the fake applies clocks at once, so no transition to allow for).
    assert max(board.power_trace) <= BUDGET
    # The loader runs both clusters high (only a joint move shows that it pays): it draws
    # little, so the budget lets it. The old tuner left them at the bottom.
    data = engine.models()[Phase.DATA].best
    assert data is not None
    top = TWO_CLUSTERS["cluster0"].max_hz
    assert data["cluster0"] >= top * 0.75 and data["cluster4"] >= top * 0.75


@pytest.mark.xfail(strict=True, reason=(
    "open (issue 13): the tuner's bounds on points it has not measured (kept so that tuning "
    "never runs over the cap) stop FORWARD and BACKWARD short of the fastest points that fit"))
def test_budget_fill_beats_the_best_static_point_within_the_same_cap() -> None:
    _, _, per_loop = _governed_loop()
    cap = GovernorConfig(power_budget_w=BUDGET).budget_cap_w
    assert cap is not None
    assert best_static_within(cap) / per_loop >= 1.05
