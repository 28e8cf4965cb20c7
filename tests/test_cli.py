"""The ``hetsched`` command line: demo, plan, run, and error exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hetsched._cli import main

DEVICES = ["--devices", "cpu:0", "cpu:1", "cpu:0-1"]


def _json_out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_demo_json(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json_out(capsys, ["demo", "--json", "--requests", "2", *DEVICES])
    assert summary["model"] == "light_squeezenet"
    assert summary["devices"] == ["cpu:0", "cpu:1", "cpu:0-1"]
    # The planner keeps the model whole when splitting does not pay (light_squeezenet's weights are
    # constants folded into the stage that reads them, not stages of their own).
    assert summary["stages"] >= 1
    assert sum(summary["stages_per_device"].values()) == summary["stages"]
    assert summary["max_abs_diff_vs_onnxruntime"] <= 1e-4
    assert summary["latency_ms_median"] > 0 and summary["pipelined_throughput_rps"] > 0
    assert summary["stream_throughput_rps"] > 0


def test_demo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--requests", "1", "--policy", "heft", *DEVICES]) == 0
    out = capsys.readouterr().out
    assert "stage" in out and "device" in out and "outputs match onnxruntime" in out
    assert "policy heft" in out


def test_python_m_hetsched_demo_json() -> None:
    env = dict(os.environ, PYTHONWARNINGS="error::RuntimeWarning")
    proc = subprocess.run([sys.executable, "-m", "hetsched", "demo", "--json", "--requests", "2"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["model"] == "light_squeezenet" and summary["stages"] >= 1
    assert summary["max_abs_diff_vs_onnxruntime"] <= 1e-4


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json_out(capsys, ["plan", "light_squeezenet", "--json", "--max-unit-nodes", "20",
                              "--policy", "random:2", *DEVICES])
    assert plan["policy"] == "random"
    assert [d["name"] for d in plan["devices"]] == ["cpu:0", "cpu:1", "cpu:0-1"]
    assert len(plan["stages"]) >= 2
    assert all(s["device"] in {"cpu:0", "cpu:1", "cpu:0-1"} for s in plan["stages"])
    # Every unit appears in exactly one stage, and the stage's device is the unit's; a unit that
    # computes only constants (light_squeezenet's weights) is folded into the stages reading it.
    unit_dev = {u["id"]: u["device"] for u in plan["units"]}
    seen = [u for s in plan["stages"] for u in s["units"]]
    assert len(seen) == len(set(seen)) and set(seen) <= set(unit_dev)
    from hetsched._planning.graph import GraphIndex
    from hetsched._planning.model import load_model
    from hetsched._planning.partition import constant_nodes

    index = GraphIndex(load_model("light_squeezenet"))
    const = constant_nodes(index)
    by_name = {n.name: n.index for n in index.nodes}
    for u in plan["units"]:
        if u["id"] not in seen:
            assert all(const[by_name[n]] for n in u["nodes"]), f"unit {u['id']} is in no stage"
    assert all(unit_dev[u] == s["device"] for s in plan["stages"] for u in s["units"])
    assert all(max(len(u["nodes"]), 1) <= 20 for u in plan["units"])


def test_plan_table_by_name_without_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "squeezenet", "--devices", "cpu:0", "cpu:1"]) == 0
    out = capsys.readouterr().out
    assert "policy: power-thermal" in out and "est ms" in out


def test_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json_out(capsys, ["run", "light_squeezenet", "--requests", "3", "--json", "--max-unit-nodes", "30",
                                 *DEVICES])
    assert summary["requests"] == 3
    assert len(summary["stages"]) >= 1
    assert summary["latency_ms_median"] > 0 and summary["throughput_rps"] > 0


def test_run_stream(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json_out(capsys, ["run", "light_squeezenet", "--requests", "12", "--stream", "--json",
                                 "--devices", "cpu:0", "cpu:1"])
    assert summary["requests"] == 12 and summary["mode"] == "stream" and summary["throughput_rps"] > 0
    assert "latency_ms_median" not in summary  # a stream's results come in batches: no per-request latency
    assert main(["run", "squeezenet", "--requests", "3", "--stream", "--devices", "cpu:0"]) == 0
    assert "3 requests streamed:" in capsys.readouterr().out


def test_run_with_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "squeezenet", "--requests", "2", "--concurrency", "2", "--progress",
                 "--devices", "cpu:0"]) == 0
    captured = capsys.readouterr()
    assert "2/2 requests" in captured.err


def test_unknown_model_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "light_nosuchnet"]) == 1
    err = capsys.readouterr().err
    assert "ModelNotFoundError" in err and "light_nosuchnet" in err and "light_squeezenet" in err
    assert main(["run", "/nonexistent/model.onnx"]) == 1
    assert "/nonexistent/model.onnx" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["gpu:0", "cpu:4096", "cpu:x"])
def test_bad_device_spec_exits_1(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    assert main(["plan", "light_squeezenet", "--devices", spec]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hetsched: error: DeviceSpecError:") and spec in err
    assert "Traceback" not in err


def test_unknown_policy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's usage error (tests/test_cli_bad_args.py)
        main(["plan", "light_squeezenet", "--policy", "fastest", "--devices", "cpu:0"])
    assert info.value.code == 2 and "argument --policy: unknown policy 'fastest'" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out
