"""The content-addressed compile cache of converted RKNN stages (no toolkit needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetsched._rknn.cache import CompileCache, Verdict, calibration_hash, default_cache_dir, stage_key

BASE: dict[str, Any] = {"toolkit_version": "2.5.0", "target": "rk3588", "float_dtype": "float16"}


def test_key_covers_every_setting() -> None:
    k = stage_key(b"model", **BASE)
    assert k == stage_key(b"model", **BASE) and len(k) == 64
    others = [
        stage_key(b"model2", **BASE),
        stage_key(b"model", **{**BASE, "toolkit_version": "2.3.2"}),
        stage_key(b"model", **{**BASE, "target": "rk3576"}),
        stage_key(b"model", **{**BASE, "float_dtype": "float32"}),
        stage_key(b"model", **BASE, quantize=True, quantized_dtype="w8a8"),
        stage_key(b"model", **BASE, quantize=True, quantized_dtype="w8a8", calibration="ab"),
        stage_key(b"model", **BASE, quantize=True, quantized_dtype="w8a8", quantized_algorithm="kl_divergence"),
    ]
    assert len({k, *others}) == len(others) + 1
    # quantisation details do not matter when not quantising
    assert stage_key(b"model", **BASE, calibration="ab") == k


def test_calibration_hash_follows_the_listed_files(tmp_path: Path) -> None:
    for i in range(2):
        np.save(tmp_path / f"c{i}.npy", np.full((1, 3), i, np.float32))
    ds = tmp_path / "dataset.txt"
    ds.write_text("c0.npy\nc1.npy\n")
    h = calibration_hash(ds)
    assert h == calibration_hash(ds) and calibration_hash(None) is None
    np.save(tmp_path / "c1.npy", np.full((1, 3), 7, np.float32))
    assert calibration_hash(ds) != h


def test_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETSCHED_RKNN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "hetsched" / "rknn-cache"
    monkeypatch.setenv("HETSCHED_RKNN_CACHE", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    assert default_cache_dir({"cache_dir": str(tmp_path / "opt")}) == tmp_path / "opt"


def test_entries_round_trip_and_count(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "c")
    ok, bad = stage_key(b"a", **BASE), stage_key(b"b", **BASE)
    assert cache.lookup(ok) is None
    assert cache.put_model(ok, b"onnx-bytes").read_bytes() == b"onnx-bytes"
    tmp = cache.temp_rknn_path(ok)
    tmp.write_bytes(b"rknn")
    cache.store(ok, Verdict(True, "", 1.5, "2.5.0", "rk3588"), tmp)
    assert not tmp.exists() and cache.rknn_path(ok).read_bytes() == b"rknn"
    cache.store(bad, Verdict(False, "Not support 'Dropout' of opset-9!", 0.25, "2.5.0", "rk3588"))
    assert cache.lookup(ok) == Verdict(True, "", 1.5, "2.5.0", "rk3588")
    refusal = cache.lookup(bad)
    assert refusal is not None and not refusal.ok and "opset-9" in refusal.message
    s = cache.statistics()
    assert (s.conversions, s.cache_hits, s.refusals_cached, s.seconds) == (2, 2, 1, 1.75)
    # nothing but the entries (no temporary files) and all of it under the cache directory
    files = sorted(p.relative_to(tmp_path / "c").as_posix() for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert files == sorted([f"{ok[:2]}/{ok}.onnx", f"{ok[:2]}/{ok}.rknn", f"{ok[:2]}/{ok}.json",
                            f"{bad[:2]}/{bad}.json"])


def test_a_success_whose_rknn_is_gone_is_a_miss(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    k = stage_key(b"a", **BASE)
    tmp = cache.temp_rknn_path(k)
    cache.store(k, Verdict(True, "", 1.0, "2.5.0", "rk3588"), tmp)
    cache.rknn_path(k).unlink()
    assert cache.lookup(k) is None
    (tmp_path / k[:2] / f"{k}.json").write_text("{not json")
    assert cache.lookup(k) is None and cache.statistics().cache_hits == 0


def test_keys_cannot_name_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cache key"):
        CompileCache(tmp_path).onnx_path("../" + "0" * 61)
