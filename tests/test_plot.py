"""``hetsched plot``: reading Chrome trace event files and drawing them (synthetic traces built here)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from hetsched._cli import main
from hetsched._cli._plot_trace import load_trace, parse_trace
from hetsched._errors import BackendUnavailableError, HetschedError, ProfileError

pytest.importorskip("matplotlib")

from hetsched._cli._plot_render import plot_trace, render_trace

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DEVICES = ("cpu:0-3", "cpu:4-5", "npu")
STAGES = ("stage0", "stage1", "stage2", "stage3")


def _meta(pid: int, name: str, tid: int | None = None, thread: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}}]
    if tid is not None:
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": thread}})
    return out


def synthetic_trace(*, counters: bool = True, governor: bool = True, replans: bool = True,
                    failed: bool = True, t0_us: float = 5_000_000.0) -> dict[str, Any]:
    """A 2 s pipelined run on three devices: 20 requests through four stages, optional telemetry."""
    events: list[dict[str, Any]] = []
    for k, dev in enumerate(DEVICES):
        events += _meta(10 + k, f"device {dev}", 1, f"worker-{dev}")
    events += _meta(2, "transfers", 1, "channel host->npu") + _meta(3, "requests")
    events += _meta(4, "governor", 1, "phases") + _meta(5, "board")
    placement = {"stage0": 10, "stage1": 11, "stage2": 12, "stage3": 10}
    for r in range(20):
        start = t0_us + r * 90_000.0
        for s, stage in enumerate(STAGES):
            dur = 20_000.0 + 5_000.0 * s
            args: dict[str, Any] = {"request": r, "priority": "NORMAL", "bound": s == 2}
            if failed and r == 7 and stage == "stage2":
                args["error"] = "RuntimeError: simulated NPU fault"
            events.append({"ph": "X", "pid": placement[stage], "tid": 1, "name": stage,
                           "ts": start + s * 25_000.0, "dur": dur, "args": args})
        events.append({"ph": "X", "pid": 2, "tid": 1, "name": "transfer 1.2 MB", "ts": start + 44_000.0,
                       "dur": 4_000.0, "args": {"nbytes": 1_200_000}})
        events.append({"ph": "X", "pid": 3, "tid": r, "name": f"request {r}", "ts": start, "dur": 110_000.0})
    events.append({"ph": "i", "s": "t", "pid": 2, "tid": 1, "name": "preempted", "ts": t0_us + 45_000.0})
    if governor:
        for k, (phase, dur) in enumerate((("forward", 600_000.0), ("backward", 500_000.0), ("idle", 700_000.0),
                                          ("forward", 200_000.0))):
            events.append({"ph": "X", "pid": 4, "tid": 1, "name": phase,
                           "ts": t0_us + sum((600_000.0, 500_000.0, 700_000.0)[:k]), "dur": dur})
    if replans:
        events.append({"ph": "i", "s": "g", "pid": 0, "tid": 0, "name": "replan", "ts": t0_us + 800_000.0,
                       "args": {"reason": "thermal: bigcore0 near its trip"}})
        events.append({"ph": "i", "s": "g", "pid": 0, "tid": 0, "name": "replan", "ts": t0_us + 1_500_000.0,
                       "args": {"reason": "drift: npu 1.6x slower than planned"}})
    if counters:
        for i in range(21):
            ts = t0_us + i * 100_000.0
            for dom, base in (("cpu-little", 1800), ("cpu-big0", 2400), ("cpu-big1", 2400), ("npu", 1000)):
                mhz = base if i < 8 else base * 0.6
                events.append({"ph": "C", "pid": 5, "name": f"freq {dom}", "ts": ts, "args": {"MHz": mhz}})
            for zone, start_c in (("soc-thermal", 45.0), ("bigcore0-thermal", 50.0), ("npu-thermal", 42.0)):
                events.append({"ph": "C", "pid": 5, "name": f"temp {zone}", "ts": ts,
                               "args": {"C": start_c + 25 * (1 - math.exp(-i / 6))}})
            for rail, w in (("vdd_cpu_big", 3.0), ("vdd_npu", 1.5)):
                events.append({"ph": "C", "pid": 5, "name": f"power {rail}", "ts": ts,
                               "args": {"W": w * (1.0 if i < 8 else 0.7)}})
    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if counters:
        doc["otherData"] = {"trips": {"soc-thermal": 85.0, "bigcore0-thermal": {"passive": 75.0}}}
    return doc


def _write(tmp_path: Path, doc: Any, name: str = "trace.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# -- reading ------------------------------------------------------------------------------------


def test_parse_full_trace_rows_counters_phases_replans() -> None:
    view = parse_trace(synthetic_trace(), source="t.json")
    assert view.devices == DEVICES
    device_rows = [r for r in view.rows if r.kind == "device"]
    assert [r.label for r in device_rows] == list(DEVICES)
    assert view.stage_runs == 80
    assert view.failed_runs == 1
    failed = [s for r in device_rows for s in r.spans if s.failed]
    assert failed[0].name == "stage2" and failed[0].start_s == pytest.approx((7 * 90_000 + 50_000) / 1e6)
    # Time is seconds from the first event, not the trace's raw microseconds.
    assert device_rows[0].spans[0].start_s == 0.0
    assert view.end_s == pytest.approx(2.0)
    transfers = [r for r in view.rows if r.kind == "transfer"]
    assert [r.label for r in transfers] == ["channel host->npu"] and len(transfers[0].spans) == 20
    assert transfers[0].marks_s == pytest.approx((0.045,))
    assert [s.name for s in view.clocks] == ["cpu-big0", "cpu-big1", "cpu-little", "npu"]
    assert view.clocks[2].values[0] == 1800 and view.clocks[2].values[-1] == pytest.approx(1080)
    assert [s.name for s in view.temps] == ["bigcore0-thermal", "npu-thermal", "soc-thermal"]
    assert [s.name for s in view.power] == ["vdd_cpu_big", "vdd_npu"]
    assert dict(view.trips_c) == {"bigcore0-thermal": 75.0, "soc-thermal": 85.0}
    assert [p.name for p in view.phases] == ["forward", "backward", "idle", "forward"]
    assert [r.label for r in view.replans] == ["thermal: bigcore0 near its trip",
                                               "drift: npu 1.6x slower than planned"]
    assert view.replans[0].time_s == pytest.approx(0.8)


def test_parse_without_telemetry_or_governor() -> None:
    view = parse_trace(synthetic_trace(counters=False, governor=False, replans=False))
    assert view.clocks == view.temps == view.power == ()
    assert view.phases == () and view.replans == () and view.trips_c == ()
    assert view.stage_runs == 80


def test_parse_tolerates_missing_metadata_and_bare_event_list() -> None:
    events = [{"ph": "X", "pid": 7, "tid": 1, "name": "s0", "ts": 100, "dur": 50},
              {"ph": "X", "pid": 7, "tid": 2, "name": "s1", "ts": 120, "dur": 50},
              {"ph": "C", "pid": 7, "name": "temp cpu", "ts": 100, "args": {"value": 40, "passive_C": 80}}]
    view = parse_trace(events)
    assert [r.label for r in view.rows] == ["pid 7 [tid 1]", "pid 7 [tid 2]"]
    assert view.temps[0].values == (40.0,) and dict(view.trips_c) == {"cpu": 80.0}


def test_idle_devices_sort_index_compile_rows_and_board_trips() -> None:
    events = [
        {"ph": "M", "pid": 20, "name": "process_name", "args": {"name": "device npu"}},
        {"ph": "M", "pid": 20, "name": "process_sort_index", "args": {"sort_index": 2}},
        {"ph": "M", "pid": 30, "name": "process_name", "args": {"name": "device big"}},
        {"ph": "M", "pid": 30, "name": "process_sort_index", "args": {"sort_index": 1}},
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "compile"}},
        {"ph": "X", "pid": 5, "tid": 1, "name": "compile stage0", "ts": 0, "dur": 40},
        {"ph": "X", "pid": 20, "tid": 2, "name": "stage0", "ts": 50, "dur": 10},
        {"ph": "C", "pid": 1, "name": "temp npu-thermal", "ts": 0, "args": {"C": 30}},
    ]
    doc = {"traceEvents": events, "otherData": {"board": {"zones": {
        "npu-thermal": {"passive_trip_c": 75.0, "critical_trip_c": 115.0},
        "gpu-thermal": {"passive_trip_c": None}}}}}
    view = parse_trace(doc)
    # The sort index puts "big" first although its pid is larger; the idle device still has a row.
    assert [(r.label, r.kind, len(r.spans)) for r in view.rows] == [("big", "device", 0), ("npu", "device", 1),
                                                                      ("compile", "compile", 1)]
    assert view.devices == ("big", "npu") and view.busy_devices == ("npu",) and view.stage_runs == 1
    assert dict(view.trips_c) == {"npu-thermal": 75.0}


def test_trace_cut_short_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    text = json.dumps(synthetic_trace(counters=False))
    cut = text[: text.rindex("]")].rstrip() + ","  # a writer killed before closing the list
    p = tmp_path / "cut.json"
    p.write_text(cut)
    view = load_trace(p)
    assert view.stage_runs == 80


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('{"foo": 1}', "no 'traceEvents' list"),
        ('{"traceEvents": [1, 2]}', "event 0 is not a JSON object"),
        ('{"traceEvents": [{"ph": "X", "name": "s", "ts": "soon", "dur": 3}]}', "no numeric 'ts'"),
        ('{"traceEvents": [{"ph": "M", "name": "process_name", "args": {"name": "x"}}]}', "no timed events"),
    ],
)
def test_malformed_trace_raises_profile_error_naming_file(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "broken-trace.json"
    p.write_text(content)
    with pytest.raises(ProfileError) as info:
        load_trace(p)
    assert str(p) in str(info.value) and needle in str(info.value)
    assert isinstance(info.value, HetschedError)


def test_missing_trace_file_raises_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nowhere\.json"):
        load_trace(tmp_path / "nowhere.json")


# -- drawing ------------------------------------------------------------------------------------


def test_plot_full_trace_writes_png(tmp_path: Path) -> None:
    out = tmp_path / "full.png"
    view = plot_trace(_write(tmp_path, synthetic_trace()), out, width_in=10.0, dpi=100)
    width, height = _png_size(out)
    assert width == 1000
    # Four panels (clocks, temperatures, power, timeline) make a taller figure than the timeline alone.
    assert height > 600
    assert view.stage_runs == 80
    assert out.stat().st_size > 20_000


def test_plot_without_counters_or_governor_is_a_shorter_png(tmp_path: Path) -> None:
    full, bare = tmp_path / "full.png", tmp_path / "bare.png"
    plot_trace(_write(tmp_path, synthetic_trace(), "a.json"), full, width_in=10.0, dpi=100)
    plot_trace(_write(tmp_path, synthetic_trace(counters=False, governor=False, replans=False), "b.json"), bare,
               width_in=10.0, dpi=100)
    (w_full, h_full), (w_bare, h_bare) = _png_size(full), _png_size(bare)
    assert w_full == w_bare == 1000
    assert h_bare < h_full


def test_plot_counters_only_trace(tmp_path: Path) -> None:
    doc = synthetic_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    out = tmp_path / "counters.png"
    view = plot_trace(_write(tmp_path, doc), out, dpi=50)
    assert view.rows == () and view.clocks
    _png_size(out)


def test_plot_svg_by_suffix(tmp_path: Path) -> None:
    out = tmp_path / "t.svg"
    plot_trace(_write(tmp_path, synthetic_trace(counters=False)), out, dpi=50)
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_render_rejects_bad_size_and_empty_window(tmp_path: Path) -> None:
    view = parse_trace(synthetic_trace(counters=False))
    with pytest.raises(ValueError, match="width"):
        render_trace(view, tmp_path / "x.png", width_in=0.0)
    with pytest.raises(ValueError, match="window"):
        render_trace(view, tmp_path / "x.png", window_s=(1.0, 0.5))
    assert not (tmp_path / "x.png").exists()


def test_window_leaving_replans_out_keeps_the_layout(tmp_path: Path) -> None:
    # Both re-plans (0.8 s, 1.5 s) lie outside: their numbers must not be drawn beyond the axes
    # (matplotlib would warn that the layout collapsed; warnings are errors in this suite).
    out = tmp_path / "window.png"
    view = render_trace(parse_trace(synthetic_trace()), out, width_in=10.0, dpi=60, window_s=(0.0, 0.5))
    assert view == out
    assert _png_size(out)[0] == 600


def test_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    # A None entry in sys.modules makes the import fail as if the package were absent.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(BackendUnavailableError, match=r"hetsched\[plot\]"):
        plot_trace(_write(tmp_path, synthetic_trace(counters=False)), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_plot_a_real_session_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetsched.testing import build_board_tree

    root = build_board_tree(tmp_path / "rk3588", "rk3588")
    trace, out = tmp_path / "run.json", tmp_path / "run.png"
    assert main(["run", "light_squeezenet", "--root", str(root), "--requests", "3", "--max-unit-nodes", "8",
                 "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["plot", str(trace), "-o", str(out), "--dpi", "60"]) == 0
    view = load_trace(trace)
    assert view.stage_runs >= 3 and view.busy_devices
    assert {"cluster0", "npu"} <= set(view.devices)  # the Mali only with ncnn on a hardware Vulkan driver
    # A twin root has telemetry: every kind of counter is there, and the board's passive trip.
    assert view.clocks and view.temps and view.power and view.trips_c
    _png_size(out)


# -- the command --------------------------------------------------------------------------------


def test_cli_plot_writes_png_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.png"
    assert main(["plot", str(_write(tmp_path, synthetic_trace())), "-o", str(out), "--width", "8", "--dpi", "80"]) == 0
    assert _png_size(out)[0] == 640
    said = capsys.readouterr().out
    assert "80 stage runs on 3 of 3 devices (1 failed)" in said and "2 re-plans" in said and "4 governor phases" in said


def test_cli_plot_bad_trace_is_an_error_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    assert main(["plot", str(bad), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "ProfileError" in err and str(bad) in err
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_rejects_an_empty_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.png"
    assert main(["plot", str(_write(tmp_path, synthetic_trace())), "-o", str(out), "--from", "3", "--to", "2"]) == 2
    assert "--to 2 must be after --from 3" in capsys.readouterr().err
    assert not out.exists()


def test_cli_plot_rejects_non_positive_width(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plot", "t.json", "-o", str(tmp_path / "x.png"), "--width", "-1"])
    assert info.value.code == 2
    assert "positive" in capsys.readouterr().err
