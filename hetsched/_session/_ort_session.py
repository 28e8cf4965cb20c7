"""``hetsched.InferenceSession``: onnxruntime's ``InferenceSession`` surface over hetsched sessions.

An app that calls ``onnxruntime.InferenceSession(path, sess_options=..., providers=[...])`` and
then ``get_inputs()``, ``get_modelmeta()``, ``run(output_names, feeds)`` switches with one line::

    import hetsched as ort          # or: from hetsched import InferenceSession

What maps to what:

* ``providers`` are devices (see :func:`hetsched._session._ort_meta.choose_providers`): the CPU provider
  is the board's CPU clusters, TensorRT/CUDA its GPU (and a DLA core with ``trt_dla_enable``),
  ``RknpuExecutionProvider`` the RK3588 NPU; hetsched device specs (``"npu"``, ``"cpu:0-3"``)
  are accepted as they are. Keywords of hetsched's own: ``root=``, ``policy=``, ``shapes=``.
* ``sess_options``: ``intra_op_num_threads`` (on the host, the CPU device gets that many
  cores), ``graph_optimization_level`` (every CPU stage's onnxruntime session),
  ``enable_profiling``/``profile_file_prefix`` (hetsched's trace, returned by
  ``end_profiling()``) and ``log_severity_level`` (the ``hetsched`` logger) are honoured; the
  other fields are accepted and ignored, with one debug log line.
* Input shapes may change from call to call. With only CPU devices one hetsched session serves
  every shape (onnxruntime runs the stages). With an accelerator, stages need fixed shapes: a
  plan is compiled when a shape signature is first seen and kept in a bounded cache (like
  onnxruntime's TensorRT profiles); ``shapes=`` compiles one up front. The first call with a
  new shape pays the compilation; ``statistics().compilations`` counts them.
* Errors keep hetsched's tree and also derive from what onnxruntime raises for the same cause
  (``InputError`` -> ``InvalidArgument`` (+ ``ValueError``), ``ModelNotFoundError`` ->
  ``NoSuchFile``, ``ModelFormatError`` -> ``InvalidProtobuf``, ``InvalidModelError`` ->
  ``InvalidGraph``, any other hetsched error -> ``Fail``), so ``except`` clauses written for
  onnxruntime keep working.

Unlike hetsched's :class:`Session`, an ``InferenceSession`` is not scoped by ``with`` in the
apps it replaces: its event-loop thread (an anyio blocking portal) lives from the constructor
until :meth:`close`, the end of a ``with`` block, or garbage collection, whichever comes first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.from_thread
import numpy as np
import onnx

from .._devices.resolve import resolve_devices
from .._errors import (
    HetschedError,
    InputError,
    InvalidModelError,
    ModelFormatError,
    ModelNotFoundError,
    RuntimeStateError,
)
from .._planning.model import load_model
from ..backends import Device
from ._ort_meta import (
    ModelMetadata,
    NodeArg,
    ProviderChoice,
    choose_providers,
    graph_inputs,
    graph_outputs,
    model_metadata,
    numpy_dtype,
    overridable_initializers,
    provider_for_device,
)

__all__ = ["InferenceSession", "InferenceSessionStatistics", "ort_compatible"]

_log = logging.getLogger("hetsched")

_DEFAULT_MAX_PLANS = 8
"""Compiled plans (one per input-shape signature) kept open when accelerators need fixed shapes."""

# sess_options fields hetsched honours; the others are reported once at debug level.
_HONOURED = ("intra_op_num_threads", "graph_optimization_level", "enable_profiling", "profile_file_prefix",
             "log_severity_level")
_KNOWN_IGNORED = ("inter_op_num_threads", "execution_mode", "enable_cpu_mem_arena", "enable_mem_pattern",
                  "enable_mem_reuse", "log_verbosity_level", "logid", "optimized_model_filepath",
                  "use_deterministic_compute", "execution_order")
# onnxruntime's log severities (0 verbose .. 4 fatal) as logging levels.
_SEVERITY = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


@dataclass(frozen=True)
class InferenceSessionStatistics:
    """What an :class:`InferenceSession` did so far."""

    runs: int
    """``run()`` calls that returned outputs."""
    compilations: int
    """hetsched sessions opened (plans compiled): one in total when one session serves every
    shape, else one per new input-shape signature (and again after an eviction)."""
    cache_hits: int
    """Runs served by a plan compiled for their shape signature earlier."""
    evictions: int
    """Plans closed to keep at most ``max_plans`` open."""
    open_plans: int
    """Plans open now."""
    per_shape: bool
    """True when accelerators need a plan per input-shape signature."""


# -- errors -------------------------------------------------------------------------------

_COMPAT: dict[type[BaseException], type[BaseException]] = {}


def _ort_base(err: HetschedError) -> type[Exception]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    base: type[Exception] = state.Fail  # onnxruntime's pybind module is untyped
    if isinstance(err, InputError):
        base = state.InvalidArgument
    elif isinstance(err, ModelNotFoundError):
        base = state.NoSuchFile
    elif isinstance(err, ModelFormatError):
        base = state.InvalidProtobuf
    elif isinstance(err, InvalidModelError):
        base = state.InvalidGraph
    return base


def ort_compatible(err: HetschedError) -> HetschedError:
    """``err`` as an instance of a class deriving from its own class and from the onnxruntime
    exception raised for the same cause (same message and attributes)."""
    base = _ort_base(err)
    if isinstance(err, base):
        return err
    cls = _COMPAT.get(type(err))
    if cls is None:
        cls = type(type(err).__name__, (type(err), base),
                   {"__module__": type(err).__module__, "__doc__": type(err).__doc__})
        _COMPAT[type(err)] = cls
    new: HetschedError = cls.__new__(cls)  # type: ignore[assignment]
    new.__dict__.update(err.__dict__)
    new.args = err.args
    return new


# -- the plans: one hetsched session per shape signature --------------------------------

Signature = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class _Plan:
    session: Any  # hetsched.Session
    context: Any  # the portal's wrapper of its ``async with``
    users: int = 0


@dataclass
class _State:
    """What closing needs (no reference to the InferenceSession, so GC can collect it)."""

    portal_cm: Any = None
    portal: Any = None
    plans: OrderedDict[Signature | None, _Plan] = dataclasses.field(default_factory=OrderedDict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    closed: bool = False


def _close(state: _State) -> None:
    with state.lock:
        if state.closed:
            return
        state.closed = True
        plans = list(state.plans.values())
        state.plans.clear()
    try:
        for plan in plans:
            plan.context.__exit__(None, None, None)
    finally:
        state.portal = None
        if state.portal_cm is not None:
            state.portal_cm.__exit__(None, None, None)


class InferenceSession:
    """onnxruntime's ``InferenceSession``, run by hetsched (see the module docstring).

    :param path_or_bytes: a model path, serialized bytes (as onnxruntime) or an ``onnx.ModelProto``.
    :param sess_options: an ``onnxruntime.SessionOptions`` (or any object with its fields).
    :param providers: provider names or ``(name, options)`` pairs, or hetsched device specs.
    :param provider_options: one options dict per provider (as onnxruntime).
    :param root: the board's filesystem root (a twin's root in tests); ``"/"`` by default.
    :param policy: a hetsched placement policy (object, function or name).
    :param shapes: ``{input: dims}`` fixing free dims up front (compiled in the constructor).
    :param max_plans: plans kept open when each shape signature needs its own.
    :param backend: the event loop of the session's thread (``"asyncio"`` or ``"trio"``).
    :param session_kwargs: further :class:`hetsched.Session` keywords.
    """

    def __init__(self, path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
                 sess_options: Any = None, providers: Sequence[Any] | None = None,
                 provider_options: Sequence[Mapping[str, Any]] | None = None, *,
                 root: str | os.PathLike[str] = "/", policy: Any = None,
                 shapes: Mapping[str, Sequence[int]] | None = None, max_plans: int = _DEFAULT_MAX_PLANS,
                 backend: str = "asyncio", **session_kwargs: Any):
        if max_plans < 1:
            raise ValueError(f"max_plans must be >= 1, got {max_plans}")
        self._state = _State()
        self._finalizer = weakref.finalize(self, _close, self._state)
        try:
            self._model = load_model(path_or_bytes, check=False, infer_shapes=False)
        except HetschedError as exc:
            raise ort_compatible(exc) from exc
        self._model_path = str(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else None
        self._inputs = graph_inputs(self._model)
        self._overridable = overridable_initializers(self._model)
        self._outputs = graph_outputs(self._model)
        self._meta = model_metadata(self._model)
        self._sess_options = sess_options
        self._root = root
        self._policy = policy
        self._max_plans = max_plans
        self._backend = backend
        self._session_kwargs = dict(session_kwargs)
        self._trace: str | None = None
        self._traces = 0
        self._profiling_start_ns = 0
        self._counts = {"runs": 0, "compilations": 0, "cache_hits": 0, "evictions": 0}
        self._apply_options(sess_options)
        self._choice, self._devices = self._resolve(providers, provider_options)
        self._per_shape = any(d.kind != "cpu" for d in self._devices)
        self._fixed = dict(shapes) if shapes else None
        self._state.portal_cm = anyio.from_thread.start_blocking_portal(backend)
        self._state.portal = self._state.portal_cm.__enter__()
        try:
            self._open_up_front()
        except BaseException:
            self.close()
            raise

    # -- construction ---------------------------------------------------------------------

    def _apply_options(self, so: Any) -> None:
        if so is None:
            return
        level = getattr(so, "log_severity_level", None)
        if isinstance(level, int) and level in _SEVERITY:
            _log.setLevel(_SEVERITY[level])
        if getattr(so, "enable_profiling", False):
            prefix = getattr(so, "profile_file_prefix", "") or "onnxruntime_profile_"
            self._trace = f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
            self._profiling_start_ns = time.time_ns()
        ignored = [name for name in _KNOWN_IGNORED if hasattr(so, name)]
        _log.debug("InferenceSession: sess_options %s honoured; %s accepted and ignored",
                   ", ".join(_HONOURED), ", ".join(ignored))

    def _resolve(self, providers: Sequence[Any] | None,
                 provider_options: Sequence[Mapping[str, Any]] | None) -> tuple[ProviderChoice, list[Device]]:
        choice = choose_providers(providers, provider_options)
        for name in choice.ignored:
            warnings.warn(f"Specified provider '{name}' has no hetsched device; it is ignored "
                          "(hetsched maps the CPU, TensorRT, CUDA and RKNPU providers to devices)", stacklevel=3)
        devices: list[Device] = []
        try:
            if choice.devices is None:
                devices = resolve_devices(None, root=self._root)
            for spec in choice.devices or ():
                try:
                    found = resolve_devices([spec], root=self._root)
                except HetschedError as exc:
                    if spec not in choice.optional:
                        raise
                    warnings.warn(f"device {spec!r} is not available here, its provider is ignored: {exc}",
                                  stacklevel=3)
                    continue
                devices.extend(d for d in found if d.name not in {x.name for x in devices})
            so = self._sess_options
            threads = getattr(so, "intra_op_num_threads", 0) if so is not None else 0
            level = getattr(so, "graph_optimization_level", None) if so is not None else None
            cpu_only_default = choice.devices is None or list(choice.devices) == ["clusters"]
            if isinstance(threads, int) and threads > 0 and str(self._root) == "/" and cpu_only_default:
                # On the host, onnxruntime's intra-op thread count becomes the CPU device's cores.
                cores = sorted({c for d in devices if d.kind == "cpu" for c in d.cpus})[:threads]
                if cores:
                    pinned = resolve_devices([f"cpu:{','.join(str(c) for c in cores)}"], root=self._root)
                    devices = pinned + [d for d in devices if d.kind != "cpu"]
        except HetschedError as exc:
            raise ort_compatible(exc) from exc
        return choice, [self._cpu_options(d, level) for d in devices]

    @staticmethod
    def _cpu_options(dev: Device, level: Any) -> Device:
        if dev.backend != "cpu" or level is None:
            return dev
        return dataclasses.replace(dev, options={**dev.options, "graph_optimization_level": level})

    def _free_inputs(self) -> list[NodeArg]:
        return [a for a in self._inputs if a.shape is None or any(not isinstance(d, int) for d in a.shape)]

    def _open_up_front(self) -> None:
        """Compile now what can be: the one plan of a CPU-only session, the plan for ``shapes=``,
        or the plan of a model without free dims. Otherwise the first run compiles."""
        if not self._per_shape:
            signature = None
        elif self._fixed is not None:
            signature = self._fixed_signature()
        elif not self._free_inputs():
            signature = tuple(sorted((a.name, tuple(d for d in a.shape or () if isinstance(d, int)))
                                     for a in self._inputs))
        else:
            return
        self._release(self._plan_for(signature))

    def _fixed_signature(self) -> Signature | None:
        if self._fixed is None:
            return None
        return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in self._fixed.items()))

    # -- plans ------------------------------------------------------------------------------

    def _portal(self) -> Any:
        portal = self._state.portal
        if portal is None or self._state.closed:
            raise ort_compatible(RuntimeStateError("InferenceSession is closed"))
        return portal

    def _open(self, signature: Signature | None) -> _Plan:
        from ._session import Session

        shapes = dict(signature) if signature is not None else None
        kwargs = dict(self._session_kwargs)
        if self._trace is not None:
            # One trace per plan: the first under onnxruntime's file name, later ones numbered.
            self._traces += 1
            kwargs["trace"] = self._trace if self._traces == 1 else self._trace.replace(".json", f"-{self._traces}.json")
        session = Session(self._model, devices=self._devices, root=self._root, policy=self._policy,
                          shapes=shapes, **kwargs)
        context = self._portal().wrap_async_context_manager(session)
        try:
            context.__enter__()
        except HetschedError as exc:
            raise ort_compatible(exc) from exc
        self._counts["compilations"] += 1
        return _Plan(session, context)

    def _plan_for(self, signature: Signature | None) -> _Plan:
        state = self._state
        with state.lock:
            plan = state.plans.get(signature)
            if plan is not None:
                state.plans.move_to_end(signature)
                plan.users += 1
                if signature is not None:
                    self._counts["cache_hits"] += 1
                return plan
        opened = self._open(signature)  # outside the lock: compiling can take long
        evicted: list[_Plan] = []
        plan = opened
        with state.lock:
            if state.closed:
                evicted.append(opened)
            else:
                plan = state.plans.setdefault(signature, opened)
                if plan is not opened:
                    evicted.append(opened)
                plan.users += 1
                while len(state.plans) > self._max_plans:
                    victim = next((k for k, p in state.plans.items() if p.users == 0), None)
                    if victim is None:
                        break
                    evicted.append(state.plans.pop(victim))
                    self._counts["evictions"] += 1
        for old in evicted:
            old.context.__exit__(None, None, None)
        if state.closed:
            raise ort_compatible(RuntimeStateError("InferenceSession is closed"))
        return plan

    def _release(self, plan: _Plan) -> None:
        with self._state.lock:
            plan.users -= 1

    def _signature(self, feeds: Mapping[str, np.ndarray]) -> Signature | None:
        if not self._per_shape:
            return None
        return tuple(sorted((name, tuple(a.shape)) for name, a in feeds.items()))

    # -- onnxruntime's methods --------------------------------------------------------------

    def _convert_feeds(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(input_feed, Mapping):
            raise ort_compatible(InputError(f"input_feed must be a dict of name -> array, got {type(input_feed)!r}"))
        wanted = {a.name: a for a in (*self._inputs, *self._overridable)}
        missing = [a.name for a in self._inputs if a.name not in input_feed]
        if missing:
            raise ort_compatible(InputError(
                f"Required inputs ({missing}) are missing from input feed ({list(input_feed)})."))
        feeds: dict[str, np.ndarray] = {}
        for name, value in input_feed.items():
            arg = wanted.get(name)
            if arg is None:
                raise ort_compatible(InputError(
                    f"input {name!r} is not an input of the model (inputs: {[a.name for a in self._inputs]})"))
            if isinstance(value, np.ndarray):
                feeds[name] = value
            else:
                dtype = numpy_dtype(arg)
                feeds[name] = np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value)
        return feeds

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """Run the model: a list of arrays in ``output_names`` order (``None`` or ``[]``: all outputs).

        :raises InputError: (also ``InvalidArgument``/``ValueError``) a missing or unknown input,
            a wrong dtype or shape, an unknown output name.
        :raises StageExecutionError: (also ``Fail``) a stage failed; the session stays usable.
        """
        del run_options  # accepted like onnxruntime's RunOptions; nothing in it applies here
        feeds = self._convert_feeds(input_feed)
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        known = {o.name for o in self._outputs}
        for name in names:
            if name not in known:
                raise ort_compatible(InputError(f"Invalid output name: {name!r} (outputs: {sorted(known)})"))
        portal = self._portal()
        plan = self._plan_for(self._signature(feeds))
        try:
            result: list[np.ndarray] = portal.call(self._run_on, plan.session, names, feeds)
        except HetschedError as exc:
            raise ort_compatible(exc) from exc
        finally:
            self._release(plan)
        self._counts["runs"] += 1
        return result

    @staticmethod
    async def _run_on(session: Any, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        out: list[np.ndarray] = await session.run(names, feeds)
        return out

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return self._meta

    def get_providers(self) -> list[str]:
        """The providers in use: those asked for that map to a device here (CPU last), or,
        without ``providers=``, one per kind of device the board's defaults hold."""
        names: list[str] = []
        for dev in self._devices:
            name = provider_for_device(dev.kind, dev.backend)
            if name not in names:
                names.append(name)
        cpu = provider_for_device("cpu", "cpu")
        if cpu in names:
            names.remove(cpu)
            names.append(cpu)
        return names

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {name: dict(self._choice.options.get(name, {})) for name in self.get_providers()}

    def get_session_options(self) -> Any:
        """The ``sess_options`` given (an ``onnxruntime.SessionOptions`` made here if none was)."""
        if self._sess_options is None:
            import onnxruntime as ort

            self._sess_options = ort.SessionOptions()
        return self._sess_options

    def end_profiling(self) -> str:
        """Close the open plans, which writes hetsched's trace (a Chrome trace-event JSON file,
        not onnxruntime's profile format), and return its file name (``""`` when profiling was
        not enabled, as onnxruntime). Later runs compile again, without tracing. With a plan
        per shape signature, the second plan's trace is ``NAME-2.json`` and so on."""
        trace, self._trace = self._trace, None
        if trace is None:
            return ""
        self._close_plans()
        return trace

    def _close_plans(self) -> None:
        with self._state.lock:
            if any(p.users for p in self._state.plans.values()):
                raise ort_compatible(RuntimeStateError("cannot close plans while runs are in flight"))
            plans = list(self._state.plans.values())
            self._state.plans.clear()
        for plan in plans:
            plan.context.__exit__(None, None, None)

    def get_profiling_start_time_ns(self) -> int:
        return self._profiling_start_ns

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Choose devices again: every open plan is closed, the next run compiles anew."""
        choice, devices = self._resolve(providers, provider_options)
        self._close_plans()
        self._choice, self._devices = choice, devices
        self._per_shape = any(d.kind != "cpu" for d in self._devices)
        self._open_up_front()

    # -- hetsched's additions ---------------------------------------------------------------

    @property
    def model_path(self) -> str | None:
        return self._model_path

    def sessions(self) -> list[Any]:
        """The open :class:`hetsched.Session` objects (one per compiled shape signature)."""
        with self._state.lock:
            return [p.session for p in self._state.plans.values()]

    def statistics(self) -> InferenceSessionStatistics:
        with self._state.lock:
            open_plans = len(self._state.plans)
        return InferenceSessionStatistics(open_plans=open_plans, per_shape=self._per_shape, **self._counts)

    def close(self) -> None:
        """Close every plan and the event-loop thread (idempotent)."""
        self._finalizer()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
