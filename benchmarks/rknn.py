"""NPU stages through Rockchip's rknn-toolkit2 (its simulator here) on an rk3588 twin.

Per model (the light models with seeded random weights: their shipped constant weights overflow
fp16): seconds to open a session whose NPU stages are converted (empty compile cache), seconds to
open it again (every stage from the cache), stages, the fraction of the analytic FLOPs placed on
the NPU, the simulator's accuracy (least cosine vs onnxruntime over seeded random inputs), and
the twin's modelled latency and energy per request (serial sum over the stages, as ``hetsched
run --root`` prints it) against the same model on the twin's CPU clusters only.

Summary fields with their targets (reported, not asserted): ``min_cosine`` (>= 0.999; null
when a model's NPU output is not finite, those models in ``non_finite_models``),
``npu_flops_fraction_min`` over the CNNs (>= 0.8), ``cached_open_ratio`` (seconds until a
session with the NPU serves, its stages in the cache, opened with ``background_compile=True``:
it serves on the CPU clusters at once and switches to the NPU plan when the toolkit has
reloaded it / CPU-only session open of the same model, worst model, <= 1.5; reported beside it:
``cached_open_full_ratio``, the same for a session that opens with the NPU plan in place, and
per model the seconds until the NPU plan serves, ``background_npu_ready_s``) and
``modelled_energy_vs_cpu_only_max`` (< 1.0). The compile cache is a temporary directory
(``HETSCHED_RKNN_CACHE``), so every run converts from scratch. Needs the toolkit environment
(``hetsched setup rknn``).

    .venv/bin/python benchmarks/rknn.py [--models squeezenet resnet50 inception_v1 shufflenet] [--inputs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
from _labels import MODELLED, labelled, twin

import hetsched
from hetsched import Device, Session, resolve_devices
from hetsched.backends.sim import clock_from_root, twin_devices
from hetsched.testing import build_board_tree, with_seeded_weights

MODELS = ("squeezenet", "resnet50", "inception_v1", "shufflenet")
CNNS = frozenset(MODELS)  # every default model is a CNN classifier
TARGETS = {"min_cosine": ">= 0.999", "npu_flops_fraction_min": ">= 0.8", "cached_open_ratio": "<= 1.5",
           "modelled_energy_vs_cpu_only_max": "< 1.0"}


def _inputs(model: onnx.ModelProto, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    specs = [(i.name, [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim])
             for i in model.graph.input if i.name not in inits]
    return [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in specs} for _ in range(n)]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def _modelled_per_request(session: Session) -> tuple[float, float]:
    """(seconds, joules) the twin models for one request: the serial sum over the stages of each
    stage's mean modelled run (the per-stage figures ``hetsched run --root`` prints)."""
    t = e = 0.0
    for name, x in session.stage_statistics().items():
        if x is None or not hasattr(x, "modelled_time_s"):
            raise RuntimeError(f"stage {name} reports no modelled time")
        if x.runs:
            t += x.modelled_time_s / x.runs
            e += x.modelled_energy_j / x.runs
    return t, e


async def _open(model: onnx.ModelProto, devices: list[Device], root: Path,
                background: bool = False) -> tuple[Session, float]:
    t0 = time.perf_counter()
    s = Session(model, devices=devices, root=root, adaptation=hetsched.Adaptation(background_compile=background))
    await s.__aenter__()
    return s, time.perf_counter() - t0


async def bench_model(name: str, root: Path, inputs: int) -> dict[str, Any]:
    model = with_seeded_weights(f"light_{name}", seed=0)
    clusters = [d for d in twin_devices("rk3588", clock=clock_from_root(root)) if d.kind == "cpu"]
    with_npu = [*clusters, *resolve_devices(["npu"], root=root)]
    feeds = _inputs(model, inputs, seed=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [ref.run(None, f) for f in feeds]

    cpu, cpu_open_s = await _open(model, clusters, root)
    try:
        for f in feeds:
            await cpu.run(f)
        cpu_t, cpu_e = _modelled_per_request(cpu)
    finally:
        await cpu.__aexit__(None, None, None)

    first, convert_s = await _open(model, with_npu, root)
    try:
        comp = first.statistics().compile
        plan = first.plan.to_json()
    finally:
        await first.__aexit__(None, None, None)

    # background compile: the session serves on the CPU clusters at once, the NPU plan (stages
    # from the cache) is switched to when ready
    t0 = time.perf_counter()
    fast, fast_open_s = await _open(model, with_npu, root, background=True)
    try:
        fast_first = sorted({st.device for st in fast.plan.stages})
        await fast.run(feeds[0])
        first_result_s = time.perf_counter() - t0
        ready = await fast.wait_planned()
        npu_ready_s = time.perf_counter() - t0
        fast_final = sorted({st.device for st in ready.stages})
    finally:
        await fast.__aexit__(None, None, None)

    npu, cached_s = await _open(model, with_npu, root)
    try:
        cached = npu.statistics().compile
        cosines, non_finite = [], 0
        for f, w in zip(feeds, want, strict=True):
            got = await npu.run(None, f)
            non_finite += sum(int(np.count_nonzero(~np.isfinite(g))) for g in got)
            cosines += [_cosine(g, r) for g, r in zip(got, w, strict=True)]
        npu_t, npu_e = _modelled_per_request(npu)
    finally:
        await npu.__aexit__(None, None, None)

    total = sum(st["flops"] for st in plan["stages"]) or 1.0
    on_npu = sum(st["flops"] for st in plan["stages"] if st["backend"] == "rknn")
    return {
        "model": name, "conversion_s": round(convert_s, 3), "conversions": comp.conversions,
        "toolkit_convert_s": round(comp.seconds, 3), "refused": len(plan["refused"]),
        "cached_open_s": round(cached_s, 3), "cached_conversions": cached.conversions,
        "cache_hits": cached.cache_hits, "cpu_only_open_s": round(cpu_open_s, 3),
        "cached_open_full_ratio": round(cached_s / cpu_open_s, 3),
        "cached_open_ratio": round(fast_open_s / cpu_open_s, 3),
        "background_open_s": round(fast_open_s, 3), "background_first_result_s": round(first_result_s, 3),
        "background_npu_ready_s": round(npu_ready_s, 3), "background_plan_devices": [fast_first, fast_final],
        "stages": len(plan["stages"]), "npu_stages": sum(st["backend"] == "rknn" for st in plan["stages"]),
        "npu_flops_fraction": round(on_npu / total, 4),
        # a NaN / inf output (fp16 overflow) has no cosine: null, and the values are counted
        "min_cosine": None if non_finite else round(min(cosines), 6), "non_finite_values": non_finite,
        "modelled_ms": round(npu_t * 1e3, 4), "cpu_only_modelled_ms": round(cpu_t * 1e3, 4),
        "modelled_mj": round(npu_e * 1e3, 4), "cpu_only_modelled_mj": round(cpu_e * 1e3, 4),
        "modelled_energy_vs_cpu_only": round(npu_e / cpu_e, 4) if cpu_e else None,
        "modelled_latency_vs_cpu_only": round(npu_t / cpu_t, 4) if cpu_t else None,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hetsched-rknn-bench-") as tmp:
        os.environ["HETSCHED_RKNN_CACHE"] = str(Path(tmp) / "cache")  # an empty cache: reproducible
        root = build_board_tree(Path(tmp) / "rk3588", "rk3588")
        rows = []
        for name in args.models:
            row = await bench_model(name, root, args.inputs)
            rows.append(row)
            cos = "non-finite" if row["min_cosine"] is None else f"{row['min_cosine']:.6f}"
            print(f"{name:14s} convert {row['conversion_s']:7.2f} s  cached open {row['cached_open_s']:6.2f} s "
                  f"(cpu-only {row['cpu_only_open_s']:5.2f} s)  stages {row['stages']:3d}  "
                  f"npu flops {row['npu_flops_fraction']:.3f}  cos {cos}  "
                  f"modelled {row['modelled_ms']:.3f} ms {row['modelled_mj']:.3f} mJ "
                  f"(cpu-only {row['cpu_only_modelled_ms']:.3f} ms {row['cpu_only_modelled_mj']:.3f} mJ)")
    cnn = [r for r in rows if r["model"] in CNNS]
    energy = [r["modelled_energy_vs_cpu_only"] for r in rows if r["modelled_energy_vs_cpu_only"] is not None]
    bad = [r["model"] for r in rows if r["min_cosine"] is None]
    return {
        "benchmark": "rknn",
        "min_cosine": None if bad else min(r["min_cosine"] for r in rows),
        "non_finite_models": bad,
        "min_cosine_finite_models": min((r["min_cosine"] for r in rows if r["min_cosine"] is not None),
                                        default=None),
        "npu_flops_fraction_min": min((r["npu_flops_fraction"] for r in cnn), default=None),
        "cached_open_ratio": max(r["cached_open_ratio"] for r in rows),
        "cached_open_full_ratio": max(r["cached_open_full_ratio"] for r in rows),
        "modelled_energy_vs_cpu_only_max": max(energy, default=None),
        "targets": TARGETS,
        "models": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--inputs", type=int, default=4, help="seeded random inputs per model for the accuracy check")
    args = ap.parse_args()
    print(json.dumps(labelled(anyio.run(main_async, args), board=twin("rk3588"), figures="NPU numerics from Rockchip's rknn-toolkit2 simulator; times and energy " + MODELLED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
