"""Backends (installed as ``hetsched.backends``): the seam between the core and execution.

Built-in: ``cpu`` (onnxruntime CPU EP, core-pinned). Others are found by name:
``get_backend("cpu")`` imports ``hetsched.backends.<name>`` and instantiates its
``backend_class``; third-party backends register under the entry-point group
``hetsched.backends``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from hetsched._errors import BackendUnavailableError

from ._base import (
    NO_BACKEND_HOOKS,
    NO_STAGE_HOOKS,
    Backend,
    BackendHooks,
    BindableStage,
    Capabilities,
    CompiledStage,
    Device,
    DeviceKind,
    ModelledStage,
    OpRule,
    StageHooks,
    TensorSpec,
    ThreadedBackend,
    WorkerInfo,
    WorkerStateProbe,
    WorkerStateStage,
)

__all__ = [
    "NO_BACKEND_HOOKS",
    "NO_STAGE_HOOKS",
    "Backend",
    "BackendHooks",
    "BindableStage",
    "Capabilities",
    "CompiledStage",
    "Device",
    "DeviceKind",
    "ModelledStage",
    "OpRule",
    "StageHooks",
    "TensorSpec",
    "ThreadedBackend",
    "WorkerInfo",
    "WorkerStateProbe",
    "WorkerStateStage",
    "get_backend",
    "register_backend",
    "unregister_backend",
]

_cache: dict[str, Backend] = {}
_registered: dict[str, Backend] = {}


def register_backend(name: str, backend: Backend) -> None:
    """Make ``backend`` the instance ``get_backend(name)`` returns (tests, embedded apps).

    :raises ValueError: ``name`` is already registered to another instance.
    """
    old = _registered.get(name)
    if old is not None and old is not backend:
        raise ValueError(f"a backend is already registered as {name!r}; unregister_backend({name!r}) first")
    _registered[name] = backend


def unregister_backend(name: str) -> None:
    """Forget a backend registered with :func:`register_backend` (no error if absent)."""
    _registered.pop(name, None)


def get_backend(name: str) -> Backend:
    """Return the (shared) backend instance called ``name``.

    :raises BackendUnavailableError: no such backend, or its optional SDK is missing
        (the message names the pip extra to install).
    """
    backend = _registered.get(name) or _cache.get(name)
    if backend is not None:
        return backend
    module_name = f"hetsched.backends.{name.replace('-', '_')}"
    cls: Any = None
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, "backend_class", None)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
    if cls is None:
        for ep in entry_points(group="hetsched.backends"):
            if ep.name == name:
                cls = ep.load()
                break
    if cls is None:
        raise BackendUnavailableError(f"no backend named {name!r} (built-in: 'cpu'; others register under the "
                                      "'hetsched.backends' entry-point group)")
    made: Backend = cls()  # an entry point's or a module's backend_class: a plugin, checked by use
    _cache[name] = made
    return made
