"""hetsched's ncnn backend on every Vulkan device ncnn finds (on the lent GPU machine: NVIDIA's
Vulkan driver), whole models converted by pnnx there, compared with onnxruntime on the CPU.

usage: python3 tools/ncnn_gpu_probe.py OUT_JSON [REPS]

Per model and precision: compile seconds (pnnx + Vulkan pipelines + the backend's probe), the
cosine and relative error against onnxruntime on one seeded input, ncnn's median run time against
onnxruntime CPU's; and the silent pnnx cases, each of which must be refused (never run).
Exit 0: every model ran within the backend's floors and every silent case was refused;
1: something failed; 3: ncnn, pnnx or a Vulkan device is missing (nothing ran).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "ncnn_gpu.json")
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
MODELS = os.environ.get("NCNN_MODELS", "light_squeezenet,light_shufflenet,light_resnet50").split(",")
rows: list[dict[str, Any]] = []


def emit(row: dict[str, Any]) -> None:
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)
    with open(OUT, "w") as f:
        json.dump(rows, f, indent=1, default=str)


def main() -> int:
    from hetsched._errors import CompileError
    from hetsched._onnxruntime import ort_session
    from hetsched.backends import Device
    from hetsched.backends._ncnn_convert import ncnn_unavailable_reason, vulkan_devices
    from hetsched.backends.ncnn import NcnnBackend
    from hetsched.testing import with_seeded_weights

    reason = ncnn_unavailable_reason()
    devs = vulkan_devices()
    emit({"vulkan_devices": [d.describe() for d in devs], "unavailable": reason,
          "env": {k: os.environ.get(k) for k in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}})
    if reason is not None:
        return 3
    real = [d for d in devs if d.type != "cpu"] or devs
    backend = NcnnBackend()
    bad = 0
    with tempfile.TemporaryDirectory() as cache:
        for vk in real:
            for model_name in MODELS:
                model = with_seeded_weights(model_name)
                x = np.random.default_rng(0).standard_normal(
                    [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
                sess = ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"])
                feeds = {model.graph.input[0].name: x}
                ref = sess.run(None, feeds)[0]
                t0 = time.perf_counter()
                for _ in range(REPS):
                    sess.run(None, feeds)
                ort_ms = (time.perf_counter() - t0) / REPS * 1e3
                for precision in ("fp32", "fp16"):
                    dev = Device(name="gpu", kind="gpu", backend="ncnn",
                                 options={"precision": precision, "vulkan_device": vk.index, "cache_dir": cache})
                    row: dict[str, Any] = {"device": vk.name, "model": model_name, "precision": precision}
                    try:
                        t0 = time.perf_counter()
                        stage: Any = backend.compile(model, dev, name=model_name)
                        row["compile_s"] = round(time.perf_counter() - t0, 2)
                        got = stage.run(feeds)[0]
                        times = []
                        for _ in range(REPS):
                            t0 = time.perf_counter()
                            stage.run(feeds)
                            times.append(time.perf_counter() - t0)
                        a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
                        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
                        st = stage.statistics()
                        row.update(ok=cos >= (0.99999 if precision == "fp32" else 0.999), cosine=cos,
                                   rel_l2=float(np.linalg.norm(a - b) / np.linalg.norm(b)),
                                   argmax_same=bool(a.argmax() == b.argmax()),
                                   ncnn_median_ms=round(float(np.median(times)) * 1e3, 3), ort_cpu_ms=round(ort_ms, 3),
                                   probe_cosine=st.accuracy.min_cosine if st.accuracy else None,
                                   input_copies=st.input_copies, output_copies=st.output_copies)
                        stage.close()
                    except CompileError as exc:
                        row.update(ok=False, refused=str(exc)[:400])
                    bad += not row["ok"]
                    emit(row)
            # the silent cases: each must be refused before it runs
            for case, model in _silent_cases():
                dev = Device(name="gpu", kind="gpu", backend="ncnn", options={"vulkan_device": vk.index,
                                                                            "cache_dir": cache})
                try:
                    backend.compile(model, dev, name=case).close()
                    row = {"device": vk.name, "silent_case": case, "ok": False, "ran": True}
                except CompileError as exc:
                    row = {"device": vk.name, "silent_case": case, "ok": True, "refused": str(exc)[:300]}
                bad += not row["ok"]
                emit(row)
    emit({"summary": True, "failed": bad, "backend": str(backend.statistics())})
    return 1 if bad else 0


def _silent_cases() -> list[tuple[str, Any]]:
    import onnx
    from onnx import TensorProto, helper

    def model(nodes: list[Any], shape: list[int], out_shape: list[int], opset: int = 13) -> Any:
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m

    pool = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[0, 0, 1, 1])
    relu = helper.make_node("Relu", ["x"], ["y"])
    out = [("avgpool_asymmetric_pads", model([pool], [1, 4, 8, 8], [1, 4, 7, 7])),
           ("batch_2", model([relu], [2, 4, 8, 8], [2, 4, 8, 8]))]
    onnx.checker.check_model(out[0][1])
    return out


if __name__ == "__main__":
    sys.exit(main())
