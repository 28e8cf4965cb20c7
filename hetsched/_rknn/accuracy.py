"""Accuracy of an NPU stage against fp32 onnxruntime on the same inputs.

Per output and sample: the cosine similarity of the flattened tensors, and the relative error
``max|got - ref| / max|ref|`` (the largest deviation over the reference's range: an
element-wise ratio explodes where the reference is near zero and says nothing then). A stage's
figure is the worst over its outputs and samples. The inputs are the stage's calibration
samples where the session has calibration feeds, else seeded random ones of its input shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hetsched._onnxruntime import ort_session

from .._errors import ModelError

__all__ = ["RANDOM_SAMPLES", "StageAccuracy", "compile_time_accuracy", "cosine", "measure_accuracy", "random_samples",
           "rel_error", "stage_accuracy"]

RANDOM_SAMPLES = 4
"""Seeded random samples when no calibration feeds exist."""


@dataclass(frozen=True)
class StageAccuracy:
    min_cosine: float
    """Least cosine similarity of an output with fp32 onnxruntime's (1.0: the same direction)."""
    max_rel_error: float
    """Largest ``max|got - ref| / max|ref|`` of an output."""
    samples: int
    source: str
    """``"calibration"`` (the stage's calibration samples) or ``"random"`` (seeded random feeds)."""

    def to_json(self) -> dict[str, Any]:
        return {"min_cosine": self.min_cosine, "max_rel_error": self.max_rel_error, "samples": self.samples}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageAccuracy | None:
        """The accuracy ``dataclasses.asdict`` wrote (a cache verdict's), or None when ``data`` is
        not one (an entry of another version: measure again)."""
        try:
            return cls(float(data["min_cosine"]), float(data["max_rel_error"]), int(data["samples"]),
                       str(data["source"]))
        except (KeyError, TypeError, ValueError):
            return None


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, flattened (1.0 for two zero tensors, 0.0 for one)."""
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    g, r = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if not r.size:
        return 0.0
    scale = float(np.max(np.abs(r)))
    diff = float(np.max(np.abs(g - r)))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def random_samples(specs: Sequence[tuple[np.dtype[Any], tuple[int, ...]]], n: int = RANDOM_SAMPLES,
                   seed: int = 0) -> list[list[np.ndarray]]:
    """``n`` seeded samples for inputs of these (dtype, shape): standard normal floats, zeros else."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt) for dt, shape in specs]
            for _ in range(n)]


def measure_accuracy(model_bytes: bytes, input_names: Sequence[str], samples: Sequence[Sequence[np.ndarray]],
                     run: Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]], *, source: str) -> StageAccuracy:
    """Run every sample through ``run`` (the stage on the NPU or its simulator) and through
    onnxruntime on ``model_bytes`` (the prepared stage, fp32) and compare the outputs.

    :raises ModelError: onnxruntime cannot run the stage model.
    """
    try:
        sess = ort_session(model_bytes, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own unrelated types
        raise ModelError(f"onnxruntime cannot run the stage for the accuracy check: {exc}") from exc
    min_cos, max_rel = 1.0, 0.0
    for sample in samples:
        refs = sess.run(None, dict(zip(input_names, sample, strict=True)))
        for got, ref in zip(run(sample), refs, strict=True):
            min_cos = min(min_cos, cosine(got, ref))
            max_rel = max(max_rel, rel_error(got, ref))
    return StageAccuracy(min_cos, max_rel, len(samples), source)


def compile_time_accuracy(stage: Any, data: bytes, calibration: Any, stored: StageAccuracy | None, *,
                          keyed_calibration: bool) -> StageAccuracy | None:
    """A compiled stage (``stage.run``, ``io_specs``, ``input_names``) in the simulator vs fp32
    onnxruntime on ``data`` (the prepared stage), or ``stored`` (from the cache verdict) where it
    was measured on the same inputs: the same seeded random samples, or calibration samples the
    cache key covers (``keyed_calibration``); None when onnxruntime cannot run the stage alone.
    """
    if stored is not None and ((stored.source == "random" and calibration is None and stored.samples == RANDOM_SAMPLES)
                               or (stored.source == "calibration" and calibration is not None and keyed_calibration)):
        return stored
    in_specs = [spec for _n, spec in stage.io_specs()[: len(stage.input_names)]]
    if calibration is not None:
        samples, source = calibration.tensors(stage.input_names), "calibration"
    else:
        samples, source = random_samples(in_specs), "random"

    def run(sample: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(stage.run(dict(zip(stage.input_names, sample, strict=True))))

    try:
        return measure_accuracy(data, stage.input_names, samples, run, source=source)
    except ModelError:
        return None  # no reference, not a failure


class _ProbedStatistics(Protocol):
    @property
    def accuracy(self) -> object: ...


class _Probed(Protocol):
    def statistics(self) -> _ProbedStatistics: ...


class _StageHooks(Protocol):
    @property
    def accuracy(self) -> _Probed | None: ...


class _StageSpec(Protocol):
    @property
    def name(self) -> str: ...


class _CompiledStage(Protocol):
    @property
    def hooks(self) -> _StageHooks: ...

    @property
    def spec(self) -> _StageSpec: ...


class _OpenSession(Protocol):
    """What :func:`stage_accuracy` reads of a session: its compiled stages (``Session._stages``)."""

    @property
    def _stages(self) -> Sequence[_CompiledStage]: ...


def stage_accuracy(session: _OpenSession) -> dict[str, StageAccuracy]:
    """``{stage name: accuracy}`` of an open session's stages that measured one (NPU stages)."""
    out: dict[str, StageAccuracy] = {}
    for st in session._stages:
        probed = st.hooks.accuracy  # a twin RKNN stage declares the RknnStage it wraps
        acc = probed.statistics().accuracy if probed is not None else None
        if isinstance(acc, StageAccuracy):
            out[st.spec.name] = acc
    return out
