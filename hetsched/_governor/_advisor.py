"""Batch-size energy advisor: which batch trains to convergence on the least energy."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import GovernorError

__all__ = ["BatchAdvice", "BatchMeasurement", "BatchOption", "advise_batch_size"]


@dataclass(frozen=True)
class BatchMeasurement:
    """What one training iteration costs at ``batch_size`` (measured, e.g. under the governor)."""

    batch_size: int
    energy_j: float
    """Energy per iteration (all phases)."""
    seconds: float
    """Time per iteration."""
    memory_bytes: float | None = None
    """Peak memory the iteration needs, if known."""


@dataclass(frozen=True)
class BatchOption:
    batch_size: int
    iterations: float
    total_energy_j: float
    total_time_s: float
    fits_memory: bool


@dataclass(frozen=True)
class BatchAdvice:
    """The recommended batch and every option considered (ascending batch size)."""

    batch_size: int
    total_energy_j: float
    total_time_s: float
    options: tuple[BatchOption, ...]


def advise_batch_size(
    measurements: Sequence[BatchMeasurement],
    *,
    samples_to_converge: float = 1.0,
    iterations_to_converge: Callable[[int], float] | None = None,
    memory_limit_bytes: float | None = None,
    idle_power_w: float = 0.0,
    wait_s_per_iteration: float = 0.0,
) -> BatchAdvice:
    """Recommend the batch size minimising total energy to convergence within the memory limit.

    Total energy at batch ``b`` is ``(E_iter(b) + idle_power_w * wait_s_per_iteration) * N(b)``
    where ``N(b)`` is the number of iterations to converge: by default inversely
    proportional to the batch (``samples_to_converge / b``: the same number of samples
    whatever the batch), or ``iterations_to_converge(b)`` when given (e.g. fitted from
    a few runs, since large batches usually need more samples).

    :raises GovernorError: no measurements, a non-positive or duplicated batch size,
        negative energy or time, a non-positive iteration count, or no batch within
        ``memory_limit_bytes`` (the message names what was wrong).
    """
    if not measurements:
        raise GovernorError("advise_batch_size needs at least one measurement")
    seen: set[int] = set()
    for m in measurements:
        if m.batch_size <= 0:
            raise GovernorError(f"batch size must be positive, got {m.batch_size}")
        if m.batch_size in seen:
            raise GovernorError(f"batch size {m.batch_size} measured twice; combine the runs first")
        seen.add(m.batch_size)
        if not (m.energy_j >= 0 and m.seconds >= 0) or not math.isfinite(m.energy_j + m.seconds):
            raise GovernorError(f"batch {m.batch_size}: energy and time must be finite and >= 0")
    if samples_to_converge <= 0:
        raise GovernorError(f"samples_to_converge must be positive, got {samples_to_converge}")

    options = []
    for m in sorted(measurements, key=lambda m: m.batch_size):
        n = iterations_to_converge(m.batch_size) if iterations_to_converge else samples_to_converge / m.batch_size
        if not (n > 0 and math.isfinite(n)):
            raise GovernorError(f"iterations_to_converge({m.batch_size}) returned {n!r}; it must be positive")
        fits = memory_limit_bytes is None or m.memory_bytes is None or m.memory_bytes <= memory_limit_bytes
        options.append(
            BatchOption(
                batch_size=m.batch_size,
                iterations=n,
                total_energy_j=(m.energy_j + idle_power_w * wait_s_per_iteration) * n,
                total_time_s=(m.seconds + wait_s_per_iteration) * n,
                fits_memory=fits,
            )
        )
    fitting = [o for o in options if o.fits_memory]
    if not fitting:
        smallest = min(m.memory_bytes or 0.0 for m in measurements)
        raise GovernorError(
            f"no measured batch fits the memory limit of {memory_limit_bytes:.0f} bytes "
            f"(the smallest needs {smallest:.0f}); measure smaller batches"
        )
    best = min(fitting, key=lambda o: (o.total_energy_j, o.total_time_s))
    return BatchAdvice(best.batch_size, best.total_energy_j, best.total_time_s, tuple(options))
