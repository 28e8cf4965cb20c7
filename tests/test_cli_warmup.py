"""``hetsched run --warmup N`` (issue 24): N requests run first, left out of the latency figures, and said so."""

from __future__ import annotations

import json
from typing import Any

import pytest

import hetsched
from hetsched._cli import main


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = hetsched.Session.run

    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(hetsched.Session, "run", run)
    return calls


def test_warm_up_requests_run_first_and_are_not_counted(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    calls = _counting(monkeypatch)
    assert main(["run", "light_squeezenet", "--devices", "cpu:0", "--requests", "3", "--warmup", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["warmup_requests"] == 2 and summary["requests"] == 3
    assert len(calls) == 5


def test_the_text_summary_says_warm_up_was_left_out(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    calls = _counting(monkeypatch)
    assert main(["run", "light_squeezenet", "--devices", "cpu:0", "--requests", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 requests: median" in out and "(3 warm-up request(s) first, not counted)" in out
    assert len(calls) == 5  # the default: a few


def test_a_negative_warm_up_is_a_clear_exit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["run", "light_squeezenet", "--devices", "cpu:0", "--warmup", "-1"])
    assert info.value.code == 2 and "argument --warmup: '-1': must be an integer >= 0" in capsys.readouterr().err


def test_check_reports_each_outputs_cosine_and_max_abs_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "light_squeezenet", "--devices", "cpu:0", "--requests", "1", "--check", "--json"]) == 0
    check = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["check"]
    assert check["outputs"] and all(set(v) == {"cosine", "max_abs_diff"} for v in check["outputs"].values())
    assert min(v["cosine"] for v in check["outputs"].values()) == check["min_cosine"]
