"""``hetsched compile MODEL --target rk3588 --out DIR``: convert a model's NPU stages offline.

Plans the model for an RK3588 (its twin: NPU, CPU clusters for what the NPU cannot run)
without a board, converts every NPU stage with rknn-toolkit2 and leaves in ``DIR`` a compile
cache (``<kk>/<key>.rknn`` ...) and ``manifest.json`` (``hetsched._rknn.manifest``). On the
board, ``HETSCHED_RKNN_CACHE=DIR`` makes the session load those files with rknn-toolkit-lite2.
``--int8 --calibration CAL`` quantizes (``CAL``: ``<input>_<k>.npy`` files, or ``<k>.npy`` for
a one-input model). Converting a stage again is answered by ``DIR``'s cache: a second run
converts nothing. One progress line per stage on stderr: ``converting k/n NAME: S s (ETA E s)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from ._common import add_shape_arg, existing_dir, output_dir, parse_shapes, require_shapes, resolve_model_arg


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compile", help="convert a model's NPU stages offline (.rknn files and a manifest)")
    p.add_argument("model", help="path to an .onnx file, or an embedded model name (e.g. light_squeezenet)")
    p.add_argument("--target", default="rk3588", choices=["rk3588"], help="the SoC (default rk3588)")
    add_shape_arg(p)
    add_int8_args(p)
    p.add_argument("--out", metavar="DIR", required=True, type=output_dir, help="where the .rknn files and manifest.json go")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=main)


class _ProgressLines:
    """``converting k/n NAME: S s (ETA E s)`` per compiled stage on stderr (thread-safe: stages
    compile in parallel). ``n`` is the NPU stage count of a plan made before compiling."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.done = 0
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()

    def __call__(self, name: str, cached: bool, seconds: float) -> None:
        with self._lock:
            self.done += 1
            elapsed = time.perf_counter() - self.t0
            left = max(0, self.total - self.done)
            eta = elapsed / self.done * left
            what = "cached" if cached else f"{seconds:.1f} s"
            print(f"converting {min(self.done, self.total)}/{self.total} {name}: {what} (ETA {eta:.0f} s)",
                  file=sys.stderr, flush=True)


def add_int8_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--int8", action="store_true", help="quantize NPU stages to INT8 (w8a8); needs --calibration")
    p.add_argument("--calibration", metavar="DIR", type=existing_dir,
                   help="calibration samples: <input>_<k>.npy per graph input (or <k>.npy for one input)")


def calibration_arg(args: argparse.Namespace, model: Any, prog: str) -> list[dict[str, Any]] | None:
    """The feeds of ``--calibration DIR`` when ``--int8`` is given (else None).

    :raises ModelError: the directory holds no complete sample.
    :raises InputError: a sample's array has a shape the model's input (or ``--shape``) does not take.
    """
    if not args.int8:
        return None
    if not args.calibration:
        raise SystemExit(f"{prog}: --int8 needs --calibration DIR")
    from hetsched._planning.model import load_model
    from hetsched._rknn.calibrate import load_calibration_dir

    m = load_model(model)
    inits = {t.name for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    feeds = load_calibration_dir(args.calibration, [i.name for i in inputs])
    shapes = parse_shapes(args.shape, prog)
    for vi in inputs:
        fixed = shapes.get(vi.name)
        dims = vi.type.tensor_type.shape.dim
        want: tuple[int | None, ...] = fixed or tuple(
            int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None for d in dims)
        for k, feed in enumerate(feeds):
            got = tuple(feed[vi.name].shape)
            if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got, strict=False)):
                from hetsched._errors import InputError

                shown = ["?" if w is None else w for w in want]
                raise InputError(f"--calibration {args.calibration}: sample {k} (in file-name order) gives input "
                                 f"{vi.name!r} the shape {list(got)}; the model takes {shown}")
    return feeds


INT8_CHECK_SAMPLES = 4
"""Calibration samples ``compile --int8`` runs through the whole session and fp32 onnxruntime."""


async def int8_vs_fp32(session: Any, model_path: Any, calibration: list[dict[str, Any]],
                       samples: int = INT8_CHECK_SAMPLES) -> dict[str, Any]:
    """The quantized session against fp32 onnxruntime on the whole model, per output: the least
    cosine and the largest absolute error over the first ``samples`` calibration feeds
    (``{"samples": n, "outputs": {name: {"cosine", "max_abs_diff"}}}``)."""
    from hetsched._onnxruntime import ort_session
    from hetsched._planning.model import load_model

    from ._common import compare_outputs

    ref = ort_session(load_model(model_path).SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    per: dict[str, dict[str, float]] = {}
    used = calibration[:max(1, samples)]
    for feeds in used:
        want = dict(zip(names, ref.run(None, dict(feeds)), strict=True))
        got = await session.run(dict(feeds))
        for name, v in compare_outputs(want, dict(got))["outputs"].items():
            cur = per.setdefault(name, {"cosine": 1.0, "max_abs_diff": 0.0})
            cur["cosine"] = min(cur["cosine"], v["cosine"])
            cur["max_abs_diff"] = max(cur["max_abs_diff"], v["max_abs_diff"])
    return {"samples": len(used), "outputs": per}


def with_accuracy(session: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (the plan's stages as JSON) with ``accuracy`` ({min_cosine, max_rel_error,
    samples}) added to each NPU stage that measured it."""
    from hetsched._rknn.accuracy import stage_accuracy

    acc = stage_accuracy(session)
    return [{**r, "accuracy": acc[r["name"]].to_json()} if r["name"] in acc else r for r in rows]


def main(args: argparse.Namespace) -> int:
    from hetsched import Session
    from hetsched._devices.resolve import resolve_devices
    from hetsched._errors import ModelError
    from hetsched._planning.plan import build_plan
    from hetsched._rknn.manifest import ManifestEntry, write_manifest
    from hetsched._session._setup import load_index
    from hetsched.testing import build_board_tree

    from ._common import board_devices

    shapes = parse_shapes(args.shape, "hetsched compile")
    model_path = resolve_model_arg(args.model)
    require_shapes(resolve_model_arg(args.model), shapes, "hetsched compile's inputs")
    calibration = calibration_arg(args, model_path, "hetsched compile")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    async def go(root: str) -> int:
        (npu,) = resolve_devices(["npu"], root=root)
        cpus = [d for d in board_devices(root) if d.kind == "cpu"]
        options: dict[str, Any] = {**npu.options, "cache_dir": str(out), "target": args.target}
        devices = [*cpus, dataclasses.replace(npu, options=options)]
        index, _ = load_index(model_path, shapes)
        # n for the progress lines: the first plan's NPU stages (a refused unit re-plans, so
        # the count is a guess that the lines correct by never exceeding it)
        first = build_plan(index, devices)
        total = sum(1 for st in first.stages if st.device == npu.name)
        options["progress"] = _ProgressLines(total)
        devices = [*cpus, dataclasses.replace(npu, options=options)]
        async with Session(model_path, devices=devices, root=root, shapes=shapes, calibration=calibration) as s:
            entries, version = _entries(s, npu.name, args.target)
            comp = s.statistics().compile
            check = await int8_vs_fp32(s, model_path, calibration) if calibration else None
        if not entries:
            raise ModelError(f"no stage of {args.model} can run on the {args.target} NPU")
        path = write_manifest(out, entries, model=str(args.model), target=args.target, toolkit_version=version)
        print(f"{len(entries)} NPU stage(s): {comp.conversions} converted, {comp.cache_hits} from the cache, "
              f"{comp.seconds:.1f} s converting; manifest {path}", file=sys.stderr)
        if check is not None:
            worst = ", ".join(f"output {name!r}: cosine {v['cosine']:.6f}, max abs err {v['max_abs_diff']:.4g}"
                              for name, v in check["outputs"].items())
            print(f"int8 vs fp32 onnxruntime on {check['samples']} calibration sample(s): {worst}", file=sys.stderr)
        if args.json:
            print(path.read_text())
        return 0

    def _entries(s: Any, npu: str, target: str) -> tuple[list[ManifestEntry], str]:
        from hetsched._rknn.accuracy import stage_accuracy
        from hetsched.backends.rknn import RknnStage

        acc = stage_accuracy(s)
        entries = []
        for st in s._stages:  # the compiled stages: what the plan alone does not know
            if st.spec.device != npu:
                continue
            rk = st.hooks.compile_cache  # the RknnStage itself (a twin stage declares the one it wraps)
            if not isinstance(rk, RknnStage):
                continue
            io = [{"name": n, "dtype": str(dt), "shape": list(shape)} for n, (dt, shape) in rk.io_specs()]
            k = len(rk.input_names)
            a = acc.get(st.spec.name)
            entries.append(ManifestEntry(
                name=st.spec.name, device=npu, model_sha256=rk.model_sha256, cache_key=rk.statistics().cache_key,
                precision=rk.precision, target=target, rknn=str(rk.rknn_path.relative_to(out)),
                inputs=tuple(io[:k]), outputs=tuple(io[k:]), accuracy=a.to_json() if a else None))
        return entries, _toolkit_version()

    with tempfile.TemporaryDirectory(prefix="hetsched-compile-") as tmp:
        root = str(build_board_tree(tmp, args.target))
        return anyio.run(go, root)


def _toolkit_version() -> str:
    from hetsched.backends import get_backend
    from hetsched.backends.rknn import RknnBackend

    backend = get_backend("rknn")
    return next(iter(backend.toolkit_versions().values()), "") if isinstance(backend, RknnBackend) else ""

