"""Placement policies (installed as ``hetsched.policies``).

A policy is a pure, synchronous function of a :class:`PlacementProblem` returning a
:class:`Placement`. Several models on one board are placed jointly: the problem carries the
other sessions' loads (:class:`Reservation`) and the model's priority and SLO. Built-ins: :class:`PowerThermalWeighted` (``"power-thermal"``),
:class:`HEFT` (``"heft"``), :class:`Pinned` (``"pinned:DEVICE"``) and
:class:`RandomPolicy` (``"random"`` or ``"random:SEED"``). Third-party policies
register a class or factory under the entry-point group ``hetsched.policies``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from hetsched._errors import PlacementError

from ._builtin import HEFT, W_ENERGY_S_PER_J, Pinned, PowerThermalWeighted, RandomPolicy
from ._consolidate import consolidate, makespan
from ._problem import (
    MAX_RESERVED_SHARE,
    DeviceState,
    DeviceStateInputs,
    Link,
    Placement,
    PlacementPolicy,
    PlacementProblem,
    Reservation,
    Unit,
    validate_placement,
)

__all__ = [
    "HEFT",
    "MAX_RESERVED_SHARE",
    "W_ENERGY_S_PER_J",
    "DeviceState",
    "DeviceStateInputs",
    "Link",
    "Pinned",
    "Placement",
    "PlacementPolicy",
    "PlacementProblem",
    "PowerThermalWeighted",
    "RandomPolicy",
    "Reservation",
    "Unit",
    "consolidate",
    "get_policy",
    "makespan",
    "policy_name",
    "validate_placement",
]

_BUILTIN: dict[str, Callable[..., PlacementPolicy]] = {
    "power-thermal": PowerThermalWeighted,
    "heft": HEFT,
    "random": RandomPolicy,
}


class _CallablePolicy:
    def __init__(self, fn: Callable[[PlacementProblem], Any]):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "callable")

    def place(self, problem: PlacementProblem) -> Any:
        return self.fn(problem)


def get_policy(spec: str | PlacementPolicy | Callable[[PlacementProblem], Any] | None) -> PlacementPolicy:
    """Resolve a policy: an object with ``place``, a plain function, or a name.

    Names: ``"power-thermal"``, ``"heft"``, ``"random"``, ``"random:SEED"``,
    ``"pinned:DEVICE"``, or any entry point in the ``hetsched.policies`` group.
    ``None`` means ``PowerThermalWeighted()``.

    :raises PlacementError: unknown name (the message lists the known ones).
    """
    if spec is None:
        return PowerThermalWeighted()
    if isinstance(spec, str):
        name, _, arg = spec.partition(":")
        name = name.strip().lower()
        if name == "pinned":
            if not arg:
                raise PlacementError("policy 'pinned' needs a device: 'pinned:cpu:0'")
            return Pinned(arg)
        if name == "random":
            try:
                seed = int(arg) if arg else 0
            except ValueError:
                raise PlacementError(f"policy {spec!r}: the seed of 'random:SEED' must be an integer") from None
            return RandomPolicy(seed)
        if name in _BUILTIN and not arg:
            return _BUILTIN[name]()
        for ep in entry_points(group="hetsched.policies"):
            if ep.name == name:
                obj = ep.load()
                loaded = obj() if isinstance(obj, type) else obj  # a plugin: checked by use
                policy: PlacementPolicy = loaded if hasattr(loaded, "place") else _CallablePolicy(loaded)
                return policy
        known = sorted({*_BUILTIN, "pinned:DEVICE", *(ep.name for ep in entry_points(group="hetsched.policies"))})
        raise PlacementError(f"unknown policy {spec!r}; known: {known}")
    if hasattr(spec, "place"):
        return spec
    if callable(spec):
        return _CallablePolicy(spec)
    raise PlacementError(f"policy must be a name, an object with place(), or a function; got {type(spec).__name__}")


def policy_name(policy: object) -> str:
    return getattr(policy, "name", None) or getattr(policy, "__name__", None) or type(policy).__name__


