"""``hetsched compile`` with the real toolkit, and the board path's choice of ``.rknn`` from the manifest.

The board path itself (rknn-toolkit-lite2, aarch64 with an NPU) cannot run here; what it
would load is decided by ``board_rknn_path`` (tested below on a manifest and files).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from hetsched import BackendUnavailableError, CompileError
from hetsched._cli import main as cli
from hetsched._rknn.manifest import ManifestEntry, board_rknn_path, model_sha256, select_entry, write_manifest
from hetsched.testing import with_seeded_weights

pytestmark = pytest.mark.timeout(600)


def _toolkit_or_skip() -> None:
    try:
        from hetsched._rknn.env import find_toolkit_python

        find_toolkit_python()
    except BackendUnavailableError as exc:
        pytest.skip(f"no rknn-toolkit2 environment: {exc}")


def _entry(name: str, sha: str, precision: str, rknn: str) -> ManifestEntry:
    return ManifestEntry(name=name, device="npu", model_sha256=sha, cache_key="k" * 64, precision=precision,
                         target="rk3588", rknn=rknn)


def test_board_path_selects_the_file_of_the_stage_model(tmp_path: Path) -> None:
    a, b = b"stage a bytes", b"stage b bytes"
    entries = [_entry("s0", model_sha256(a), "float16", "aa/a16.rknn"), _entry("s0", model_sha256(a), "int8",
               "aa/a8.rknn"), _entry("s1", model_sha256(b), "int8", "bb/b8.rknn")]
    for e in entries:
        (tmp_path / e.rknn).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / e.rknn).write_bytes(b"rknn")
    write_manifest(tmp_path, entries, model="m.onnx", target="rk3588", toolkit_version="2.5.0")
    assert board_rknn_path(tmp_path, a, target="rk3588") == tmp_path / "aa/a16.rknn"  # float16 by default
    assert board_rknn_path(tmp_path, a, target="rk3588", precision="int8") == tmp_path / "aa/a8.rknn"
    assert board_rknn_path(tmp_path, b, target="rk3588") == tmp_path / "bb/b8.rknn"  # the only one
    with pytest.raises(CompileError, match="no entry"):
        board_rknn_path(tmp_path, b"another split", target="rk3588")
    with pytest.raises(CompileError, match="no entry"):
        select_entry(entries, model_sha256(b), target="rk3576")
    (tmp_path / "bb/b8.rknn").unlink()
    with pytest.raises(CompileError, match="missing"):
        board_rknn_path(tmp_path, b, target="rk3588")
    with pytest.raises(CompileError, match="hetsched compile"):
        board_rknn_path(tmp_path / "nowhere", a, target="rk3588")


def test_compile_writes_manifest_and_files_and_a_second_run_converts_nothing(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _toolkit_or_skip()
    model = tmp_path / "sq.onnx"
    onnx.save(with_seeded_weights("light_squeezenet"), model)
    cal = tmp_path / "cal"
    cal.mkdir()
    rng = np.random.default_rng(0)
    for k in range(16):
        np.save(cal / f"{k}.npy", rng.standard_normal((1, 3, 224, 224)).astype(np.float32))
    out = tmp_path / "out"
    argv = ["compile", str(model), "--target", "rk3588", "--int8", "--calibration", str(cal), "--out", str(out)]
    assert cli(argv) == 0
    first = capsys.readouterr().err
    assert "converting 1/" in first and "ETA" in first and " 0 from the cache" in first
    # the quantized model against fp32 onnxruntime, per output (issue 24: INT8 accuracy reported)
    (line,) = [ln for ln in first.splitlines() if ln.startswith("int8 vs fp32 onnxruntime on 4 calibration")]
    cosines = [float(c) for c in re.findall(r"cosine (\d\.\d+), max abs err", line)]
    assert cosines and all(0.99 <= c <= 1.0 for c in cosines), line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["toolkit_version"] and manifest["target"] == "rk3588"
    stages = manifest["stages"]
    assert stages
    for st in stages:
        assert st["precision"] == "int8" and (out / st["rknn"]).is_file()
        assert st["inputs"] and st["outputs"] and all(t["dtype"] == "float32" for t in st["inputs"])
        assert st["accuracy"]["samples"] == 16 and st["accuracy"]["min_cosine"] >= 0.99
    assert cli(argv) == 0
    second = capsys.readouterr().err
    assert "0 converted" in second and "cached" in second
    assert json.loads((out / "manifest.json").read_text())["stages"] == stages
