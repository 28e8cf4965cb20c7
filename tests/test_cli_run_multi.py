"""``hetsched run A B --rate --priority --slo-ms`` / ``--workload`` (issue 26): several models at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import hetsched
from hetsched import Priority
from hetsched._cli import main


def _priorities(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Priority | None]]:
    seen: list[tuple[str, Priority | None]] = []
    real = hetsched.Session.run

    async def run(self: Any, feeds: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((next(iter(feeds)), kwargs.get("priority")))
        return await real(self, feeds, *args, **kwargs)

    monkeypatch.setattr(hetsched.Session, "run", run)
    return seen


def test_two_models_served_at_once_report_per_model(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    seen = _priorities(monkeypatch)
    rc = main(["run", "light_squeezenet", "light_shufflenet", "--devices", "cpu:0", "--rate", "5,0",
               "--priority", "high,background", "--slo-ms", "10000,-", "--duration", "0.6", "--warmup", "1", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    det, bg = summary["models"]
    assert (det["model"], det["priority"], det["rate"], det["slo_ms"]) == ("light_squeezenet", "high", 5.0, 10000.0)
    assert (bg["priority"], bg["rate"], bg["slo_ms"]) == ("background", 0.0, None)
    # open loop at 5/s for 0.6 s: requests due at 0, 0.2, 0.4 s; all within a 10 s SLO
    assert det["requests"] == 3 and det["slo_satisfaction"] == 1.0
    assert bg["requests"] >= 1 and bg["slo_satisfaction"] is None
    for m in (det, bg):
        assert m["latency_ms"]["p50"] <= m["latency_ms"]["p99"]
        assert m["throughput_rps"] == pytest.approx(m["requests"] / 0.6)
    assert summary["mode"] == "one runtime" and summary["worker_threads"] >= 0
    # the runtime splits the stage energy between the two by their busy shares (host CPUs: none modelled)
    assert all("board_energy_split_j" in m for m in (det, bg))
    # each model's requests went with its own priority (the warm-up one included)
    assert {p for _, p in seen if p == Priority.HIGH}
    assert {p for _, p in seen if p == Priority.BACKGROUND}
    assert all(p in (Priority.HIGH, Priority.BACKGROUND) for _, p in seen)


def test_a_workload_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "mix.json"
    wl.write_text(json.dumps({"duration_s": 0.4, "models": [
        {"model": "light_squeezenet", "rate": 5, "priority": "high", "slo_ms": 0.001},
        {"model": "light_shufflenet", "priority": "background"}]}))
    assert main(["run", "--workload", str(wl), "--devices", "cpu:0", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 models, one runtime, 0.4 s" in out
    assert "light_squeezenet" in out and "high" in out and "0.0%" in out  # a 1 us SLO is never met


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["light_squeezenet", "light_shufflenet", "--rate", "1,2,3"], "--rate has 3 values for 2 models"),
        (["light_squeezenet", "light_shufflenet", "--priority", "high,urgent"], "unknown priority 'urgent'"),
        (["light_squeezenet", "--rate", "-1"], "must be a finite number >= 0"),
        (["light_squeezenet", "light_shufflenet", "--slo-ms", "0,-"], "must be a finite number of ms > 0"),
        (["light_squeezenet", "light_shufflenet", "--trace", "x.json", "--independent"],
         "--trace with several models writes the one Runtime's trace"),
        (["light_squeezenet", "light_shufflenet", "--stream"], "--stream runs one model"),
        (["--rate", "3"], "give a MODEL"),
    ],
)
def test_bad_multi_model_arguments_are_usage_errors(argv: list[str], message: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["run", *argv])
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        (json.dumps({"models": []}), "non-empty \"models\" list"),
        (json.dumps({"models": [{"model": "light_squeezenet", "rate": 1, "fps": 3}]}), "unknown keys ['fps']"),
        (json.dumps({"models": [{"model": "light_squeezenet", "priority": "asap"}]}), "models[0]: unknown priority"),
        (json.dumps({"models": [{"model": "light_squeezenet"}], "duration_s": -2}), "duration_s -2"),
    ],
)
def test_a_bad_workload_file_names_what_is_wrong(content: str, message: str, tmp_path: Path) -> None:
    wl = tmp_path / "mix.json"
    wl.write_text(content)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--workload", str(wl)])
    assert message in str(exc.value)


def test_workload_and_models_together_are_refused(tmp_path: Path) -> None:
    wl = tmp_path / "mix.json"
    wl.write_text(json.dumps({"models": [{"model": "light_squeezenet"}]}))
    with pytest.raises(SystemExit, match="no MODEL"):
        main(["run", "light_squeezenet", "--workload", str(wl)])


def test_independent_sessions_start_a_worker_set_each(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "light_squeezenet", "light_shufflenet", "--devices", "cpu:0", "--duration", "0.3",
            "--warmup", "0", "--json"]
    assert main([*argv, "--independent"]) == 0
    independent = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv) == 0
    shared = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert independent["mode"] == "independent sessions" and shared["mode"] == "one runtime"
    assert "board_energy_split_j" not in independent["models"][0]
    # one device: a worker per session and device, against one worker for both on the runtime
    assert independent["worker_threads"] > shared["worker_threads"]


def _free_dims_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "free", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_shape_fixes_the_inputs_of_the_models_that_have_them(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    free = str(_free_dims_model(tmp_path / "free.onnx"))
    argv = ["run", free, "light_squeezenet", "--devices", "cpu:0", "--duration", "0.3", "--warmup", "0", "--json"]
    assert main(argv) == 1  # free dims left: one line naming the input and the --shape to pass
    assert "shape" in capsys.readouterr().err
    assert main([*argv, "--shape", "x=2,4"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["models"][0]["requests"] >= 1
    with pytest.raises(SystemExit, match="no model has an input of that name"):
        main([*argv, "--shape", "x=2,4", "--shape", "nosuch=1"])


def test_a_workload_can_fix_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    free = str(_free_dims_model(tmp_path / "free.onnx"))
    wl = tmp_path / "mix.json"
    wl.write_text(json.dumps({"duration_s": 0.3, "models": [{"model": free, "shape": {"x": [3, 4]}}]}))
    assert main(["run", "--workload", str(wl), "--devices", "cpu:0", "--warmup", "0", "--json"]) == 0
    wl.write_text(json.dumps({"models": [{"model": free, "shape": {"x": [0, 4]}}]}))
    with pytest.raises(SystemExit, match="lists of positive integers"):
        main(["run", "--workload", str(wl)])


def test_several_models_write_one_trace_with_a_track_per_model(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "mix.json"
    argv = ["run", "light_squeezenet", "light_shufflenet", "--devices", "cpu:0", "--duration", "0.3",
            "--warmup", "0", "--json", "--trace", str(trace)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["board_energy_source"] in ("modelled", None) and "replacements" in summary
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"requests light_squeezenet", "requests light_shufflenet"} <= names
