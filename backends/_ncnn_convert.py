"""ncnn's side of the ``ncnn`` backend: finding ncnn and pnnx, screening a stage for the cases pnnx
converts wrongly without saying so, converting a stage with pnnx, and describing Vulkan devices.

pnnx (PyPI ``pnnx``) is a standalone converter: ``pnnx STAGE.onnx inputshape=[1,3,224,224]
fp16=0|1`` writes ``.ncnn.param`` (text) and ``.ncnn.bin`` (weights), inputs ``in0, in1, ...`` and
outputs ``out0, out1, ...`` in the ONNX graph's order. It runs in a private temporary directory
(it writes several side files next to its input), its exit status and files are checked, and its
last lines are the refusal message when it fails.

Three failures are *silent* (pnnx exits 0; measured, ``../shared/reference/ncnn.md``): Softmax at
opset < 13 on a tensor of rank > 2 (a softmax over a size-1 axis; the stage is raised to opset
13 first, which fixes it), AveragePool with asymmetric pads (left as a raw layer ncnn cannot
load), and a batch other than 1 (ncnn blobs have no batch axis). :func:`silent_failure` names
them before anything is converted; the compile-time probe against onnxruntime catches the rest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hetsched._errors import BackendUnavailableError, CompileError

# numpy and onnx import where a stage is checked or converted: the Vulkan probe (hetsched info,
# doctor) must not import onnx (issue 22).
if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = [
    "CONVERT_TIMEOUT_S",
    "COSINE_FLOOR",
    "INSTALL",
    "NCNN_OPS",
    "Converted",
    "VulkanInfo",
    "convert",
    "float_outputs",
    "import_ncnn",
    "ncnn_unavailable_reason",
    "pnnx_path",
    "silent_failure",
    "versions",
    "vulkan_devices",
]

INSTALL = "pip install 'hetsched[ncnn]' (PyPI ncnn and pnnx) and a Vulkan driver (Debian: mesa-vulkan-drivers libvulkan1)"

COSINE_FLOOR = {"fp32": 0.99999, "fp16": 0.999}
"""Least cosine similarity with fp32 onnxruntime a converted stage must reach at its compile-time
probe, per precision (fp32 measured >= 0.9999999 on 38 partitions, fp16 >= 0.9998 on whole models)."""

CONVERT_TIMEOUT_S = 600.0
"""A pnnx run longer than this is killed and the stage refused (whole models take 5-50 s)."""

NCNN_OPS = (
    "Abs", "Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "Div",
    "Dropout", "Elu", "Exp", "Flatten", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "HardSwish",
    "Identity", "InstanceNormalization", "LeakyRelu", "Log", "LRN", "MatMul", "Max", "MaxPool", "Min", "Mul",
    "Neg", "Pad", "PRelu", "ReduceMax", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Resize", "Sigmoid",
    "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Transpose", "Unsqueeze",
)
"""First guess of the ONNX ops pnnx maps onto ncnn layers (float tensors); the compile-time probe
decides per stage."""


def import_ncnn() -> Any:
    """The ``ncnn`` module.

    :raises BackendUnavailableError: ncnn is not installed (names the extra).
    """
    try:
        import ncnn
    except ImportError as exc:
        raise BackendUnavailableError(f"the ncnn backend needs the ncnn package: {INSTALL} ({exc})") from exc
    return ncnn


def pnnx_path() -> str:
    """The pnnx executable: the binary inside the ``pnnx`` package, else ``pnnx`` on PATH.

    :raises BackendUnavailableError: neither exists.
    """
    try:
        import pnnx

        exe = os.path.join(os.path.dirname(pnnx.__file__), "pnnx")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    except ImportError:
        pass
    found = shutil.which("pnnx")
    if found is None:
        raise BackendUnavailableError(f"the ncnn backend converts stages with pnnx, which is not installed: {INSTALL}")
    return found


def versions() -> tuple[str, str]:
    """(pnnx version, ncnn version), the parts of a cache key that name the converter.

    :raises BackendUnavailableError: either is missing.
    """
    ncnn = import_ncnn()
    pnnx_path()
    try:
        from importlib.metadata import version

        pv = version("pnnx")
    except Exception:  # a pnnx on PATH without metadata: its binary's identity
        exe = pnnx_path()
        st = os.stat(exe)
        pv = f"binary:{st.st_size}:{int(st.st_mtime)}"
    return pv, str(getattr(ncnn, "__version__", "?"))


@dataclass(frozen=True)
class VulkanInfo:
    """A Vulkan device as ncnn sees it."""

    index: int
    name: str
    type: str
    """``"integrated"``, ``"discrete"``, ``"virtual"``, ``"cpu"`` (a software driver: lavapipe)."""
    vendor_id: int
    driver_version: int
    api_version: str
    heap_budget_mb: int | None
    """ncnn's estimate of the memory it may use on the device (``VulkanDevice.get_heap_budget``)."""

    def describe(self) -> str:
        mem = f", heap budget {self.heap_budget_mb} MB" if self.heap_budget_mb is not None else ""
        return (f"{self.name} ({self.type}, vendor {self.vendor_id:#x}, Vulkan {self.api_version}, "
                f"driver {self.driver_version:#x}{mem})")


_TYPES = {0: "discrete", 1: "integrated", 2: "virtual", 3: "cpu"}  # ncnn GpuInfo::type()


def vulkan_devices() -> list[VulkanInfo]:
    """The Vulkan devices ncnn finds (empty when ncnn or a Vulkan driver is missing)."""
    try:
        ncnn = import_ncnn()
        n = int(ncnn.get_gpu_count())
    except (BackendUnavailableError, RuntimeError, OSError):
        return []
    out: list[VulkanInfo] = []
    for i in range(n):
        info = ncnn.get_gpu_info(i)
        api = int(info.api_version())
        try:
            budget: int | None = int(ncnn.get_gpu_device(i).get_heap_budget())
        except Exception:  # a driver that cannot say
            budget = None
        out.append(VulkanInfo(i, str(info.device_name()), _TYPES.get(int(info.type()), str(info.type())),
                              int(info.vendor_id()), int(info.driver_version()),
                              f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}", budget))
    return out


def ncnn_unavailable_reason() -> str | None:
    """Why no stage can run through ncnn here (ncnn, pnnx or a Vulkan device missing), or None."""
    try:
        import_ncnn()
        pnnx_path()
    except BackendUnavailableError as exc:
        return str(exc)
    if not vulkan_devices():
        return "ncnn finds no Vulkan device (install a Vulkan driver and loader: Debian mesa-vulkan-drivers libvulkan1)"
    return None


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
    for t in model.graph.initializer:
        out[t.name] = list(t.dims)
    return out


def silent_failure(model: onnx.ModelProto) -> str | None:
    """Why pnnx would convert this (prepared) stage wrongly without saying so, or None.

    The cases measured: an input or output whose batch (first dim) is not 1, or that is not
    float32 (ncnn blobs are float, without a batch axis); AveragePool with asymmetric pads or
    ``auto_pad`` SAME; Softmax/LogSoftmax at opset < 13 on a tensor of rank > 2.
    """
    import onnx
    import onnx.helper

    inits = {t.name for t in model.graph.initializer}
    for vi in [*(i for i in model.graph.input if i.name not in inits), *model.graph.output]:
        tt = vi.type.tensor_type
        if tt.elem_type != onnx.TensorProto.FLOAT:
            dtype = onnx.TensorProto.DataType.Name(tt.elem_type)
            return f"tensor {vi.name!r} is {dtype}; ncnn stages take and return float32 only"
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if not dims or len(dims) > 5:
            return f"tensor {vi.name!r} has rank {len(dims)}; ncnn blobs hold rank 1-5 tensors of batch 1"
        if dims[0] != 1:
            return (f"tensor {vi.name!r} has batch {dims[0]} (shape {dims}); ncnn blobs have no batch axis, "
                    "so ncnn stages take batch 1 only")
    opset = _opset(model)
    shapes = _shapes(model)
    for node in model.graph.node:
        if node.op_type == "AveragePool":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            pads = list(attrs.get("pads", []))
            auto = attrs.get("auto_pad", b"NOTSET")
            auto = auto.decode() if isinstance(auto, bytes) else str(auto)
            half = len(pads) // 2
            if pads and pads[:half] != pads[half:]:
                return f"AveragePool {node.name or node.output[0]!r} has asymmetric pads {pads}; pnnx drops it"
            if auto.startswith("SAME"):
                return f"AveragePool {node.name or node.output[0]!r} has auto_pad={auto}; pnnx drops it"
        if node.op_type in ("Softmax", "LogSoftmax") and opset < 13:
            rank = len(shapes.get(node.input[0], []))
            if rank != 2:
                return (f"{node.op_type} {node.name or node.output[0]!r} at opset {opset} on a tensor of rank "
                        f"{rank or '?'}; pnnx converts it to a softmax over the wrong axis (raise the stage to opset 13)")
    return None


@dataclass(frozen=True)
class Converted:
    param: bytes
    bin: bytes
    seconds: float
    log_tail: str


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def convert(model_bytes: bytes, in_shapes: Sequence[tuple[int, ...]], *, fp16: bool) -> Converted:
    """Convert one prepared stage with pnnx (in a private temporary directory, removed after).

    :raises CompileError: pnnx failed, timed out, or wrote no ncnn files (its own last lines).
    :raises BackendUnavailableError: pnnx is missing.
    """
    import time

    exe = pnnx_path()
    shape_arg = ",".join("[" + ",".join(str(int(d)) for d in s) + "]f32" for s in in_shapes)
    with tempfile.TemporaryDirectory(prefix="hetsched-pnnx-") as tmp:
        src = os.path.join(tmp, "stage.onnx")
        with open(src, "wb") as f:
            f.write(model_bytes)
        names = {k: os.path.join(tmp, v) for k, v in (
            ("ncnnparam", "s.ncnn.param"), ("ncnnbin", "s.ncnn.bin"), ("pnnxparam", "s.pnnx.param"),
            ("pnnxbin", "s.pnnx.bin"), ("pnnxpy", "s_pnnx.py"), ("pnnxonnx", "s.pnnx.onnx"), ("ncnnpy", "s_ncnn.py"))}
        args = [exe, src, f"inputshape={shape_arg}", f"fp16={int(fp16)}", *(f"{k}={v}" for k, v in names.items())]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, errors="replace",
                                  timeout=CONVERT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise CompileError(f"pnnx did not finish converting the stage in {CONVERT_TIMEOUT_S:.0f} s") from exc
        except OSError as exc:
            raise CompileError(f"pnnx could not be started ({exe}): {exc}") from exc
        seconds = time.perf_counter() - t0
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0:
            raise CompileError(f"pnnx failed (exit {proc.returncode}): {_tail(log)}")
        try:
            with open(names["ncnnparam"], "rb") as f:
                param = f.read()
            with open(names["ncnnbin"], "rb") as f:
                weights = f.read()
        except OSError as exc:
            raise CompileError(f"pnnx exited 0 but wrote no ncnn model ({exc}): {_tail(log)}") from exc
    ignored = [ln.strip() for ln in log.splitlines() if ln.lstrip().startswith(("ignore ", "todo "))]
    if ignored:  # a layer pnnx could not map is left raw in the .param: ncnn will refuse it
        log = "\n".join(ignored) + "\n" + log
    return Converted(param, weights, seconds, _tail(log))


def float_outputs(arrays: Sequence[Any], specs: Sequence[tuple[np.dtype[Any], tuple[int, ...]]]) -> list[np.ndarray]:
    """ncnn's output Mats as arrays of the ONNX outputs' shapes (views; ncnn drops the batch axis).

    :raises ValueError: an output's element count differs from its ONNX shape's.
    """
    import numpy as np

    out = []
    for i, (arr, (_dt, shape)) in enumerate(zip(arrays, specs, strict=True)):
        a = np.asarray(arr)
        if a.size != int(np.prod(shape)):
            raise ValueError(f"output {i} has {a.size} elements from ncnn (shape {list(a.shape)}); "
                             f"the stage's ONNX output is {list(shape)}")
        out.append(a.reshape(shape))
    return out
