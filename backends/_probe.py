"""The probe contract: an accelerator stage proves itself before it is placed (issue 24).

Every stage an accelerator backend compiles (RKNN now; TensorRT and ncnn call the same function)
runs once at compile time on probe inputs and is compared with onnxruntime running the same
stage model in fp32: the output count, every output's shape, and each output's cosine
similarity against a floor set by the stage's precision (:data:`PROBE`). A stage that fails
to run or disagrees raises :class:`~hetsched.CompileError` carrying the reason (the toolkit's own
message where it gave one): the session's refusal path (``hetsched._session._setup.plan_and_compile``)
then places the stage's units elsewhere, and a backend with a compile cache stores the refusal.
A stage that passed and fails later at run time is a device failure (failover), not a refusal.

Usage in a backend's ``compile``::

    from ._probe import probe_stage
    probe_stage(lambda xs: compiled.run(dict(zip(names, xs))), stage_model_bytes, names, in_specs,
                precision="float16", device=device.name)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched._errors import CompileError

__all__ = ["PROBE", "ProbeConfig", "ProbeResult", "StageRunner", "probe_stage"]

StageRunner = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]
"""Runs the compiled stage once: inputs in the stage's input order -> outputs in its output order."""


@dataclass(frozen=True)
class ProbeConfig:
    """The floors a probe run must reach, by precision (the one place they are set)."""

    min_cosine: Mapping[str, float] = field(default_factory=lambda: {
        "float32": 0.999, "float16": 0.99, "bfloat16": 0.98, "int8": 0.9,
    })
    """Least cosine of each output against fp32 onnxruntime. fp16 and the NPU's fp16 numerics
    stay above 0.99 on every model we ran (PP-OCR's detector map: 0.9985); INT8 is looser (w8a8
    per-tensor quantization on random probe inputs)."""
    default_min_cosine: float = 0.9
    """For a precision not listed."""
    seed: int = 0
    """Seed of the probe inputs (standard normal floats, zeros for other types)."""

    def floor(self, precision: str) -> float:
        return float(self.min_cosine.get(precision, self.default_min_cosine))


PROBE = ProbeConfig()


@dataclass(frozen=True)
class ProbeResult:
    min_cosine: float
    """Least cosine of an output against onnxruntime over the samples (NaN: no reference)."""
    outputs: int
    precision: str
    max_rel_error: float = float("nan")
    """Largest ``max|got - ref| / max|ref|`` of an output (:func:`hetsched._rknn.accuracy.rel_error`)."""
    samples: int = 1


def probe_inputs(specs: Sequence[tuple[np.dtype[Any], tuple[int, ...]]], seed: int = PROBE.seed) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt) for dt, shape in specs]


def probe_stage(run: StageRunner, model_bytes: bytes, input_names: Sequence[str],
                input_specs: Sequence[tuple[np.dtype[Any], tuple[int, ...]]], *, precision: str, device: str,
                inputs: Sequence[np.ndarray] | None = None, samples: Sequence[Sequence[np.ndarray]] | None = None,
                require_reference: bool = False, config: ProbeConfig = PROBE) -> ProbeResult:
    """Run the compiled stage on ``samples`` (default: ``[inputs]``, else one sample of seeded
    probe inputs of ``input_specs``) and check it against onnxruntime on ``model_bytes`` (the
    stage model it was compiled from, fp32): output count, shapes, cosine >=
    ``config.floor(precision)`` for every output of every sample.

    :raises CompileError: ``"{device}: the compiled stage failed its probe run: ..."`` with the
        run's error (a vendor toolkit's message) or the mismatch. onnxruntime failing to run the
        stage model is no verdict on the accelerator: the count and shapes are then unchecked
        and the result has ``min_cosine`` NaN, unless ``require_reference`` (a converter that can
        be silently wrong, pnnx: then it is a refusal too).
    """
    from hetsched._onnxruntime import ort_session
    from hetsched._rknn.accuracy import cosine, rel_error

    if samples is None:
        samples = [list(inputs) if inputs is not None else probe_inputs(input_specs, config.seed)]
    prefix = f"{device}: the compiled stage failed its probe run"
    try:
        sess = ort_session(model_bytes, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime cannot load the stage alone: nothing to compare with
        sess, no_reference = None, exc
    worst, max_rel, outputs = 1.0, 0.0, 0
    floor = config.floor(precision)
    for feeds in samples:
        try:
            got = [np.asarray(o) for o in run(list(feeds))]
        except Exception as exc:  # the toolkit's / engine's own error: its words go into the refusal
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise CompileError(f"{prefix}: {type(cause).__name__}: {cause}") from exc
        outputs = len(got)
        try:
            if sess is None:
                raise no_reference
            want = [np.asarray(o) for o in sess.run(None, dict(zip(input_names, feeds, strict=True)))]
        except Exception as exc:  # onnxruntime cannot run the stage alone: nothing to compare with
            if require_reference:
                raise CompileError(f"{prefix}: no onnxruntime reference to check it against: {exc}") from exc
            return ProbeResult(float("nan"), outputs, precision, float("nan"), len(samples))
        if len(got) != len(want):
            raise CompileError(f"{prefix}: it returned {len(got)} output(s), onnxruntime {len(want)}")
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            if g.shape != w.shape:
                raise CompileError(f"{prefix}: output {k} has shape {list(g.shape)}, onnxruntime's {list(w.shape)}")
            c = cosine(g, w)
            worst = min(worst, c)
            max_rel = max(max_rel, rel_error(g, w))
            if not c >= floor:
                raise CompileError(f"{prefix}: output {k} disagrees with onnxruntime: cosine {c:.6f}, below the "
                                   f"{precision} floor {floor} (max relative error {rel_error(g, w):.3g})")
    return ProbeResult(worst, outputs, precision, max_rel, len(samples))
