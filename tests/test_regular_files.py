"""Files a user names are read only when they are regular files, and bounded (issue 23, items 4, 11).

A FIFO used to hang ``plan``, ``Session`` and ``plot`` forever and ``/dev/zero`` grew without end;
external data that is a FIFO or a link to ``/dev/zero`` was reported as missing. Each FIFO here has
a helper thread that keeps opening its write end (non-blocking) and closing it, so a reader that
does block on it is released with an empty read: a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched._cli import main as cli
from hetsched._cli._plot_trace import load_trace
from hetsched._errors import HetschedError, ModelNotFoundError, NotRegularFileError, ProfileError
from hetsched._planning.model import load_model
from hetsched._platform.files import read_regular_file
from hetsched._rknn.cache import calibration_hash
from hetsched._rknn.calibrate import load_calibration_dir

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"),
                                reason="needs POSIX FIFOs and /dev/zero")


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    done = threading.Event()

    def release_readers() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):  # no reader (ENXIO): nothing blocked
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            done.wait(0.01)

    t = threading.Thread(target=release_readers, daemon=True)
    t.start()
    yield path
    done.set()
    t.join()


def _model_with_external_data(tmp_path: Path) -> Path:
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], np.arange(4, dtype=np.float32).tobytes(), raw=True)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)
    assert (tmp_path / "m.data").is_file()
    return path


def test_the_helper_refuses_what_is_not_a_regular_file(fifo: Path, tmp_path: Path) -> None:
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"), (tmp_path, "a directory")):
        with pytest.raises(NotRegularFileError) as info:
            read_regular_file(path, what="thing")
        assert str(path) in str(info.value) and info.value.kind == kind and isinstance(info.value, HetschedError)
    (tmp_path / "f").write_bytes(b"12345")
    assert read_regular_file(tmp_path / "f") == b"12345"
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "nowhere")


def test_a_model_that_is_a_fifo_is_refused_not_read(fifo: Path) -> None:
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        load_model(str(fifo))


def test_a_model_that_is_dev_zero_or_links_to_it_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.onnx"
    link.symlink_to("/dev/zero")
    for source in ("/dev/zero", str(link)):
        with pytest.raises(NotRegularFileError, match="a character device"):
            load_model(source)


def test_external_data_that_is_a_fifo_is_named_as_one(tmp_path: Path) -> None:
    path = _model_with_external_data(tmp_path)
    assert load_model(str(path)).graph.initializer[0].raw_data  # loads as it is
    (tmp_path / "m.data").unlink()
    os.mkfifo(tmp_path / "m.data")
    with pytest.raises(NotRegularFileError) as info:
        load_model(str(path))
    assert "a FIFO" in str(info.value) and "does not exist" not in str(info.value)
    assert "'m.data'" in str(info.value)


def test_external_data_linked_to_dev_zero_is_named_as_a_device(tmp_path: Path) -> None:
    path = _model_with_external_data(tmp_path)
    (tmp_path / "m.data").unlink()
    (tmp_path / "m.data").symlink_to("/dev/zero")
    with pytest.raises(NotRegularFileError) as info:
        load_model(str(path))
    assert "a character device" in str(info.value) and "/dev/zero" in str(info.value)
    assert "does not exist" not in str(info.value)


def test_missing_external_data_is_still_reported_missing(tmp_path: Path) -> None:
    path = _model_with_external_data(tmp_path)
    (tmp_path / "m.data").unlink()
    with pytest.raises(ModelNotFoundError, match="does not exist next to the model"):
        load_model(str(path))


def test_a_trace_that_is_a_fifo_is_refused(fifo: Path) -> None:
    with pytest.raises(NotRegularFileError, match="trace file"):
        load_trace(fifo)


def test_a_missing_trace_says_it_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist") as info:
        load_trace(tmp_path / "missing.json")
    assert "traceEvents" not in str(info.value)


def test_cli_plan_and_plot_refuse_a_fifo_in_one_line(fifo: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["plot", str(fifo), "-o", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "NotRegularFileError" in err and str(fifo) in err and "Traceback" not in err
    assert cli(["plan", "/dev/zero"]) == 1
    err = capsys.readouterr().err
    assert "NotRegularFileError" in err and "/dev/zero" in err and "Traceback" not in err


def test_calibration_files_that_are_not_regular_are_refused(fifo: Path, tmp_path: Path) -> None:
    cal = tmp_path / "cal"
    cal.mkdir()
    np.save(cal / "0.npy", np.zeros((1, 4), np.float32))
    (cal / "1.npy").symlink_to(fifo)
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        load_calibration_dir(cal, ["x"])
    (cal / "1.npy").unlink()
    assert len(load_calibration_dir(cal, ["x"])) == 1
    # the toolkit's dataset file, and the files it lists, hashed for the cache key
    ds = tmp_path / "dataset.txt"
    ds.write_text(f"{cal / '0.npy'}\n{fifo}\n")
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        calibration_hash(ds)
    with pytest.raises(NotRegularFileError):
        calibration_hash(fifo)
