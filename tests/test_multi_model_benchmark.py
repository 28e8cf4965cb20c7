"""benchmarks/multi_model.py (issue 26): its board-time replay behaves as documented, and a small run
ends with its JSON line. Figures are the twin's (modelled), deterministic: no timing here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

# benchmarks/ is put on sys.path above, at run time: mypy does not look there.
from _board_replay import Mode, ModelPlan, Replay, StagePlan, Stream  # type: ignore[import-not-found]  # noqa: E402

ONE = ModelPlan((StagePlan("npu", 0.010, 0.0, 1.0),))


def test_independent_sessions_share_a_device_in_time() -> None:
    # two closed loops of 10 ms on one device: each runs at half rate, 50 requests/s each
    mix = [Stream("a", 2, clients=1), Stream("b", 2, clients=1)]
    r = Replay(Mode.INDEPENDENT, mix, {"a": ONE, "b": ONE}, ["npu"]).run(1.005)
    assert r.streams["a"].completed == r.streams["b"].completed == 50
    assert all(lat == pytest.approx(0.020) for lat in r.streams["a"].latencies_s)
    assert r.device_busy_s["npu"] == pytest.approx(1.005) == pytest.approx(r.run_busy_s["npu"])
    assert r.workers == 2


def test_the_scheduled_runtime_serves_high_before_background() -> None:
    # a HIGH stream at 20/s with a 25 ms SLO beside two BACKGROUND closed loops on one device (10 ms
    # stages): FIFO makes HIGH wait behind both (30 ms), sharing three ways stretches it as much; the
    # scheduler serves it next, at most one background stage ahead (20 ms)
    mix = [Stream("det", 1, 0.025, rate_hz=20), Stream("bg", 3, clients=1), Stream("bg2", 3, clients=1)]
    plans = {"det": ONE, "bg": ONE, "bg2": ONE}
    sat = {m: Replay(m, mix, plans, ["npu"]).run(2.0).streams["det"] for m in Mode}
    assert sat[Mode.RUNTIME_SCHEDULED].slo_met == sat[Mode.RUNTIME_SCHEDULED].slo_requests > 0
    assert sat[Mode.RUNTIME_FIFO].slo_met < sat[Mode.RUNTIME_FIFO].slo_requests
    assert sat[Mode.INDEPENDENT].slo_met < sat[Mode.INDEPENDENT].slo_requests


def test_memory_bound_runs_on_two_devices_share_dram() -> None:
    mem = ModelPlan((StagePlan("gpu", 0.010, 0.010, 1.0),))
    mix = [Stream("a", 2, clients=1), Stream("b", 2, clients=1)]
    r = Replay(Mode.RUNTIME_FIFO, mix, {"a": ONE.__class__((StagePlan("npu", 0.010, 0.010, 1.0),)), "b": mem},
               ["npu", "gpu"]).run(1.005)
    assert r.streams["a"].completed == r.streams["b"].completed == 50  # half of DRAM each
    assert r.streams["a"].energy_j == pytest.approx(50 * 2.0)  # energy follows the (stalled) busy time


def test_a_small_run_ends_with_its_json_line() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "multi_model.py"), "--boards", "orin-nx", "--seconds", "2",
                          "--background", "1", "8", "--no-threads", "--pace", "2", "--paced-seconds", "0.5"],
                         capture_output=True, text=True, timeout=600,
                         check=True).stdout.strip().splitlines()[-1]
    result = json.loads(out)
    assert result["board"] == "twin:orin-nx" and result["figures"].startswith("modelled")
    case = result["boards"]["orin-nx"]
    assert [row["background_sessions"] for row in case["loads"]] == [1, 8]
    for row in case["loads"]:
        for mode in ("independent_sessions", "runtime_fifo", "runtime_scheduled"):
            assert row[mode]["busy_check"] == 0.0  # every device's busy time is its runs' own, summed
            assert set(row[mode]["energy_per_request_j"]) == {"detector", "classifier", "background"}
        assert row["background_throughput_ratio"] is not None
    assert {"slo_satisfaction_high", "background_throughput_ratio", "met"} <= set(case["at_load"])
    # the same mix served by the real Session/Runtime code on the paced twin, beside the replay
    assert result["serving"]["paced"].startswith("runtime code, paced twin") and "not computed" in result["serving"]["paced"]
    paced = case["at_load_paced"]
    assert paced["serving"] == "runtime code, paced twin" and paced["pace"] == 2.0
    for row in case["loads"]:
        for mode in ("independent_sessions", "runtime_fifo", "runtime_scheduled"):
            got = row["paced"][mode]
            assert got["models"]["detector"]["requests"] > 0 and got["background_throughput"] > 0
            assert set(row["paced"]["vs_replay"][mode]) == {"slo_satisfaction_high", "background_throughput",
                                                            "board_energy_per_request_j"}
        # one set of device workers for the runtime, one per session for independent sessions
        assert (row["paced"]["runtime_scheduled"]["worker_threads_measured"]
                < row["paced"]["independent_sessions"]["worker_threads_measured"])
