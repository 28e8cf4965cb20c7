"""Low-level pieces of the runtime, for code that manages memory and copies itself.

Most applications never need these: :class:`hetsched.Session` owns its pools, buffers and
transfer engine, plans its model and tunes its governor. They are public for backends,
benchmarks and tests that work below a session (as ``trio.lowlevel`` and ``anyio.lowlevel``
are): memory and copies (``BufferPool`` ... ``rate_limited_copy``), the planning primitives a
session is built from (``GraphIndex``, ``build_plan``, ``extract_stage``) and the governor's
coordinate-descent tuner (``AxisTuner``), and the SoC power model a :class:`hetsched.Telemetry`
needs on a board without power sensors (``power_estimator_for``)::

    from hetsched.lowlevel import BufferPool, MemoryDomain, MemoryKind

    with BufferPool(MemoryDomain("host", MemoryKind.HOST)) as pool:
        buf = pool.acquire_nowait(((1, 3, 224, 224), "float32"))
        ...

The classes show as ``hetsched.lowlevel.X`` in reprs and docs.
"""

import contextlib as _contextlib
import importlib as _importlib
import typing as _typing

# Each name imports on first use, as in hetsched/__init__.py (start-up, issue 22).
if _typing.TYPE_CHECKING:
    from ._estimators import power_estimator_for as power_estimator_for
    from ._governor import AxisTuner as AxisTuner
    from ._governor import Tuner as Tuner
    from ._governor import TunerConfig as TunerConfig
    from ._governor import TunerFactory as TunerFactory
    from ._governor import TunerSettings as TunerSettings
    from ._planning.costs import roofline as roofline
    from ._planning.graph import GraphIndex as GraphIndex
    from ._planning.partition import extract_stage as extract_stage
    from ._planning.plan import build_plan as build_plan
    from ._platform.affinity import pin_current_thread as pin_current_thread
    from ._runtime import BufferPool as BufferPool
    from ._runtime import BufferState as BufferState
    from ._runtime import ChannelStatistics as ChannelStatistics
    from ._runtime import LeakedBuffer as LeakedBuffer
    from ._runtime import MemoryDomain as MemoryDomain
    from ._runtime import MemoryKind as MemoryKind
    from ._runtime import PoolStatistics as PoolStatistics
    from ._runtime import SharedHandle as SharedHandle
    from ._runtime import TensorBuffer as TensorBuffer
    from ._runtime import Topology as Topology
    from ._runtime import TransferEngine as TransferEngine
    from ._runtime import TransferStatistics as TransferStatistics
    from ._runtime import rate_limited_copy as rate_limited_copy
    from ._runtime._clock import Clock as Clock
    from ._runtime._clock import SystemClock as SystemClock

# Public name -> module (relative to hetsched) that defines it; tests/test_startup.py checks
# that it matches the imports above.
_LAZY: dict[str, str] = {
    "power_estimator_for": "._estimators",
    "AxisTuner": "._governor",
    "Tuner": "._governor",
    "TunerConfig": "._governor",
    "TunerFactory": "._governor",
    "TunerSettings": "._governor",
    "GraphIndex": "._planning.graph",
    "extract_stage": "._planning.partition",
    "build_plan": "._planning.plan",
    "roofline": "._planning.costs",
    "pin_current_thread": "._platform.affinity",
    "BufferPool": "._runtime",
    "BufferState": "._runtime",
    "ChannelStatistics": "._runtime",
    "LeakedBuffer": "._runtime",
    "MemoryDomain": "._runtime",
    "MemoryKind": "._runtime",
    "PoolStatistics": "._runtime",
    "SharedHandle": "._runtime",
    "TensorBuffer": "._runtime",
    "Topology": "._runtime",
    "TransferEngine": "._runtime",
    "TransferStatistics": "._runtime",
    "rate_limited_copy": "._runtime",
    "Clock": "._runtime._clock",
    "SystemClock": "._runtime._clock",
}

__all__ = (
    "AxisTuner",
    "BufferPool",
    "BufferState",
    "ChannelStatistics",
    "Clock",
    "GraphIndex",
    "LeakedBuffer",
    "MemoryDomain",
    "MemoryKind",
    "PoolStatistics",
    "SharedHandle",
    "SystemClock",
    "TensorBuffer",
    "Topology",
    "TransferEngine",
    "TransferStatistics",
    "Tuner",
    "TunerConfig",
    "TunerFactory",
    "TunerSettings",
    "build_plan",
    "extract_stage",
    "pin_current_thread",
    "power_estimator_for",
    "rate_limited_copy",
    "roofline",
)


# Hidden from type checkers, which see the imports above: a misspelt name stays an error.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        obj = getattr(_importlib.import_module(module, "hetsched"), name)
        # Show the class as hetsched.lowlevel.X in reprs and docs.
        if (getattr(obj, "__module__", None) or "").startswith("hetsched._"):
            with _contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = __name__
        globals()[name] = obj
        return obj

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
