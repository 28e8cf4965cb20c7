"""``hetsched run``'s one-model summary names every re-plan (issue 24/26): the text lists each
one of ``ReplanStatistics.history`` (not only the last) and every failed one; ``--json`` carries
the same history."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from hetsched._cli._run import _print_text


def _summary() -> dict:
    return {
        "requests": 4, "latency_ms_median": 1.0, "latency_ms_p99": 2.0, "throughput_rps": 10.0,
        "replans": {
            "count": 2, "last_reason": "drift: stage 'b' measured",
            "reasons": {"thermal": 1, "drift": 1},
            "history": [
                {"number": 1, "reason": "thermal: temperature headroom below 0.10 on gpu 0.05",
                 "moved_units": 3, "seconds": 0.25},
                {"number": 2, "reason": "drift: stage 'b' measured", "moved_units": 1, "seconds": None},
            ],
            "failed": 1, "errors": ["power: headroom 0.01 below 0.05: no device left"],
        },
    }


def test_the_text_summary_lists_every_replan_and_every_failed_one(capsys: pytest.CaptureFixture[str]) -> None:
    s = SimpleNamespace(plan=SimpleNamespace(table=lambda: "PLAN"))
    args = argparse.Namespace(stream=False, warmup=1, check=False, root=None)
    _print_text(s, args, _summary(), None)
    out = capsys.readouterr().out
    assert "re-planned 2 time(s)" in out
    assert "#1: thermal: temperature headroom below 0.10 on gpu 0.05 (3 unit(s) moved, 0.250 s)" in out
    assert "#2: drift: stage 'b' measured (1 unit(s) moved)" in out
    assert "re-plan failed (the plan stayed): power: headroom 0.01 below 0.05: no device left" in out


def test_no_replan_prints_no_replan_line(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _summary()
    summary["replans"] = {"count": 0, "last_reason": None, "reasons": {}, "history": [], "failed": 0, "errors": []}
    _print_text(SimpleNamespace(plan=SimpleNamespace(table=lambda: "PLAN")),
                argparse.Namespace(stream=False, warmup=0, check=False, root=None), summary, None)
    assert "re-plan" not in capsys.readouterr().out
