"""A full disk while tracing (issue 23, item 5): the trace ends validly where it can, or says
exactly where it stops; the session raises a TraceWriteError naming the file after every request
was answered; the CLI prints one line. The disk is an injected file object that takes at most
``capacity`` bytes (a write past it is partial, then ``ENOSPC``; ``truncate`` frees space)."""

from __future__ import annotations

import errno
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched import HetschedError, Session, TraceWriteError
from hetsched._cli._plot_trace import load_trace
from hetsched._session._trace_writer import TraceWriter

F = TensorProto.FLOAT


class FullDisk(io.RawIOBase):
    """A file on a disk with ``capacity`` bytes free for it."""

    def __init__(self, path: str, capacity: int):
        self._f = open(path, "wb", buffering=0)  # noqa: SIM115
        self.capacity = capacity
        self.size = 0
        self.failed = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        room = self.capacity - self.size
        if room <= 0:
            self.failed += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self._f.write(data[:room]) or 0
        self.size += n
        return n

    def truncate(self, size: int | None = None) -> int:
        assert size is not None
        self.size = self._f.truncate(size)
        return self.size

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def close(self) -> None:
        self._f.close()
        super().close()


def _events(n: int) -> list[dict[str, Any]]:
    return [{"ph": "X", "name": f"stage {k}", "pid": 1, "tid": 1, "ts": float(k), "dur": 1.0,
             "args": {"pad": "x" * 40}} for k in range(n)]


def _writer(path: Path, capacity: int) -> tuple[TraceWriter, list[FullDisk]]:
    disks: list[FullDisk] = []

    def opener(p: str) -> FullDisk:
        disks.append(FullDisk(p, capacity))
        return disks[-1]

    return TraceWriter(path, flush_events=4, opener=opener), disks  # type: ignore[arg-type]


def test_a_disk_that_fills_mid_record_still_gets_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w, disks = _writer(path, capacity=900)  # room for about 8 events, the 9th is cut mid-record
    w.open()
    for ev in _events(40):
        w.emit(ev)
    w.close({"generator": "test"})
    doc = json.loads(path.read_text())  # valid JSON: cut back to the last whole event, tail written
    n = len(doc["traceEvents"])
    assert 0 < n < 40 and [e["name"] for e in doc["traceEvents"]] == [f"stage {k}" for k in range(n)]
    assert doc["otherData"]["events"] == n and doc["otherData"]["dropped_events"] == 40 - n
    assert "No space left on device" in doc["otherData"]["write_error"]
    err = w.failure
    assert isinstance(err, TraceWriteError) and isinstance(err, HetschedError) and isinstance(err, OSError)
    assert err.complete and err.path == str(path) and str(path) in str(err) and err.events_written == n
    assert "valid JSON" in str(err) and err.size == path.stat().st_size
    assert disks[0].failed >= 1 and w.statistics().error is not None


def test_a_disk_with_no_room_for_the_tail_says_where_the_file_stops(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w, _ = _writer(path, capacity=300)  # the head and a few events; the 50-byte pieces then do not fit
    w.open()
    for ev in _events(40):
        w.emit(ev)
    w.close({"generator": "test", "pad": "y" * 400})  # a tail larger than any room left
    err = w.failure
    assert isinstance(err, TraceWriteError) and not err.complete
    data = path.read_bytes()
    assert err.size == len(data) and f"at byte {len(data)}" in str(err)
    assert f"after {err.events_written} whole events" in str(err)
    assert data.endswith(b"}")  # ends after a whole event, never inside one
    # a cut trace reads to where it stops
    view = load_trace(path)
    assert view.stage_runs == err.events_written > 0


def test_a_healthy_disk_sets_no_failure(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    w, _ = _writer(path, capacity=1 << 20)
    w.open()
    for ev in _events(10):
        w.emit(ev)
    w.close()
    assert w.failure is None and len(json.loads(path.read_text())["traceEvents"]) == 10


def test_a_disk_full_from_the_start_fails_the_open_naming_the_file(tmp_path: Path) -> None:
    w, _ = _writer(tmp_path / "t.json", capacity=10)
    with pytest.raises(TraceWriteError, match=r"t\.json"):
        w.open()


def _cnn() -> onnx.ModelProto:
    w = helper.make_tensor("w", F, [4, 3, 3, 3], np.full(108, 0.1, np.float32).tobytes(), raw=True)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", F, [1, 4, 16, 16])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


@pytest.fixture
def small_disk(monkeypatch: pytest.MonkeyPatch) -> list[FullDisk]:
    import hetsched._session._trace_writer as tw

    disks: list[FullDisk] = []

    def opener(p: str) -> FullDisk:
        disks.append(FullDisk(p, 700))
        return disks[-1]

    monkeypatch.setattr(tw, "_open_binary", opener)
    return disks


@pytest.mark.anyio
async def test_leaving_a_session_on_a_full_disk_raises_a_trace_write_error(tmp_path: Path, anyio_backend: str,
                                                                           small_disk: list[FullDisk]) -> None:
    path = tmp_path / "run.json"
    x = np.ones((1, 3, 16, 16), np.float32)
    results = []
    with pytest.raises(TraceWriteError) as info:
        async with Session(_cnn(), devices=["cpu:0"], trace=path) as s:
            for _ in range(20):
                results.append((await s.run({"x": x}))["y"])
    assert len(results) == 20 and all(np.allclose(r, results[0]) for r in results)  # results unaffected
    err = info.value
    assert str(path) in str(err) and small_disk and small_disk[0].failed >= 1
    if err.complete:
        json.loads(path.read_text())
    else:
        assert path.stat().st_size == err.size


@pytest.mark.anyio
async def test_a_session_error_is_not_masked_by_the_trace(tmp_path: Path, anyio_backend: str,
                                                          small_disk: list[FullDisk]) -> None:
    x = np.ones((1, 3, 16, 16), np.float32)
    with pytest.raises(RuntimeError, match="boom"):
        async with Session(_cnn(), devices=["cpu:0"], trace=tmp_path / "run.json") as s:
            for _ in range(20):
                await s.run({"x": x})
            raise RuntimeError("boom")


def test_cli_run_on_a_full_disk_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                small_disk: list[FullDisk]) -> None:
    from hetsched._cli import main

    model = tmp_path / "cnn.onnx"
    onnx.save(_cnn(), model)
    path = tmp_path / "cli.json"
    assert main(["run", str(model), "--devices", "cpu:0", "--requests", "20", "--trace", str(path)]) == 1
    err = capsys.readouterr().err
    assert "TraceWriteError" in err and str(path) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
