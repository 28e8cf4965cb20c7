"""The CLI's JSON contract (``hetsched plan/run ... --json``): field names and types that
checks and scripts rely on, ``--check`` against onnxruntime, ``--shape``, ``--root`` with ``--devices``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetsched._cli import main

STAGE_FIELDS = {"name": str, "device": str, "backend": str, "nodes": int, "flops": float}


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    text = out.strip()
    # plan prints one indented document; run prints one line (after any progress output)
    return json.loads(text if text.startswith("{") else text.splitlines()[-1])


def _assert_stages(stages: list, backends: set[str]) -> None:
    assert isinstance(stages, list) and stages
    for st in stages:
        for key, typ in STAGE_FIELDS.items():
            assert isinstance(st[key], typ), (key, st)
        assert st["nodes"] >= 1 and st["flops"] >= 0
        assert st["backend"] in backends
    assert sum(st["flops"] for st in stages) > 0


def _free_batch_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Tanh", ["h"], ["y"], name="t")],
        "free", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_plan_json_stages_and_refused(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _json(capsys, ["plan", "light_squeezenet", "--json", "--max-unit-nodes", "20",
                          "--devices", "cpu:0", "cpu:1"])
    _assert_stages(plan["stages"], {"cpu"})
    assert plan["refused"] == []
    # the stage FLOPs are the analytic estimate of their nodes: they add up to those of the units
    # the stages hold (units computing only constants are folded into the stages that read them)
    in_stages = {u for s in plan["stages"] for u in s["units"]}
    assert sum(s["flops"] for s in plan["stages"]) == pytest.approx(
        sum(plan_unit_flops(plan, in_stages)), rel=1e-9)


def plan_unit_flops(plan: dict, units: set[int]) -> list[float]:
    from hetsched._planning.costs import analytic_node_costs
    from hetsched._planning.graph import GraphIndex
    from hetsched._planning.model import load_model

    index = GraphIndex(load_model("light_squeezenet"))
    by_name = {n.name: n.index for n in index.nodes}
    costs = analytic_node_costs(index)
    return [costs[by_name[n]].flops for u in plan["units"] if u["id"] in units for n in u["nodes"]]


def test_run_json_check_and_compile(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json(capsys, ["run", "light_squeezenet", "--requests", "2", "--json", "--check",
                             "--max-unit-nodes", "30", "--devices", "cpu:0", "cpu:1"])
    _assert_stages(summary["stages"], {"cpu"})
    check = summary["check"]
    assert isinstance(check["max_abs_diff"], float) and isinstance(check["min_cosine"], float)
    assert check["max_abs_diff"] <= 1e-4 and check["min_cosine"] >= 0.9999
    comp = summary["compile"]
    assert isinstance(comp["conversions"], int) and isinstance(comp["cache_hits"], int)
    assert isinstance(comp["seconds"], float)
    assert comp == {"conversions": 0, "cache_hits": 0, "seconds": 0.0}  # onnxruntime counts no conversions
    assert summary["refused"] == []


def test_run_shape_fixes_free_dimensions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _free_batch_model(tmp_path / "free.onnx")
    summary = _json(capsys, ["run", str(model), "--requests", "1", "--json", "--check", "--shape", "x=3,8",
                             "--devices", "cpu:0"])
    assert summary["inputs"] == {"x": [3, 8]}
    assert summary["check"]["max_abs_diff"] <= 1e-5
    plan = _json(capsys, ["plan", str(model), "--json", "--shape", "x=3,8", "--devices", "cpu:0"])
    _assert_stages(plan["stages"], {"cpu"})


@pytest.mark.parametrize("bad", ["x", "x=", "x=3,a", "=3", "x=0,8"])
def test_bad_shape_is_a_clear_exit(bad: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="NAME=D0,D1"):
        main(["plan", str(_free_batch_model(tmp_path / "m.onnx")), "--shape", bad, "--devices", "cpu:0"])


def test_plan_on_a_twin_root_honours_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "rk3588"
    assert main(["twin", "rk3588", "--root", str(root), "--once"]) == 0
    capsys.readouterr()
    plan = _json(capsys, ["plan", "light_squeezenet", "--root", str(root), "--json", "--max-unit-nodes", "20"])
    _assert_stages(plan["stages"], {"sim", "rknn", "cpu"})
    names = {d["name"] for d in plan["devices"]}
    # the Mali is a default device only through ncnn on a hardware Vulkan driver (none here)
    assert "cluster4" in names and "npu" in names
    plan = _json(capsys, ["plan", "light_squeezenet", "--root", str(root), "--json", "--max-unit-nodes", "20",
                          "--devices", "cluster4", "gpu"])
    assert [d["name"] for d in plan["devices"]] == ["cluster4", "gpu"]
    assert {s["backend"] for s in plan["stages"]} <= {"sim"}
    assert main(["plan", "light_squeezenet", "--root", str(root), "--devices", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "DeviceSpecError" in err and "nosuch" in err and "cluster4" in err
