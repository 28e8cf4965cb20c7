"""Compile caches verify content, never follow links, and replace a bad entry (issue 23, item 2).

No toolkit needed: the RKNN cache (hetsched._rknn.cache), the board's manifest
(hetsched._rknn.manifest) and the TensorRT engine cache (backends/_tensorrt_cache.py) are
driven directly, with files tampered in place, swapped for links, or whole folders linked out.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from hetsched._errors import CompileError
from hetsched._rknn.cache import CompileCache, Verdict, stage_key
from hetsched._rknn.manifest import ManifestEntry, board_rknn_path, model_sha256, write_manifest
from hetsched.backends._tensorrt_cache import EngineCache

BASE: dict[str, Any] = {"toolkit_version": "2.5.0", "target": "rk3588", "float_dtype": "float16"}
MODEL = b"\x08\x07" + bytes(range(200))  # stands for a prepared, serialized stage


def _converted(cache: CompileCache, model: bytes = MODEL, rknn: bytes = b"RKNN" * 64) -> str:
    """An entry as a successful conversion leaves it: the .onnx, the exported .rknn, the verdict."""
    key = stage_key(model, **BASE)
    cache.put_model(key, model)
    tmp = cache.temp_rknn_path(key)
    tmp.write_bytes(rknn)
    cache.store(key, Verdict(True, "", 1.0, "2.5.0", "rk3588"), tmp)
    return key


def _same_size_tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # "weights negated": same size, other bytes
    path.write_bytes(bytes(data))


def test_onnx_changed_in_place_with_the_same_size_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = CompileCache(tmp_path / "c")
    key = _converted(cache)
    onnx = cache.onnx_path(key)
    _same_size_tamper(onnx)
    with caplog.at_level(logging.WARNING, logger="hetsched.cache"):
        path = cache.put_model(key, MODEL)
    assert path.read_bytes() == MODEL  # the toolkit is handed the true stage, not the tampered one
    assert cache.statistics().rejected == 1
    assert any(str(onnx) in r.getMessage() and "sha256" in r.getMessage() for r in caplog.records)


def test_rknn_changed_in_place_is_a_miss_and_converted_again(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "c")
    key = _converted(cache)
    assert cache.lookup(key) is not None
    _same_size_tamper(cache.rknn_path(key))
    assert cache.lookup(key) is None  # not a hit: the caller converts again
    assert not cache.rknn_path(key).exists() and cache.statistics().rejected == 1
    # the fresh conversion replaces the entry and is a hit again
    _converted(cache)
    assert cache.lookup(key) is not None


def test_cached_files_replaced_by_links_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = CompileCache(tmp_path / "c")
    key = _converted(cache)
    # a same-bytes file outside: even content that would verify is not read through a link
    (outside / "stage.onnx").write_bytes(MODEL)
    (outside / "stage.rknn").write_bytes(cache.rknn_path(key).read_bytes())
    for own, target in ((cache.onnx_path(key), outside / "stage.onnx"), (cache.rknn_path(key), outside / "stage.rknn")):
        own.unlink()
        own.symlink_to(target)
    assert cache.lookup(key) is None  # the .rknn link: rejected
    path = cache.put_model(key, MODEL)
    assert not path.is_symlink() and path.read_bytes() == MODEL
    # the targets outside are untouched
    assert (outside / "stage.onnx").read_bytes() == MODEL and (outside / "stage.rknn").exists()
    assert cache.statistics().rejected == 2


def test_a_linked_cache_subfolder_gets_nothing_written_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = CompileCache(tmp_path / "c")
    key = stage_key(MODEL, **BASE)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / key[:2]).symlink_to(outside, target_is_directory=True)
    assert cache.lookup(key) is None
    cache.put_model(key, MODEL)
    tmp = cache.temp_rknn_path(key)
    tmp.write_bytes(b"rknn")
    cache.store(key, Verdict(True, "", 1.0, "2.5.0", "rk3588"), tmp)
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert not (tmp_path / "c" / key[:2]).is_symlink()
    assert cache.lookup(key) is not None
    assert cache.statistics().rejected >= 1


def test_a_cached_refusal_says_it_is_cached_and_names_its_file(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "c")
    key = stage_key(MODEL, **BASE)
    cache.store(key, Verdict(False, "Not support 'Dropout' of opset-9!", 0.2, "2.5.0", "rk3588"))
    refusal = cache.lookup(key)
    assert refusal is not None and not refusal.ok
    assert "cached refusal" in refusal.message and str(cache.verdict_path(key)) in refusal.message
    assert refusal.message.endswith("Not support 'Dropout' of opset-9!")
    # the file keeps the toolkit's own words, once
    assert json.loads(cache.verdict_path(key).read_text())["message"] == "Not support 'Dropout' of opset-9!"


def _manifest(tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / "out"
    cache = CompileCache(out)
    key = _converted(cache)
    write_manifest(out, [ManifestEntry(name="s0", device="npu", model_sha256=model_sha256(MODEL), cache_key=key,
                                       precision="float16", target="rk3588", rknn=f"{key[:2]}/{key}.rknn")],
                   model="m.onnx", target="rk3588", toolkit_version="2.5.0")
    return out, key


def test_the_board_verifies_its_rknn_against_the_manifest(tmp_path: Path) -> None:
    out, key = _manifest(tmp_path)
    assert board_rknn_path(out, MODEL, target="rk3588") == out / key[:2] / f"{key}.rknn"
    _same_size_tamper(out / key[:2] / f"{key}.rknn")
    with pytest.raises(CompileError, match="sha256"):
        board_rknn_path(out, MODEL, target="rk3588")


def test_the_board_never_loads_an_rknn_through_a_link(tmp_path: Path) -> None:
    out, key = _manifest(tmp_path)
    rknn = out / key[:2] / f"{key}.rknn"
    elsewhere = tmp_path / "elsewhere.rknn"
    elsewhere.write_bytes(rknn.read_bytes())
    rknn.unlink()
    rknn.symlink_to(elsewhere)
    with pytest.raises(CompileError, match="link"):
        board_rknn_path(out, MODEL, target="rk3588")
    assert elsewhere.exists()


def test_the_manifest_records_each_rknn_sha256(tmp_path: Path) -> None:
    out, key = _manifest(tmp_path)
    data = json.loads((out / "manifest.json").read_text())
    import hashlib

    assert data["stages"][0]["rknn_sha256"] == hashlib.sha256((out / key[:2] / f"{key}.rknn").read_bytes()).hexdigest()


# -- TensorRT ------------------------------------------------------------------------------------


def test_an_engine_changed_in_place_is_a_miss(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "t")
    key = "ab" * 32
    cache.store(key, b"ENGINE" * 50, "", 1.0)
    assert cache.lookup(key) == b"ENGINE" * 50
    _same_size_tamper(cache.engine_path(key))
    assert cache.lookup(key) is None
    assert cache.statistics().rejected == 1


def test_an_engine_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "t")
    key = "cd" * 32
    cache.store(key, b"ENGINE", "", 1.0)
    elsewhere = tmp_path / "elsewhere.engine"
    elsewhere.write_bytes(b"ENGINE")
    cache.engine_path(key).unlink()
    cache.engine_path(key).symlink_to(elsewhere)
    assert cache.lookup(key) is None
    assert elsewhere.read_bytes() == b"ENGINE"


def test_a_linked_engine_subfolder_gets_nothing_written_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    key = "ef" * 32
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / key[:2]).symlink_to(outside, target_is_directory=True)
    cache = EngineCache(tmp_path / "t")
    cache.store(key, b"ENGINE", "", 1.0)
    assert list(outside.iterdir()) == []
    assert cache.lookup(key) == b"ENGINE"


def test_a_cached_engine_refusal_says_it_is_cached(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path / "t")
    key = "12" * 32
    cache.store(key, None, "unsupported op NonZero", 0.5)
    msg = cache.lookup(key)
    assert isinstance(msg, str) and "cached refusal" in msg and str(tmp_path / "t") in msg
    assert msg.endswith("unsupported op NonZero")


def test_nothing_is_left_but_the_entries(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "c")
    key = _converted(cache)
    names = sorted(os.listdir(tmp_path / "c" / key[:2]))
    assert names == sorted([f"{key}.onnx", f"{key}.rknn", f"{key}.json"])


# -- the INT8 calibration dataset kept under the cache ---------------------------------------------


def _calibration_set():  # type: ignore[no-untyped-def]
    import numpy as np
    from onnx import TensorProto, helper

    from hetsched._rknn.calibrate import CalibrationSet

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return CalibrationSet(model, [{"x": np.full((1, 4), k, np.float32)} for k in range(3)])


def test_the_calibration_dataset_is_verified_and_written_inside_the_cache(tmp_path: Path) -> None:
    import numpy as np

    cal = _calibration_set()
    cache = tmp_path / "c"
    dataset, digest = cal.write_dataset(cache, ["x"])
    first = dataset.read_text()
    npy = Path(first.split()[1])
    assert np.load(npy)[0, 0] == 1.0
    _same_size_tamper(npy)  # changed in place, same size: written again
    assert cal.write_dataset(cache, ["x"]) == (dataset, digest)
    assert np.array_equal(np.load(npy), np.full((1, 4), 1.0, np.float32)) and dataset.read_text() == first
    # the digest's folder linked out of the cache: replaced, nothing written outside
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = cache / "calibration" / digest[:2]
    for p in sorted(folder.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    cal.write_dataset(cache, ["x"])
    assert list(outside.iterdir()) == [] and not folder.is_symlink()
    assert np.array_equal(np.load(npy), np.full((1, 4), 1.0, np.float32))
