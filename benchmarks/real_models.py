"""Real models as their PyPI wheels ship them, on the host, the rk3588 twin (NPU) and the orin-nx twin.

The zoo (each ONNX file is read from the installed wheel, never downloaded here):

- ``ppocr_det``: PP-OCRv4 text detector (DBNet on a MobileNetV3-style body), ``rapidocr-onnxruntime``;
- ``ppocr_rec``: PP-OCRv4 text recogniser (SVTR: convolutions and a transformer encoder), same wheel;
- ``ppocr_cls``: PP-OCR text-direction classifier (MobileNetV3), same wheel;
- ``ddddocr_det``: ddddocr's detector (a YOLOX-style CNN), ``ddddocr``;
- ``ddddocr_ocr``: ddddocr's CRNN recogniser (convolutions + LSTM), same wheel;
- ``silero_vad``: Silero VAD (control flow: If; state in and out), ``silero-vad``.

Their inputs have free dims; the benchmark fixes them (``ZOO``) before planning, as
``--shape`` / ``shapes=`` does for the CLI and ``Session`` (Silero VAD stays dynamic: its
control flow runs on a CPU).

Per model and target (``host``: this machine's CPUs; ``rk3588``: the twin's default devices, its
NPU through Rockchip's rknn-toolkit2 simulator in fp16 (INT8 is not run here: it needs calibration
data per model, issue 24's INT8 item is another helper's); ``orin-nx``: the twin's default devices,
GPU and DLA cores simulated): ``runs`` (one request through a session gives finite outputs),
``stages``, ``npu_flops_share`` (analytic FLOPs of NPU stages / all), ``min_cosine`` (least cosine
of any output against onnxruntime on the whole model, seeded random inputs), ``open_s`` (first open:
an empty RKNN cache), ``cached_open_s`` (the same session again, every stage from the cache, opened
with ``background_compile=True`` where the board has an NPU: it serves on the CPU clusters at once),
``cached_open_full_s`` (the same with the NPU plan in place at open) and ``cpu_only_open_s`` (the
board's CPU clusters only) with ``cached_open_ratio`` / ``cached_open_full_ratio``, and per stage
``estimate_vs_modelled`` (the plan's estimate / the twin's modelled time of its run; twins only).

Targets (reported, not asserted): every model runs everywhere; CNNs >= 0.9 of FLOPs on the NPU;
min cosine >= 0.999 (fp16); cached open <= 1.5x a CPU-only open; estimate_vs_modelled within
1.25x either way. The last line printed is one JSON object. Times are measured on this host
(a shared machine: wall time); modelled figures come from the SoC twin, a labelled simulator.

    .venv/bin/python benchmarks/real_models.py [--models ppocr_cls silero_vad] [--targets host orin-nx]
"""

from __future__ import annotations

import argparse
import importlib.util
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
from _labels import MODELLED, host, labelled, measured, twin

from hetsched import Device, Session, load_model, resolve_devices
from hetsched.testing import build_board_tree

# (wheel's package, file inside it, fixed input shapes, kind)
ZOO: dict[str, tuple[str, str, dict[str, list[int]], str]] = {
    "ppocr_det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}, "cnn"),
    "ppocr_rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]},
                  "cnn+transformer"),
    "ppocr_cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]},
                  "cnn"),
    "ddddocr_det": ("ddddocr", "common_det.onnx", {"images": [1, 3, 416, 416]}, "cnn"),
    "ddddocr_ocr": ("ddddocr", "common_old.onnx", {"input1": [1, 1, 64, 256]}, "crnn"),
    # left dynamic: fixing its dims breaks onnxruntime's inference of the 8 kHz If branch; the If
    # runs on a CPU, where onnxruntime takes free dims
    "silero_vad": ("silero_vad", "data/silero_vad.onnx", {}, "control-flow"),
}
TARGETS = {"runs": "all", "npu_flops_share_cnn_min": ">= 0.9", "min_cosine": ">= 0.999 (fp16)",
           "cached_open_ratio_max": "<= 1.5", "estimate_vs_modelled": "within 1.25x"}


def wheel_file(package: str, rel: str) -> Path:
    """The file ``rel`` inside the installed package ``package`` (not imported: only located)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not in the installed {package} wheel")
    return path


def with_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs named in ``shapes`` have those fixed dims."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name in shapes:
            del vi.type.tensor_type.shape.dim[:]
            for v in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = int(v)
    return out


def fixed_model(name: str) -> onnx.ModelProto:
    package, rel, shapes, _ = ZOO[name]
    model = load_model(wheel_file(package, rel))
    graph_inputs = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    wanted = {k: v for k, v in shapes.items() if k in graph_inputs}
    return load_model(with_input_shapes(model, wanted)) if wanted else model


_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
       onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.UINT8: np.uint8}


def feeds_for(name: str, model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        dtype = _NP.get(tt.elem_type, np.float32)
        if name == "silero_vad" and inp.name == "input":
            out[inp.name] = (rng.standard_normal([1, 512]) * 0.1).astype(dtype)
        elif name == "silero_vad" and inp.name == "state":
            out[inp.name] = np.zeros([2, 1, 128], dtype)
        elif name == "silero_vad" and inp.name == "sr":
            out[inp.name] = np.array(16000, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            out[inp.name] = rng.integers(0, 4, dims).astype(dtype)
        else:
            out[inp.name] = (rng.standard_normal(dims) * 0.5).astype(dtype)
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.size == 0 and b.size == 0:
        return 1.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb + 1e-30))


async def _session_run(model: onnx.ModelProto, devices: list[Device] | None, root: Path | None,
                       feeds: dict[str, np.ndarray], background: bool = False,
                       ) -> tuple[float, Session, list[np.ndarray], dict[str, Any]]:
    t0 = time.perf_counter()
    s = (Session(model, devices=devices) if root is None
         else Session(model, devices=devices, root=root, background_compile=background))
    await s.__aenter__()
    open_s = time.perf_counter() - t0
    try:
        out = await s.run(None, feeds)
        info = {"plan": s.plan, "stats": s.stage_statistics(), "costs": s.plan.stage_costs()}
    finally:
        await s.__aexit__(None, None, None)
    return open_s, s, list(out), info


async def bench(name: str, target: str, roots: dict[str, Path]) -> dict[str, Any]:
    model = fixed_model(name)
    feeds = feeds_for(name, model, seed=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    row: dict[str, Any] = {"model": name, "kind": ZOO[name][3], "target": target, "nodes": len(model.graph.node)}
    root = roots.get(target)
    devices = None if root is None else resolve_devices(None, root=root)
    if devices is not None:
        row["devices"] = [d.name for d in devices]
    try:
        open_s, _, got, info = await _session_run(model, devices, root, feeds)
        if root is not None:
            # cached: every NPU stage from the cache; opened with background_compile=True it serves
            # on the CPU clusters at once and switches to the NPU plan when the toolkit reloaded it
            # (as benchmarks/rknn.py measures it); the full cached open (NPU plan in place) beside it
            npu = any(d.kind == "npu" for d in devices or [])
            again_s, _, _, _ = await _session_run(model, devices, root, feeds, background=npu)
            full_s = (await _session_run(model, devices, root, feeds))[0] if npu else again_s
            clusters = [d for d in devices or [] if d.kind == "cpu"]
            cpu_s, _, _, _ = await _session_run(model, clusters, root, feeds)
            row.update(cached_open_s=round(again_s, 3), cached_open_full_s=round(full_s, 3),
                       cpu_only_open_s=round(cpu_s, 3),
                       cached_open_ratio=round(again_s / cpu_s, 3) if cpu_s else None,
                       cached_open_full_ratio=round(full_s / cpu_s, 3) if cpu_s else None)
    except Exception as exc:  # noqa: BLE001 - a benchmark row records what failed, the run goes on
        row.update(runs=False, error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}")
        return row
    plan = info["plan"]
    total = sum(plan.stage_flops) or 1.0
    npu = sum(plan.stage_flops[s.id] for s in plan.stages if plan.backend_of(s.device) == "rknn")
    finite = all(bool(np.all(np.isfinite(np.asarray(g, np.float64)))) for g in got)
    row.update(runs=finite and len(got) == len(ref), open_s=round(open_s, 3), stages=len(plan.stages),
               stage_devices=[s.device for s in plan.stages], npu_flops_share=round(npu / total, 4),
               min_cosine=round(min(cosine(g, r) for g, r in zip(got, ref, strict=True)), 6),
               offload={r.value: sum(1 for n in plan.offload if n.reason is r)
                        for r in {n.reason for n in plan.offload}})
    if root is not None:
        evm = {}
        for s in plan.stages:
            st = info["stats"].get(s.name)
            modelled = getattr(st, "last_modelled_s", None)
            if modelled:
                evm[s.name] = round(info["costs"][s.id] / modelled, 4)
        row["estimate_vs_modelled"] = evm
    return row


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hetsched-real-models-") as tmp:
        os.environ["HETSCHED_RKNN_CACHE"] = str(Path(tmp) / "rknn-cache")  # an empty cache: first opens convert
        roots = {t: build_board_tree(Path(tmp) / t, t) for t in args.targets if t != "host"}
        for name in args.models:
            for target in args.targets:
                row = await bench(name, target, roots)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    ran = [r for r in rows if r.get("runs")]
    cnn_npu = [r["npu_flops_share"] for r in ran if r["target"] == "rk3588" and r["kind"] == "cnn"]
    ratios = [v for r in ran for v in r.get("estimate_vs_modelled", {}).values()]
    opens = [r["cached_open_ratio"] for r in ran if r.get("cached_open_ratio") is not None]
    return {
        "benchmark": "real_models",
        "precision": "fp16 on the NPU (INT8 not run: no calibration data per model here)",
        "models": args.models, "targets": args.targets,
        "runs_all": len(ran) == len(rows), "failed": [f"{r['model']}@{r['target']}" for r in rows if not r.get("runs")],
        "stages": {f"{r['model']}@{r['target']}": r.get("stages") for r in rows},
        "npu_flops_share_cnn_min": min(cnn_npu) if cnn_npu else None,
        "min_cosine": min((r["min_cosine"] for r in ran), default=None),
        "cached_open_ratio_max": max(opens) if opens else None,
        "estimate_vs_modelled_range": [min(ratios), max(ratios)] if ratios else None,
        "targets_wanted": TARGETS,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO))
    ap.add_argument("--targets", nargs="+", default=["host", "rk3588", "orin-nx"], choices=["host", "rk3588", "orin-nx"])
    args = ap.parse_args(argv)
    res = anyio.run(main_async, args)
    socs = [t for t in args.targets if t != "host"]
    board = "+".join(x for x in (host() if "host" in args.targets else "", twin(*socs) if socs else "") if x)
    figures = f"{measured('open times, outputs')}; estimate_vs_modelled: {MODELLED}" if socs else measured()
    print(json.dumps(labelled(res, board=board, figures=figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
