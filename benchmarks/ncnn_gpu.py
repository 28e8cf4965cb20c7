"""The RK3588's Mali GPU through ncnn over Vulkan: conversion, cache, accuracy, and the twin's plans.

Per model (the light models with seeded random weights): seconds to convert the whole model with
pnnx and open it on this host's Vulkan device through the ``ncnn`` backend (an empty cache; the
backend's compile-time probe included), seconds to open it again from the cache, the cosine
against onnxruntime over seeded random inputs in fp32 and in fp16; then, on an rk3588 twin, the
modelled latency and energy per request of three plans: **NPU-only** (every unit the NPU takes on
the NPU, Rockchip's simulator computing; the rest on a big cluster), **GPU-only** (every unit
ncnn takes on the twin's Mali, ncnn computing on this host's Vulkan device), and **NPU+GPU+CPU**
(the units in topological order, first third on the NPU, second on the GPU, the rest on a big
cluster), each plan's stages, share of analytic FLOPs on the GPU, and cosine vs onnxruntime.

Plus the silent pnnx cases (exit 0, wrong or unloadable output; ``../shared/reference/ncnn.md``,
and a Concat before any op that tells pnnx the batch axis, measured here):
each is compiled; a case that compiles is run and compared, and ``silent_failures_run`` counts the
ones that ran wrong (target 0: every one refused or right).

Targets (reported, not asserted): ``min_cosine_fp32 >= 0.9999``, ``min_cosine_fp16 >= 0.999``,
``silent_failures_run == 0``. The ncnn numbers are measured on this host's Vulkan device (Mesa's
lavapipe here: numerics only, its speed means nothing for a Mali); the twin's times and energy
are modelled. The NPU plans need Rockchip's toolkit environment (``hetsched setup rknn``); without
it they are null with the reason.

    .venv/bin/python benchmarks/ncnn_gpu.py [--models squeezenet shufflenet resnet50] [--inputs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
from _labels import MODELLED, labelled, twin

from hetsched import CompileError, Device, Session, resolve_devices
from hetsched.backends.ncnn import NcnnBackend, vulkan_devices
from hetsched.backends.rknn import toolkit_unavailable_reason
from hetsched.policies import PlacementProblem
from hetsched.testing import build_board_tree, with_seeded_weights

MODELS = ("squeezenet", "shufflenet", "resnet50")
TARGETS = {"min_cosine_fp32": ">= 0.9999", "min_cosine_fp16": ">= 0.999", "silent_failures_run": "== 0"}


def _inputs(model: onnx.ModelProto, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    specs = [(i.name, [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim])
             for i in model.graph.input if i.name not in inits]
    return [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in specs} for _ in range(n)]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def _host_stage(backend: NcnnBackend, model: onnx.ModelProto, precision: str, cache: Path,
                feeds: list[dict[str, np.ndarray]], want: list[list[np.ndarray]]) -> dict[str, Any]:
    """The whole model on the host's Vulkan device: open seconds (convert), cached open, cosine."""
    dev = Device(name="gpu", kind="gpu", backend="ncnn", options={"precision": precision, "cache_dir": str(cache)})
    t0 = time.perf_counter()
    first: Any = backend.compile(model, dev, name="model")
    open_s = time.perf_counter() - t0
    first.close()
    t0 = time.perf_counter()
    stage: Any = backend.compile(model, dev, name="model")
    cached_s = time.perf_counter() - t0
    try:
        cached = stage.statistics().cached
        cos = min(_cosine(g, r) for f, w in zip(feeds, want, strict=True)
                  for g, r in zip(stage.run(f), w, strict=True))
    finally:
        stage.close()
    return {"open_s": round(open_s, 3), "cached_open_s": round(cached_s, 3), "cached": cached, "cosine": cos}


def _modelled_per_request(session: Session) -> tuple[float, float]:
    t = e = 0.0
    for name, x in session.stage_statistics().items():
        if x is None or not hasattr(x, "modelled_time_s"):
            raise RuntimeError(f"stage {name} reports no modelled time")
        if x.runs:
            t += x.modelled_time_s / x.runs
            e += x.modelled_energy_j / x.runs
    return t, e


def _where(order: Callable[[int, int], str]) -> Callable[[PlacementProblem], dict[int, str]]:
    """A policy: unit ``k`` of ``n`` (topological order) on ``order(k, n)`` where it is a candidate,
    else on the big cluster."""
    def place(problem: PlacementProblem) -> dict[int, str]:
        out = {}
        n = len(problem.units)
        for k, u in enumerate(problem.units):
            want = order(k, n)
            out[u.id] = want if want in u.candidates else next(d for d in u.candidates if d.startswith("cluster"))
        return out
    return place


PLANS: dict[str, tuple[tuple[str, ...], Callable[[int, int], str]]] = {
    "npu_only": (("npu",), lambda k, n: "npu"),
    "gpu_only": (("gpu:ncnn",), lambda k, n: "gpu"),
    "npu_gpu_cpu": (("npu", "gpu:ncnn"), lambda k, n: "npu" if k < n // 3 else "gpu" if k < 2 * n // 3 else "cpu"),
}


async def _twin_plan(model: onnx.ModelProto, root: Path, specs: tuple[str, ...], order: Callable[[int, int], str],
                     feeds: list[dict[str, np.ndarray]], want: list[list[np.ndarray]]) -> dict[str, Any]:
    (big, *_rest) = resolve_devices(["big"], root=root)
    devices = [*resolve_devices(list(specs), root=root), big]

    def named(k: int, n: int) -> str:
        d = order(k, n)
        return big.name if d == "cpu" else d

    # units of about a sixth of the model each: a split plan has something to split (one unit per model
    # otherwise); pnnx-refused units (see backends/ncnn.py) land on the big cluster
    unit = max(4, len(model.graph.node) // 6) if len(specs) > 1 else None
    t0 = time.perf_counter()
    async with Session(model, devices=devices, root=root, policy=_where(named), max_unit_nodes=unit) as s:
        open_s = time.perf_counter() - t0
        plan = s.plan.to_json()
        cos = 1.0
        for f, w in zip(feeds, want, strict=True):
            got = await s.run(None, f)
            cos = min(cos, *(_cosine(g, r) for g, r in zip(got, w, strict=True)))
        t, e = _modelled_per_request(s)
    total = sum(st["flops"] for st in plan["stages"]) or 1.0
    by_backend: dict[str, float] = {}
    for st in plan["stages"]:
        by_backend[st["backend"]] = by_backend.get(st["backend"], 0.0) + st["flops"]
    return {"open_s": round(open_s, 3), "stages": len(plan["stages"]),
            "devices": sorted({st["device"] for st in plan["stages"]}), "refused": len(plan["refused"]),
            "gpu_flops_fraction": round(by_backend.get("ncnn", 0.0) / total, 4),
            "npu_flops_fraction": round(by_backend.get("rknn", 0.0) / total, 4),
            "cosine": round(cos, 6), "modelled_ms": round(t * 1e3, 4), "modelled_mj": round(e * 1e3, 4)}


async def bench_model(name: str, root: Path, cache: Path, inputs: int, npu: str | None) -> dict[str, Any]:
    model = with_seeded_weights(f"light_{name}", seed=0)
    feeds = _inputs(model, inputs, seed=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [ref.run(None, f) for f in feeds]
    backend = NcnnBackend()
    row: dict[str, Any] = {"model": name}
    for precision in ("fp32", "fp16"):
        host = _host_stage(backend, model, precision, cache, feeds, want)
        row[f"cosine_{precision}"] = host["cosine"]
        row[f"conversion_s_{precision}"] = host["open_s"]
        row[f"cached_open_s_{precision}"] = host["cached_open_s"]
    stats = backend.statistics()
    row.update(conversions=stats.cache.conversions, cache_hits=stats.cache.cache_hits)
    plans: dict[str, Any] = {}
    for plan_name, (specs, order) in PLANS.items():
        if "npu" in specs and npu is not None:
            plans[plan_name] = {"skipped": npu}
            continue
        plans[plan_name] = await _twin_plan(model, root, specs, order, feeds, want)
    row["twin_plans"] = plans
    return row


def _silent_cases() -> list[tuple[str, onnx.ModelProto]]:
    from onnx import TensorProto, helper, numpy_helper

    def model(nodes: list[Any], shape: list[int], out: list[int], inits: list[Any] | None = None,
              opset: int = 13) -> onnx.ModelProto:
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits or [])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m

    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((10, 4, 1, 1)).astype(np.float32), "W")
    return [
        ("averagepool_asymmetric_pads", model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                                                pads=[0, 0, 1, 1])], [1, 4, 8, 8], [1, 4, 7, 7])),
        ("batch_2", model([helper.make_node("Relu", ["x"], ["y"])], [2, 4, 8, 8], [2, 4, 8, 8])),
        ("opset9_softmax_4d_after_gap", model([helper.make_node("Conv", ["x", "W"], ["c"]),
                                               helper.make_node("GlobalAveragePool", ["c"], ["g"]),
                                               helper.make_node("Softmax", ["g"], ["y"], axis=1)],
                                              [1, 4, 4, 4], [1, 10, 1, 1], [w], opset=9)),
        ("opset9_softmax_4d_conv1x1", model([helper.make_node("Conv", ["x", "W"], ["c"]),
                                             helper.make_node("Softmax", ["c"], ["y"], axis=1)],
                                            [1, 4, 1, 1], [1, 10, 1, 1], [w], opset=9)),
        ("concat_before_any_batch_op", model([helper.make_node("Relu", ["x"], ["a"]),
                                              helper.make_node("Concat", ["a", "x"], ["y"], axis=1)],
                                             [1, 8, 16, 16], [1, 16, 16, 16])),
        ("inception_v1_asymmetric_averagepool", with_seeded_weights("light_inception_v1", seed=0)),
    ]


def silent_cases(cache: Path) -> list[dict[str, Any]]:
    backend = NcnnBackend()
    dev = Device(name="gpu", kind="gpu", backend="ncnn", options={"cache_dir": str(cache)})
    rows = []
    for name, model in _silent_cases():
        try:
            stage: Any = backend.compile(model, dev, name=name)
        except CompileError as exc:
            rows.append({"case": name, "refused": True, "ran_wrong": False, "reason": str(exc)[:200]})
            continue
        try:
            (feeds,) = _inputs(model, 1, seed=3)
            want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            cos = min(_cosine(g, r) for g, r in zip(stage.run(feeds), want, strict=True))
        finally:
            stage.close()
        rows.append({"case": name, "refused": False, "ran_wrong": cos < 0.99999, "cosine": round(cos, 6)})
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    why = toolkit_unavailable_reason()
    npu = None if why is None else f"no rknn-toolkit2 environment (hetsched setup rknn): {why}"
    with tempfile.TemporaryDirectory(prefix="hetsched-ncnn-bench-") as tmp:
        os.environ["HETSCHED_NCNN_CACHE"] = str(Path(tmp) / "twin-cache")  # empty caches: reproducible
        os.environ["HETSCHED_RKNN_CACHE"] = str(Path(tmp) / "rknn-cache")
        root = build_board_tree(Path(tmp) / "rk3588", "rk3588")
        rows = []
        for name in args.models:
            row = await bench_model(name, root, Path(tmp) / "cache", args.inputs, npu)
            rows.append(row)
            print(f"{name:12s} convert {row['conversion_s_fp32']:6.2f} s  cached {row['cached_open_s_fp32']:5.2f} s  "
                  f"cos fp32 {row['cosine_fp32']:.8f} fp16 {row['cosine_fp16']:.6f}  " + "  ".join(
                      f"{k}: {v.get('modelled_ms', '-')} ms {v.get('modelled_mj', '-')} mJ"
                      for k, v in row["twin_plans"].items()), file=sys.stderr)
        silent = silent_cases(Path(tmp) / "silent-cache")
    vk = vulkan_devices()
    return {
        "benchmark": "ncnn",
        "vulkan_device": vk[0].describe() if vk else None,
        "min_cosine_fp32": min(r["cosine_fp32"] for r in rows),
        "min_cosine_fp16": min(r["cosine_fp16"] for r in rows),
        "silent_failures_run": sum(r["ran_wrong"] for r in silent),
        "silent_cases_refused": sum(r["refused"] for r in silent),
        "npu_plans": "run" if npu is None else npu,
        "targets": TARGETS,
        "models": rows,
        "silent_cases": silent,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(MODELS[:2]), choices=MODELS)
    ap.add_argument("--inputs", type=int, default=2, help="seeded random inputs per model for the cosines")
    args = ap.parse_args()
    vk = vulkan_devices()
    where = vk[0].name if vk else "no Vulkan device"
    print(json.dumps(labelled(anyio.run(main_async, args), board=twin("rk3588"),
                              figures=f"measured on {where} through ncnn over Vulkan (numerics, conversion and open "
                                      "times); NPU numerics from Rockchip's rknn-toolkit2 simulator; twin latency and "
                                      "energy " + MODELLED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
