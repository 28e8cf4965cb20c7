"""Simulated SoC devices (the twin's CPU clusters, GPU and NPU) — a clearly labelled simulator.

Every stage runs **for real** on the host with onnxruntime's CPU EP (outputs are
exact), never pinned to cores the host lacks. What the simulation adds is the
board: which ops each accelerator can run (so what RKNN or DLA cannot run falls
back elsewhere), and the stage's *modelled* latency and energy at the domain's
current clocks — a roofline split: compute-bound work scales with the core clock,
memory-bound work with the memory clock.

::

    devices = twin_devices("rk3588")                       # cluster0/4/6, gpu, npu
    async with Session(model, devices=devices) as s: ...
    devices[4]  # Device(name="npu", kind="npu", backend="sim", ...)
    twin_devices("orin-nx")                                # cluster0/4, gpu, dla:0, dla:1

**Paced mode** (``paced_devices(devices, pace=K)``, i.e. ``Device.options["pace"] = K`` and
``options["compute"] = "skip"``): for running the *real* runtime (sessions, the scheduler) in the
twin's board time. Each stage run is held in flight on the host for its modelled time
(roofline at the clocks it starts at, plus the device's launch ``options["launch_s"]``) times
``K``, with the twin's contention model (``hetsched/_twin/contention.py``: the run's progress
rate changes whenever another run starts or ends on its device, or loads DRAM), so host seconds
/ K are board seconds. With ``"compute": "skip"`` the host's onnxruntime is **not run**: the
outputs are zeros of the declared shapes and dtypes (**not computed**), so the host's CPU speed
does not enter the timing; ``"compute": "run"`` runs it inside the paced window (a run whose
host compute outlasts its paced time then takes the host's time). Pick K large enough that the
scheduler's overhead and host noise are small against K x the stage times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import onnx
from onnx import TensorProto

from hetsched._errors import CompileError, DeviceSpecError, StageExecutionError
from hetsched._planning.costs import LAUNCH_S, STAGE_OVERHEAD_S, analytic_node_costs, roofline
from hetsched._planning.fold import restore_control_flow_dims
from hetsched._planning.graph import GraphIndex
from hetsched._platform.affinity import host_cpus

from ._base import NO_BACKEND_HOOKS, Capabilities, CompiledStage, Device, OpRule, StageHooks, TensorSpec
from .cpu import CpuBackend

if TYPE_CHECKING:
    from hetsched._twin.contention import SharedRun

_T = TypeVar("_T")

__all__ = ["COMPUTE_MODES", "OP_SETS", "SimBackend", "SimStage", "SimStageStatistics", "paced_devices", "stage_model_size",
           "twin_devices"]

COMPUTE_MODES = ("run", "skip")
"""``Device.options["compute"]`` of a twin device: run the stage on the host (default), or skip it
(paced mode only: outputs are zeros of the declared shapes and dtypes, not computed)."""

_FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32})

_CNN_CORE = (
    "Conv", "ConvTranspose", "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
    "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "Add", "Sub", "Mul",
    "Concat", "Dropout", "Identity", "LRN", "Softmax", "Resize", "Pad",
)

# Listed unsupported by RKNN-Toolkit2's operator support document, yet converted and run
# correctly by the toolkit (../shared/reference/accelerators.md §1); the twin's NPU takes them
# as the real backend's first guess does (a CNN's residual ``Sum`` stays on the NPU).
_RKNN_CONVERTS_ANYWAY = ("Sum", "Einsum", "TopK", "Abs", "Neg", "Reciprocal")

# Listed supported by the same document (doc/RKNNToolKit2_OP_Support-v2.1.0.md) and common in
# exported CNNs: a HardSwish spelled x*Clip(x+3)/6 (PaddlePaddle's MobileNetV3 / PP-OCR export),
# the Constant/Shape/Cast/Squeeze plumbing of exporters, LayerNorm spelled ReduceMean/Pow/Sqrt.
# Without them each such op became a CPU unit and cut a MobileNet body into CPU stages.
_RKNN_ELEMENTWISE_AND_SHAPE = (
    "Div", "Pow", "Sqrt", "Exp", "Tanh", "Erf", "Max", "Min", "PRelu", "Elu", "Constant", "Cast", "Shape",
    "Squeeze", "Unsqueeze", "Expand", "Gather", "ReduceMean", "ReduceSum", "ReduceMax", "GlobalMaxPool",
    "InstanceNormalization", "LayerNormalization", "DepthToSpace", "SpaceToDepth",
)

# TensorRT's ElementWise layer runs on DLA for Sum, Sub, Prod, Max, Min, Div, Pow (docs/sources.md
# [trt-dla-layers]); the ONNX parser builds one from each of these ops
# (a ResNet's residual ``Sum``).
_DLA_ELEMENTWISE = ("Sum", "Max", "Min", "Div", "Pow")

# Op limits per accelerator family (docs/sources.md [rknn-ops], [trt-dla]): RKNN runs a CNN
# core set plus reshaping/matmul (RKNN-Toolkit2 operator support list); TensorRT DLA runs
# convolutional layers in FP16/INT8 only (no MatMul, no data-dependent shapes; TensorRT
# developer guide, "Working with DLA"); Mali via OpenCL a broader float set; Ampere
# (TensorRT on the Orin GPU) nearly everything.
OP_SETS: Mapping[str, Capabilities] = {
    "cpu": Capabilities.everything(),
    "ampere": Capabilities(allow=(OpRule(None, domain=""),), deny=tuple(
        OpRule(o) for o in ("If", "Loop", "Scan", "NonMaxSuppression", "StringNormalizer", "RandomNormal",
                            "RandomUniform", "Multinomial"))),
    "mali": Capabilities.ops((*_CNN_CORE, "Div", "Pow", "Sqrt", "Exp", "Tanh", "Erf", "Split", "Slice", "Reshape",
                              "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Gemm", "MatMul", "ReduceMean",
                              "ReduceSum", "ReduceMax", "GlobalMaxPool", "InstanceNormalization",
                              "LayerNormalization", "Gather"), dtypes=_FLOATS),
    "rknn": Capabilities.ops((*_CNN_CORE, "Reshape", "Flatten", "Transpose", "Gemm", "MatMul", "Split", "Slice",
                              *_RKNN_ELEMENTWISE_AND_SHAPE, *_RKNN_CONVERTS_ANYWAY), dtypes=_FLOATS),
    "dla": Capabilities.ops((*_CNN_CORE, "Tanh", *_DLA_ELEMENTWISE),
                            dtypes=frozenset({TensorProto.FLOAT, TensorProto.FLOAT16})),
}

_REPORTER_RETRY_S = 1.0
"""Seconds between two looks for a live twin's load channel under a device's root."""

_DEFAULT_OP_SET = {"cpu": "cpu", "gpu": "ampere", "npu": "rknn", "dla": "dla"}


@dataclass(frozen=True)
class SimStageStatistics:
    runs: int
    modelled_time_s: float
    modelled_energy_j: float
    last_modelled_s: float
    host_time_s: float
    busy_time_s: float = 0.0
    """Modelled device time that was this stage's own: ``modelled_time_s`` less the waits of
    sharing the device with other runs in flight on the twin board (``hetsched/_twin/contention.py``)."""
    pace: float | None = None
    """The paced mode's dilation K (host seconds per board second), None when not paced."""
    computed: bool = True
    """False: outputs were not computed (zeros of the declared shapes: ``compute="skip"``)."""


def _pace_of(device: Device) -> tuple[float | None, bool]:
    """``(K or None, compute)`` of ``device``'s options, validated.

    :raises DeviceSpecError: a pace that is not a finite number > 0, an unknown compute mode, or
        ``compute="skip"`` without a pace (a twin stage that neither computes nor paces serves nothing).
    """
    pace = device.options.get("pace")
    compute = device.options.get("compute", "run")
    if pace is not None and (isinstance(pace, bool) or not isinstance(pace, (int, float))
                             or not (0.0 < float(pace) < float("inf"))):
        raise DeviceSpecError(f"twin device {device.name!r}: options['pace'] = {pace!r} must be a finite number > 0")
    if compute not in COMPUTE_MODES:
        raise DeviceSpecError(f"twin device {device.name!r}: options['compute'] = {compute!r}, expected one of "
                              f"{COMPUTE_MODES}")
    if compute == "skip" and pace is None:
        raise DeviceSpecError(f"twin device {device.name!r}: options['compute'] = 'skip' needs options['pace']")
    return (float(pace) if pace is not None else None), compute == "run"


def paced_devices(devices: Sequence[Device], pace: float, *, compute: str = "skip") -> list[Device]:
    """``devices`` (twin devices) in paced mode: each stage run takes K = ``pace`` x its modelled
    board time on the host clock (with the twin's contention), its outputs zeros of the declared
    shapes and dtypes, **not computed**, unless ``compute="run"``. See the module's docstring.

    :raises DeviceSpecError: a device that is not a twin device (``backend="sim"``), or bad values.
    """
    out = []
    for d in devices:
        if d.backend != "sim":
            raise DeviceSpecError(f"paced_devices: {d.name!r} is not a twin device (backend {d.backend!r})")
        p = dataclasses.replace(d, options={**d.options, "pace": pace, "compute": compute})
        _pace_of(p)
        out.append(p)
    return out


class _SkippedStage:
    """A stage that is not computed (paced mode, ``compute="skip"``): zeros of the declared outputs.

    An output whose shape shape inference cannot give (a Reshape to a shape computed in the
    graph) is learned from one real run: the stage's first run is computed on the host by
    ``inner`` (onnxruntime), every later one is zeros of the shapes that run gave."""

    def __init__(self, input_names: tuple[str, ...], specs: list[tuple[str, np.dtype[Any], tuple[int, ...] | None]],
                 inner: CompiledStage | None = None):
        self.input_names = input_names
        self.output_names = tuple(n for n, _, _ in specs)
        self._specs = [(dt, shape) for _, dt, shape in specs]
        self._inner = inner
        self._learn_lock = threading.Lock()
        self.computed_runs = 0
        """Runs computed on the host to learn a shape (0 or 1)."""
        self.hooks = StageHooks(in_place=self)

    def output_specs(self) -> Sequence[TensorSpec] | None:
        specs = self._specs
        if any(shape is None for _, shape in specs):
            return None  # known after the first run: the runtime calls run()
        return [(dt, shape) for dt, shape in specs if shape is not None]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if any(shape is None for _, shape in self._specs):
            with self._learn_lock:
                if any(shape is None for _, shape in self._specs) and self._inner is not None:
                    outs = self._inner.run(feeds)
                    self.computed_runs += 1
                    self._specs = [(np.dtype(o.dtype), tuple(o.shape)) for o in outs]
                    return outs
        return [np.zeros(shape or (), dtype) for dtype, shape in self._specs]

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        for o in outputs:
            o[...] = 0

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


def _skipped_stage(model: onnx.ModelProto, inferred: onnx.ModelProto, name: str, device: Device,
                   compile_inner: Callable[[], CompiledStage]) -> _SkippedStage:
    """The not-computed stage of ``model``: its inputs, and its outputs' shapes/dtypes from ``inferred``
    (an output inference cannot size: learned from the first run, computed by ``compile_inner()``'s stage).

    :raises CompileError: an output whose dtype is not declared.
    """
    inits = {t.name for t in model.graph.initializer}
    inputs = tuple(i.name for i in model.graph.input if i.name not in inits)
    declared = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    specs: list[tuple[str, np.dtype[Any], tuple[int, ...] | None]] = []
    for out in model.graph.output:
        tt = declared.get(out.name, out).type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        if tt.elem_type == TensorProto.UNDEFINED:
            raise CompileError(f"stage {name!r} on {device.name!r}: compute='skip' needs every output's dtype; "
                               f"output {out.name!r} declares none")
        static = tt.HasField("shape") and all(v >= 0 for v in dims)
        specs.append((out.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims if static else None))
    inner = compile_inner() if any(shape is None for _, _, shape in specs) else None
    return _SkippedStage(inputs, specs, inner)


class SimStage:
    """A stage run by onnxruntime on the host, reporting the twin's modelled time and energy."""

    def __init__(self, inner: CompiledStage, name: str, device: Device, flops: float, nbytes: float):
        self._inner = inner
        self.name = name
        self.device = device
        self.input_names = inner.input_names
        self.output_names = inner.output_names
        self.flops = flops
        self.bytes = nbytes
        self._lock = threading.Lock()
        self._runs = 0
        self._time = 0.0
        self._energy = 0.0
        self._last = 0.0
        self._host = 0.0
        self._busy = 0.0
        self._pace, self._computed = _pace_of(device)
        self._launch = float(device.options.get("launch_s", 0.0)) if self._pace is not None else 0.0
        self._local = threading.local()  # per worker thread: (seconds, joules) of its last run
        root = device.options.get("root")
        self._root: str | None = str(root) if root is not None else None
        from hetsched._twin.contention import shared_board

        # the twin board the device belongs to: runs in flight on it at once share it
        self._board = shared_board(self._root or f"soc:{device.options.get('soc', '')}")
        self._reporter: Any = None
        self._reporter_checked = -1.0
        inner_hooks = inner.hooks
        self.hooks = StageHooks(
            in_place=self if inner_hooks.in_place is not None else None,
            unbound_reason=inner_hooks.unbound_reason, modelled=self, statistics=self,
        )
        """In place where the inner stage is; its modelled time and energy its own."""

    def modelled(self) -> tuple[float, float]:
        """(seconds, joules) of one run at the current clocks (roofline)."""
        t, energy, _ = self._roofline()
        return t, energy

    def _roofline(self) -> tuple[float, float, float]:
        """(seconds, joules, seconds the memory is busy) of one run at the current clocks: the
        planner's own model (:func:`hetsched._planning.costs.roofline`), so a plan's estimate for a
        twin device is the time the twin then models."""
        domain = self.device.options["profile_domain"]
        t, t_compute, t_mem, f = roofline(self.device, self.flops, self.bytes)
        util = t_compute / t if t > 0 else 0.0
        energy = domain.full_power_w(f or domain.max_hz) * util * t
        return t, energy, t_mem

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self._timed(lambda: self._inner.run(feeds))

    def _timed(self, call: Callable[[], _T]) -> _T:
        """Run ``call`` (the inner stage's run) as one run in flight on the shared twin board
        (``hetsched/_twin/contention.py``: runs on the board at once share it) and count it.
        Subclasses wrapping another engine (RKNN, ncnn) run through this too."""
        t, e, t_mem = self._roofline()
        t += self._launch  # paced: the stage call's launch is board time too (0 otherwise)
        token = self._board.begin(self.device.name, t, min(t_mem, t))
        t0 = time.perf_counter()
        try:
            out = call()
            if self._pace is not None:  # held in flight for K x its modelled (shared) time
                self._board.pace(token, t * self._pace)
        finally:
            shared = self._board.end(token)
        self._account(time.perf_counter() - t0, shared, e)
        return out

    def _account(self, host_s: float, shared: SharedRun | None = None, alone_energy_j: float = 0.0) -> None:
        """Count one run: its modelled time with the board's sharing (``shared``); its energy
        follows its own busy time (a stall on a saturated DRAM keeps the device busy). Without
        ``shared`` (a caller that timed the run itself, not through :meth:`_timed`): a lone run."""
        if shared is None:
            from hetsched._twin.contention import SharedRun

            t_alone, alone_energy_j, t_mem = self._roofline()
            shared = SharedRun(t_alone, t_alone, t_alone, t_mem, 1.0, 1.0)
        t = shared.latency_s
        e = alone_energy_j * shared.busy_s / shared.alone_s if shared.alone_s > 0 else alone_energy_j
        self._local.last = (t, e)
        with self._lock:
            self._runs += 1
            self._time += t
            self._busy += shared.busy_s
            self._energy += e
            self._last = t
            self._host += host_s
        if self._root is not None:
            self._report(shared.busy_s, shared.memory_s)

    def _report(self, busy_s: float, memory_s: float) -> None:
        """Tell a live twin under the device's root that its domain was busy ``busy_s`` board
        seconds and the memory ``memory_s`` (``hetsched/_twin/loadfile.py``), so its loads,
        heat and governors (the memory controller's too) follow."""
        reporter = self._reporter
        if reporter is None:
            now = time.monotonic()
            if now - self._reporter_checked < _REPORTER_RETRY_S:
                return
            self._reporter_checked = now  # the twin may start after the session: look again later
            from hetsched._errors import TwinError
            from hetsched._twin.loadfile import LoadReporter

            try:
                reporter = self._reporter = LoadReporter.for_root(self._root)  # type: ignore[arg-type]
            except TwinError:
                self._root = None  # a tampered channel (a link): never write there
                return
            if reporter is None:
                return
        opt = self.device.options
        reporter.report(opt["profile_domain"].name, busy_s)
        mem = opt.get("memory_domain_profile")
        if mem is not None and memory_s > 0:
            reporter.report(mem.name, memory_s)

    def last_run_seconds(self) -> float:
        """Modelled board seconds of the last run in this thread (the runtime learns these as
        the stage's cost: the board's time, not the host's)."""
        last = getattr(self._local, "last", None)
        return last[0] if last is not None else 0.0

    def last_run_energy_j(self) -> float:
        """Modelled joules of the last run in this thread."""
        last = getattr(self._local, "last", None)
        return last[1] if last is not None else 0.0

    def output_specs(self) -> Sequence[TensorSpec] | None:
        """The inner stage's static output specs (None: it cannot run in place)."""
        inner = self._inner.hooks.in_place
        return inner.output_specs() if inner is not None else None

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        """Run in place through the inner stage, accounting the modelled time like :meth:`run`."""
        inner = self._inner.hooks.in_place
        if inner is None:  # never: hooks.in_place is None then, so the runtime does not call it
            raise StageExecutionError(f"stage {self.name!r} cannot run in place", stage=self.name,
                                      device=self.device.name)
        self._timed(lambda: inner.run_into(feeds, outputs))

    def statistics(self) -> SimStageStatistics:
        with self._lock:
            return SimStageStatistics(self._runs, self._time, self._energy, self._last, self._host, self._busy,
                                      self._pace, self._computed)

    def close(self) -> None:
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close()
        self._inner.close()


class SimBackend:
    """Backend for twin devices (``Device.backend == "sim"``)."""

    name = "sim"
    hooks = NO_BACKEND_HOOKS

    def __init__(self) -> None:
        self._cpu = CpuBackend()

    def capabilities(self, device: Device) -> Capabilities:
        return OP_SETS[device.options.get("op_set", _DEFAULT_OP_SET[device.kind])]

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> CompiledStage:
        _, computed = _pace_of(device)
        try:
            # sized from the stage's fixed dims (extract_stage frees a control-flow stage's for onnxruntime)
            inferred = onnx.shape_inference.infer_shapes(restore_control_flow_dims(model))
        except Exception:  # shapes only refine the cost (and name a skipped stage's outputs)
            inferred = model
        host = Device(name=f"{device.name}@host", kind="cpu", backend="cpu", cpus=device.cpus)
        inner: CompiledStage
        if computed:
            inner = self._cpu.compile(model, host, name=name)
        else:  # a Reshape's shape computed in the stage: data propagation names the output's dims
            declared = inferred  # (for the outputs' specs only: the cost below is the planner's sizing)
            with contextlib.suppress(Exception):  # the plain inference's shapes stand
                declared = onnx.shape_inference.infer_shapes(restore_control_flow_dims(model), data_prop=True)
            inner = _skipped_stage(model, declared, name, device, lambda: self._cpu.compile(model, host, name=name))
        return SimStage(inner, name, device, *stage_size(inferred))


def stage_size(model: onnx.ModelProto) -> tuple[float, float]:
    """``(FLOPs, bytes)`` the twin sizes a stage's run by (the sum of its nodes' analytic costs), from a
    stage model already shape-inferred (:meth:`SimBackend.compile` infers it from the stage's fixed dims)."""
    costs = analytic_node_costs(GraphIndex(model))
    return sum(c.flops for c in costs), sum(c.bytes for c in costs)


def stage_model_size(model: onnx.ModelProto) -> tuple[float, float]:
    """``(FLOPs, bytes)`` of a stage model as :meth:`SimBackend.compile` sizes it (shape inference first)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(restore_control_flow_dims(model))
    except Exception:  # as compile: shapes only refine the cost
        inferred = model
    return stage_size(inferred)


def twin_devices(
    soc: Any,
    *,
    clock: Callable[[str], int | None] | None = None,
    op_sets: Mapping[str, str] | None = None,
    host: tuple[int, ...] | None = None,
    root: str | None = None,
) -> list[Device]:
    """One simulated :class:`Device` per compute domain of a twin SoC profile, then one per
    device-only engine (Orin DLA cores: ``dla:0``, ``dla:1``, domains ``dla0``, ``dla1``).

    A CPU cluster's ``options["role"]`` is its rank among the profile's clusters (``"big"``,
    ``"little"``, ``"mid"``; ``"cpu"`` when every cluster is alike) and ``options["core"]`` its
    core name; an accelerator's role is its kind.

    :param soc: a profile name (``"rk3588"``, ``"orin-nx"``, ...) or a ``SocProfile``.
    :param clock: ``domain name -> current Hz`` (a live twin's or a SimBoard's clocks);
        default: every domain at its top OPP.
    :param op_sets: override the op set per domain name (``{"npu": "rknn"}``).
    :param host: host CPUs the stages really run on (default: every usable CPU; each
        device is given one, round-robin, so twin clusters never pin to CPUs the host lacks).
    :param root: the twin's root the devices belong to: their stages report their modelled
        busy time to a live twin there (``hetsched/_twin/loadfile.py``), so its loads,
        temperatures and governors follow the session's work.
    :raises UnknownSocError: unknown profile name.
    """
    from hetsched._twin.profiles import get_profile

    profile = get_profile(soc) if isinstance(soc, str) else soc
    cpus = host or host_cpus()
    clock_fn: Callable[[str], int | None] = clock or (lambda _name: None)
    mem = next((d for d in profile.domains if d.kind == "memory"), None)
    out: list[Device] = []
    compute: list[tuple[Any, Literal["cpu", "gpu", "npu", "dla"]]] = []
    for d in (*profile.domains, *getattr(profile, "engines", ())):
        kind = d.kind
        if kind == "cpu" or kind == "gpu" or kind == "npu" or kind == "dla":
            compute.append((d, kind))
    ranks = _cpu_ranks([d for d, kind in compute if kind == "cpu"])
    for i, (d, kind) in enumerate(compute):
        op_set = (op_sets or {}).get(d.name) or _op_set_for(profile, d)
        bw = mem.bandwidth_bps(mem.max_hz) if mem is not None else 1e10
        out.append(
            Device(
                name=f"dla:{d.name[3:]}" if kind == "dla" else d.name,
                kind=kind,
                backend="sim",
                cpus=(cpus[i % len(cpus)],),
                # unified-memory SoCs: every domain writes the same DRAM the host's buffers live in,
                # as the RKNN backend's NPU device (memory domain "host") does
                memory_domain="host",
                domain=d.name,
                capacity=float(d.capacity_dmips_mhz),
                max_freq_khz=d.max_hz // 1000,
                peak_flops=d.ops_per_cycle * d.max_hz,
                mem_bandwidth=bw,
                options={"clock": clock_fn, "profile_domain": d, "memory_domain_profile": mem,
                         "op_set": op_set, "soc": profile.name, "role": ranks.get(d.name, kind),
                         "core": d.core_name or kind, "simulated": True, "launch_s": launch_seconds(kind),
                         "root": root},
            )
        )
    return out


def _cpu_ranks(clusters: list[Any]) -> dict[str, str]:
    """Cluster domain name -> ``"big"``/``"little"``/``"mid"`` by (capacity, top clock), as the host's
    cluster discovery ranks them; ``"cpu"`` for each when they are all alike."""
    keys = sorted({(d.capacity_dmips_mhz, d.max_hz) for d in clusters})
    if len(keys) <= 1:
        return {d.name: "cpu" for d in clusters}
    out = {}
    for d in clusters:
        k = (d.capacity_dmips_mhz, d.max_hz)
        out[d.name] = "little" if k == keys[0] else "big" if k == keys[-1] else "mid"
    return out


def launch_seconds(kind: str) -> float:
    """The modelled fixed cost of one stage call on a twin device of ``kind`` (the planner's
    prior for that kind, ``hetsched._planning.costs.LAUNCH_S``). A DLA task is submitted
    through the same host1x channel queue as a GPU job, so a DLA gets the GPU's prior when the
    planner has none of its own."""
    if kind == "dla" and "dla" not in LAUNCH_S:
        kind = "gpu"
    return LAUNCH_S.get(kind, STAGE_OVERHEAD_S)


def _op_set_for(profile: Any, domain: Any) -> str:
    """The op set of ``domain``: the profile's accelerator op set for its kind; a DLA engine's is
    ``dla`` (TensorRT's DLA limits) unless the profile says otherwise; else ``cpu``."""
    default = "dla" if domain.kind == "dla" else "cpu"
    return str(profile.quirks.op_sets.get(domain.kind, default))


backend_class = SimBackend

# jetson_stats' engine clocks (jtop/core/engine.py): debugfs, one directory per engine clock.
_DEBUG_CLK_DIR = "sys/kernel/debug/clk"
_MAX_DLA_CORES = 2


def clock_from_root(root: str) -> Callable[[str], int | None]:
    """``domain name -> current Hz`` read live from a (twin's or real) sysfs tree under ``root``.

    CPU clusters ``cluster<N>`` read ``cpufreq/policyN/scaling_cur_freq`` (kHz); ``gpu``,
    ``npu`` and ``memory`` read their devfreq ``cur_freq`` (Hz), Jetson EMC its bpmp
    ``rate``; Jetson DLA cores ``dla<N>`` the debugfs engine clock ``dla<N>_core/clk_rate``
    (Hz) where the tree has one. Paths are discovered once; an unreadable file gives None
    (the caller then assumes the top OPP).
    """
    from hetsched._platform import SysfsRoot, discover
    from hetsched._platform.jetson import EMC_DIR

    fs = SysfsRoot(root)
    plat = discover(root)
    paths: dict[str, tuple[str, int]] = {}
    for c in plat.cpu_clusters:
        paths[f"cluster{c.policy}"] = (f"{c.path}/scaling_cur_freq", 1000)
    for d in plat.devices:
        if d.source == "devfreq":
            paths.setdefault(d.kind, (f"{d.path}/cur_freq", 1))
        elif d.source == "bpmp":
            paths.setdefault(d.kind, (f"{EMC_DIR}/rate", 1))
    for n in range(_MAX_DLA_CORES):
        rate = f"{_DEBUG_CLK_DIR}/dla{n}_core/clk_rate"
        if fs.exists(rate):
            paths[f"dla{n}"] = (rate, 1)

    def clock(domain: str) -> int | None:
        entry = paths.get(domain)
        if entry is None:
            return None
        value = fs.read_int(entry[0])
        return None if value is None else value * entry[1]

    return clock
