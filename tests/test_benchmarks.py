"""Every benchmark runs (in a small configuration) and ends with its one JSON line.

Speed targets are measured by the benchmarks themselves, never asserted here; what is checked
is that each script works and reports the fields its docstring promises, plus the benchmarks'
correctness fields (outputs right, nothing copied or leaked).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

SMOKE: dict[str, tuple[list[str], set[str]]] = {
    "plan_scaling.py": (["--repeats", "1", "--sizes", "100", "1000"], {"seconds_1k", "seconds_10k", "growth_10x"}),
    "telemetry.py": (["--samples", "50", "--sim-seconds", "20"], {"sample_us", "sim_seconds_per_wall_second"}),
    "twin_calibration.py": ([], {"max_rel_error", "rows"}),
    "twin_speed.py": (["--seconds", "20"], {"sim_seconds_per_wall_second", "per_board"}),
    "zero_copy.py": (["--requests", "10"], {"bytes_copied_same_domain", "stage_boundaries", "pointer_mismatches"}),
    "priority.py": (["--rounds", "1", "--high-per-round", "4", "--warm-s", "0.05", "--bg-clients", "2"],
                    {"high_p99_ratio", "fifo_high_p99_ratio", "transfer_preemptions"}),
    "throughput.py": (["--requests", "8", "--rounds", "1"], {"ratio_vs_ort_best", "run_ratio_vs_ort_best", "req_per_s"}),
    "overhead.py": (["--model", "squeezenet", "--also", "", "--requests", "10", "--block", "5", "--warmup", "1"],
                    {"ratio_1_stage", "ratio_4_stages", "by_model"}),
    "governor.py": (["--quick", "--only", "orin-nx:infer"],
                    {"train_energy_vs_performance", "train_energy_vs_best_static", "slowdown_vs_performance",
                     "throttle_events", "performance_throttled_s_min", "infer_energy_vs_performance",
                     "infer_energy_vs_kernel", "infer_extra_deadline_misses", "capped_throughput_vs_best_static",
                     "cap_violations", "targets", "cases", "capped", "train_energy_vs_frontier",
                     "infer_energy_vs_frontier", "capped_throughput_vs_frontier"}),
    "governed_session.py": (["--frames", "20", "--boards", "rk3588"], {"summary", "boards", "targets"}),
    "governor_frontier.py": (["--quick", "--only", "orin-nx:infer"],
                             {"frontier_energy_vs_performance", "infer_frontier_energy_vs_kernel",
                              "capped_frontier_throughput_vs_best_static", "cases"}),
    "board_loop.py": (["--requests", "80", "--failover-requests", "200"],
                      {"hot_throughput_ratio", "failover_lost_requests", "failover_recovery_s", "replans",
                       "static_throttle_events", "adaptive_throttle_events", "static_energy_per_request_mj",
                       "adaptive_energy_per_request_mj"}),
    "failover_probe.py": (["--replan-requests", "800", "--context-requests", "400", "--kills", "4"],
                          {"requests", "completed", "failed_promised_retry", "lost", "wrong", "scenarios"}),
    "startup.py": (["--runs", "1"], {"import_ratio", "info_cpu_s", "meets_target"}),
    "multi_model.py": (["--boards", "orin-nx", "--seconds", "2", "--background", "1", "8", "--no-threads", "--pace", "0"],
                       {"boards", "serving", "targets", "mix"}),
    "real_models.py": (["--models", "ppocr_cls", "--targets", "host", "orin-nx"],
                       {"runs_all", "stages", "min_cosine", "estimate_vs_modelled_range", "rows"}),
    "ncnn_gpu.py": (["--models", "squeezenet", "--inputs", "1"],
                    {"min_cosine_fp32", "min_cosine_fp16", "silent_failures_run", "targets", "models"}),
    "rknn.py": (["--models", "squeezenet", "--inputs", "1"],
                {"min_cosine", "npu_flops_fraction_min", "cached_open_ratio",
                 "modelled_energy_vs_cpu_only_max", "targets", "models"}),
}


def _has_rknn_toolkit() -> bool:
    from hetsched import BackendUnavailableError
    from hetsched._rknn.env import find_toolkit_python

    try:
        find_toolkit_python()
    except BackendUnavailableError:
        return False
    return True


def _run(name: str, args: list[str], tmp_path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_benchmark_has_a_smoke_run() -> None:
    assert {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")} == set(SMOKE)


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_benchmark_runs_and_reports_its_fields(name: str, tmp_path: Path) -> None:
    args, fields = SMOKE[name]
    if name == "rknn.py" and not _has_rknn_toolkit():
        pytest.skip("no rknn-toolkit2 environment (hetsched setup rknn)")
    if name == "ncnn_gpu.py":
        from hetsched.backends._ncnn_convert import ncnn_unavailable_reason

        if ncnn_unavailable_reason() is not None:
            pytest.skip(f"ncnn backend unavailable here: {ncnn_unavailable_reason()}")
    result = _run(name, args, tmp_path)
    assert fields <= set(result), sorted(fields - set(result))
    # Labels that never fall off: where the figures come from, and whether modelled or measured.
    assert result["board"].startswith(("twin:", "host:")), result["board"]
    assert result["figures"].startswith(("modelled", "measured on ", "NPU numerics")), result["figures"]
    if name == "zero_copy.py":
        assert result["wrong_outputs"] == 0 and result["live_buffers_after"] == 0
        assert result["bytes_copied_same_domain"] == 0 and result["pointer_mismatches"] == 0
    if name == "rknn.py":
        (row,) = result["models"]
        assert row["conversions"] > 0 and row["cached_conversions"] == 0 and row["cache_hits"] > 0
        assert result["min_cosine"] >= 0.999  # the simulator's fp16 agrees with onnxruntime
    if name == "ncnn_gpu.py":
        assert result["silent_failures_run"] == 0 and result["min_cosine_fp32"] >= 0.9999
        (row,) = result["models"]
        assert row["cache_hits"] >= 2 and all("modelled_ms" in p or "skipped" in p for p in row["twin_plans"].values())
    if name == "failover_probe.py":  # issue 23: nothing failover promises to retry fails, nothing is lost
        assert result["failed_promised_retry"] == 0 and result["lost"] == 0 and result["wrong"] == 0
        assert result["completed"] == result["requests"] == 2 * (800 + 400)
        assert all(sc["quarantines"] >= 1 for k, sc in result["scenarios"].items() if k.startswith("replan_race"))
    if name == "board_loop.py":
        assert result["failover_lost_requests"] == 0  # every request of the stream got its (checked) result
        assert result["replans"] >= 1
    if name == "governor.py":
        (case,) = result["cases"]
        assert (case["soc"], case["workload"]) == ("orin-nx", "infer")
        assert {"infer_energy_vs_performance", "infer_energy_vs_kernel", "infer_extra_deadline_misses"} <= set(case)
        # The best static point is verified in its own warmed-up run: found, and it never throttled.
        assert case["best_static"]["point_mhz"] is not None and case["best_static_throttle_events"] == 0
        assert [c["cap_w"] for c in result["capped"]] == [10.0, 15.0]
        for c in result["capped"]:  # each cap: a verified static point under the cap, and a ratio or a refusal
            assert c["best_static_mhz"] is not None and c["best_static_it_per_s"] > 0
            assert "error" in c or c["cap_violations"] is not None
        for target in result["targets"].values():
            assert set(target) == {"value", "target", "pass"}
        # Each figure beside the frontier of the same twin, measured in the same run (issue 25).
        assert case["frontier_energy_vs_performance"] > 0 and case["infer_energy_vs_frontier"] > 0
        assert all(c["frontier_it_per_s"] > 0 and "capped_throughput_vs_frontier" in c for c in result["capped"])
        assert result["targets"]["infer_energy_vs_frontier"]["target"] == "<= 1.02"
    if name == "governor_frontier.py":
        (case,) = result["cases"]
        assert case["runs"] and all(r["energy_vs_performance"] > 0 for r in case["runs"])
        assert [c["cap_w"] for c in case["capped"]] == [10.0, 15.0]
