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

from ._estimators import power_estimator_for as power_estimator_for
from ._governor import AxisTuner as AxisTuner
from ._governor import Tuner as Tuner
from ._governor import TunerFactory as TunerFactory
from ._governor import TunerSettings as TunerSettings
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
    "TunerFactory",
    "TunerSettings",
    "build_plan",
    "extract_stage",
    "pin_current_thread",
    "power_estimator_for",
    "rate_limited_copy",
)

for _name in __all__:
    _obj = globals()[_name]
    if (getattr(_obj, "__module__", None) or "").startswith("hetsched._"):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
