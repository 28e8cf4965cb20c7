"""hetsched: an async runtime for heterogeneous edge SoCs (RK3588, Jetson Orin).

Load an ONNX model, partition it across CPU clusters / GPU / NPU with a
power-and-thermal-weighted placement, and run requests through the stages::

    async with hetsched.Session("model.onnx", devices=["big", "little"]) as s:
        outputs = await s.run({"input": x})
        print(s.plan.table())

Govern the clocks per program phase on a board (or on a board hetsched has no profile
for, through your own :class:`ClockPort`)::

    with hetsched.Governor(root="/", slowdown=0.05) as gov:
        with gov.phase(hetsched.Phase.INFER):
            ...

Every public name is re-exported here, grouped below by layer from the board up; the
pieces that work below a session (buffers, copies, planning primitives, the tuner) are in
:mod:`hetsched.lowlevel`, test helpers in :mod:`hetsched.testing`.
"""

import importlib as _importlib
import typing as _typing

# Errors: one tree under HetschedError (hetsched._errors); imported at once (stdlib only).
from ._errors import BackendError as BackendError
from ._errors import BackendUnavailableError as BackendUnavailableError
from ._errors import BufferLeakError as BufferLeakError
from ._errors import BufferStateError as BufferStateError
from ._errors import CompileError as CompileError
from ._errors import DeviceFailedError as DeviceFailedError
from ._errors import DeviceSpecError as DeviceSpecError
from ._errors import FreeDimsError as FreeDimsError
from ._errors import FrequencyLockError as FrequencyLockError
from ._errors import GovernorBusyError as GovernorBusyError
from ._errors import GovernorError as GovernorError
from ._errors import HetschedError as HetschedError
from ._errors import InputError as InputError
from ._errors import InvalidModelError as InvalidModelError
from ._errors import ModelError as ModelError
from ._errors import ModelFormatError as ModelFormatError
from ._errors import ModelNotFoundError as ModelNotFoundError
from ._errors import NotRegularFileError as NotRegularFileError
from ._errors import PartitionError as PartitionError
from ._errors import PathOutsideRootError as PathOutsideRootError
from ._errors import PlacementError as PlacementError
from ._errors import PlatformError as PlatformError
from ._errors import PowerBudgetError as PowerBudgetError
from ._errors import ProfileError as ProfileError
from ._errors import RuntimeStateError as RuntimeStateError
from ._errors import StageExecutionError as StageExecutionError
from ._errors import SysfsError as SysfsError
from ._errors import SysfsPermissionError as SysfsPermissionError
from ._errors import ToolkitWorkerError as ToolkitWorkerError
from ._errors import TraceWriteError as TraceWriteError
from ._errors import TransferError as TransferError
from ._errors import TwinError as TwinError
from ._errors import UnknownSocError as UnknownSocError
from ._errors import UnsupportedEventLoopError as UnsupportedEventLoopError
from ._errors import UnsupportedFrequencyError as UnsupportedFrequencyError
from ._errors import UnsupportedGovernorError as UnsupportedGovernorError

# Everything below the errors imports on first use (``hetsched.Session`` ...), so that
# ``import hetsched`` and the CLI's board tools (``info``, ``top``, ``doctor``) start without
# onnx, onnxruntime and numpy (issue 22; benchmarks/startup.py). Type checkers see the
# imports; at run time module ``__getattr__`` below resolves a name through ``_LAZY``.
if _typing.TYPE_CHECKING:
    # Platform: what the board is and what it reports (sysfs discovery, telemetry, snapshots).
    # isort: split
    from ._platform import ClusterInfo as ClusterInfo
    from ._platform import DeviceInfo as DeviceInfo
    from ._platform import Platform as Platform
    from ._platform import RailInfo as RailInfo
    from ._platform import SysfsRoot as SysfsRoot
    from ._platform import Telemetry as Telemetry
    from ._platform import TelemetryStatistics as TelemetryStatistics
    from ._platform import TripInfo as TripInfo
    from ._platform import UdevEvent as UdevEvent
    from ._platform import UdevMonitor as UdevMonitor
    from ._platform import ZoneInfo as ZoneInfo
    from ._platform import discover as discover
    from ._snapshot import DomainState as DomainState
    from ._snapshot import RailState as RailState
    from ._snapshot import Snapshot as Snapshot
    from ._snapshot import ZoneState as ZoneState

    # Digital twin: SoC profiles, simulated boards and sysfs trees that behave like real ones.
    # isort: split
    from ._twin import DomainInfo as DomainInfo
    from ._twin import LiveTwin as LiveTwin
    from ._twin import LiveTwinStatistics as LiveTwinStatistics
    from ._twin import PhaseWork as PhaseWork
    from ._twin import SimBoard as SimBoard
    from ._twin import SimStatistics as SimStatistics
    from ._twin import SocProfile as SocProfile
    from ._twin import get_profile as get_profile
    from ._twin import known_socs as known_socs
    from ._twin import rk3588_profile as rk3588_profile

    # Planning: models, devices, costs and the partition of a model into stages.
    # isort: split
    from ._devices.resolve import CpuCluster as CpuCluster
    from ._devices.resolve import discover_cpu_clusters as discover_cpu_clusters
    from ._devices.resolve import resolve_devices as resolve_devices
    from ._planning.costs import CostTable as CostTable
    from ._planning.costs import CostTableStatistics as CostTableStatistics
    from ._planning.model import load_model as load_model
    from ._planning.partition import StageSpec as StageSpec
    from ._planning.plan import Plan as Plan

    # Placement policies and the backends that run stages.
    # isort: split
    from .backends import Device as Device
    from .policies import DeviceState as DeviceState
    from .policies import Placement as Placement
    from .policies import PlacementProblem as PlacementProblem

    # Runtime and sessions: running requests through the stages, events and hooks.
    # isort: split
    from ._events import CompileInfo as CompileInfo
    from ._events import Event as Event
    from ._events import EventInfo as EventInfo
    from ._events import Hooks as Hooks
    from ._events import Priority as Priority
    from ._events import ReplanInfo as ReplanInfo
    from ._runtime import StageIO as StageIO
    from ._runtime import TransferInfo as TransferInfo
    from ._runtime._failover import FailoverStatistics as FailoverStatistics
    from ._runtime._tenants import Order as Order
    from ._session._delivery import Outputs as Outputs
    from ._session._options import Adaptation as Adaptation
    from ._session._options import Memory as Memory
    from ._session._options import Scheduling as Scheduling
    from ._session._ort_session import InferenceSession as InferenceSession
    from ._session._ort_session import InferenceSessionStatistics as InferenceSessionStatistics
    from ._session._replace import Replacement as Replacement
    from ._session._replan import Replanning as Replanning
    from ._session._replan import ReplanStatistics as ReplanStatistics
    from ._session._runtime import Runtime as Runtime
    from ._session._runtime import RuntimeStatistics as RuntimeStatistics
    from ._session._runtime import SessionShare as SessionShare
    from ._session._session import Session as Session
    from ._session._session import SessionStatistics as SessionStatistics
    from ._session._stream import ResultStream as ResultStream
    from ._session._stream import StreamStatistics as StreamStatistics
    from ._session._sync import SyncSession as SyncSession

    # Governor: phase-aware DVFS, its extension points (ClockPort, DomainSpec, PhaseModel) and hooks.
    # isort: split
    from ._governor import BatchAdvice as BatchAdvice
    from ._governor import BatchMeasurement as BatchMeasurement
    from ._governor import BatchOption as BatchOption
    from ._governor import ClockPort as ClockPort
    from ._governor import DomainSpec as DomainSpec
    from ._governor import Governor as Governor
    from ._governor import GovernorConfig as GovernorConfig
    from ._governor import GovernorEngine as GovernorEngine
    from ._governor import GovernorProfile as GovernorProfile
    from ._governor import GovernorStatistics as GovernorStatistics
    from ._governor import GovernorWarning as GovernorWarning
    from ._governor import Measurement as Measurement
    from ._governor import OperatingPoint as OperatingPoint
    from ._governor import Phase as Phase
    from ._governor import PhaseModel as PhaseModel
    from ._governor import PhaseStatistics as PhaseStatistics
    from ._governor import advise_batch_size as advise_batch_size
    from ._session._governed import GovernorHooks as GovernorHooks

# Public name -> module (relative to hetsched) that defines it; tests/test_startup.py checks
# that it matches the imports above.
_LAZY: dict[str, str] = {
    "ClusterInfo": "._platform",
    "DeviceInfo": "._platform",
    "Platform": "._platform",
    "RailInfo": "._platform",
    "SysfsRoot": "._platform",
    "Telemetry": "._platform",
    "TelemetryStatistics": "._platform",
    "TripInfo": "._platform",
    "UdevEvent": "._platform",
    "UdevMonitor": "._platform",
    "ZoneInfo": "._platform",
    "discover": "._platform",
    "DomainState": "._snapshot",
    "RailState": "._snapshot",
    "Snapshot": "._snapshot",
    "ZoneState": "._snapshot",
    "DomainInfo": "._twin",
    "LiveTwin": "._twin",
    "LiveTwinStatistics": "._twin",
    "PhaseWork": "._twin",
    "SimBoard": "._twin",
    "SimStatistics": "._twin",
    "SocProfile": "._twin",
    "get_profile": "._twin",
    "known_socs": "._twin",
    "rk3588_profile": "._twin",
    "CostTable": "._planning.costs",
    "CostTableStatistics": "._planning.costs",
    "CpuCluster": "._devices.resolve",
    "discover_cpu_clusters": "._devices.resolve",
    "resolve_devices": "._devices.resolve",
    "load_model": "._planning.model",
    "StageSpec": "._planning.partition",
    "Plan": "._planning.plan",
    "Device": ".backends",
    "DeviceState": ".policies",
    "Placement": ".policies",
    "PlacementProblem": ".policies",
    "Outputs": "._session._delivery",
    "CompileInfo": "._events",
    "Event": "._events",
    "EventInfo": "._events",
    "Hooks": "._events",
    "Priority": "._events",
    "ReplanInfo": "._events",
    "Order": "._runtime._tenants",
    "Adaptation": "._session._options",
    "Memory": "._session._options",
    "Scheduling": "._session._options",
    "InferenceSession": "._session._ort_session",
    "InferenceSessionStatistics": "._session._ort_session",
    "Replanning": "._session._replan",
    "ReplanStatistics": "._session._replan",
    "Replacement": "._session._replace",
    "StageIO": "._runtime",
    "TransferInfo": "._runtime",
    "FailoverStatistics": "._runtime._failover",
    "Runtime": "._session._runtime",
    "RuntimeStatistics": "._session._runtime",
    "SessionShare": "._session._runtime",
    "Session": "._session._session",
    "SessionStatistics": "._session._session",
    "ResultStream": "._session._stream",
    "StreamStatistics": "._session._stream",
    "SyncSession": "._session._sync",
    "GovernorHooks": "._session._governed",
    "BatchAdvice": "._governor",
    "BatchMeasurement": "._governor",
    "BatchOption": "._governor",
    "ClockPort": "._governor",
    "DomainSpec": "._governor",
    "Governor": "._governor",
    "GovernorConfig": "._governor",
    "GovernorEngine": "._governor",
    "GovernorProfile": "._governor",
    "GovernorStatistics": "._governor",
    "GovernorWarning": "._governor",
    "Measurement": "._governor",
    "OperatingPoint": "._governor",
    "Phase": "._governor",
    "PhaseModel": "._governor",
    "PhaseStatistics": "._governor",
    "advise_batch_size": "._governor",
}
# Subpackages reachable as attributes (``hetsched.lowlevel.X`` after ``import hetsched``).
_SUBMODULES = frozenset({"backends", "lowlevel", "policies", "testing"})

__version__ = "0.1.0"

__all__ = (
    "Adaptation",
    "BackendError",
    "BackendUnavailableError",
    "BatchAdvice",
    "BatchMeasurement",
    "BatchOption",
    "BufferLeakError",
    "BufferStateError",
    "ClockPort",
    "ClusterInfo",
    "CompileError",
    "CompileInfo",
    "CostTable",
    "CostTableStatistics",
    "CpuCluster",
    "Device",
    "DeviceFailedError",
    "DeviceInfo",
    "DeviceSpecError",
    "DeviceState",
    "DomainInfo",
    "DomainSpec",
    "DomainState",
    "Event",
    "EventInfo",
    "FailoverStatistics",
    "FreeDimsError",
    "FrequencyLockError",
    "Governor",
    "GovernorBusyError",
    "GovernorConfig",
    "GovernorEngine",
    "GovernorError",
    "GovernorHooks",
    "GovernorProfile",
    "GovernorStatistics",
    "GovernorWarning",
    "HetschedError",
    "Hooks",
    "InferenceSession",
    "InferenceSessionStatistics",
    "InputError",
    "InvalidModelError",
    "LiveTwin",
    "LiveTwinStatistics",
    "Measurement",
    "Memory",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "NotRegularFileError",
    "OperatingPoint",
    "Order",
    "Outputs",
    "PartitionError",
    "PathOutsideRootError",
    "Phase",
    "PhaseModel",
    "PhaseStatistics",
    "PhaseWork",
    "Placement",
    "PlacementError",
    "PlacementProblem",
    "Plan",
    "Platform",
    "PlatformError",
    "PowerBudgetError",
    "Priority",
    "ProfileError",
    "RailInfo",
    "RailState",
    "Replacement",
    "ReplanInfo",
    "ReplanStatistics",
    "Replanning",
    "ResultStream",
    "Runtime",
    "RuntimeStateError",
    "RuntimeStatistics",
    "Scheduling",
    "Session",
    "SessionShare",
    "SessionStatistics",
    "SimBoard",
    "SimStatistics",
    "Snapshot",
    "SocProfile",
    "StageExecutionError",
    "StageIO",
    "StageSpec",
    "StreamStatistics",
    "SyncSession",
    "SysfsError",
    "SysfsPermissionError",
    "SysfsRoot",
    "Telemetry",
    "TelemetryStatistics",
    "ToolkitWorkerError",
    "TraceWriteError",
    "TransferError",
    "TransferInfo",
    "TripInfo",
    "TwinError",
    "UdevEvent",
    "UdevMonitor",
    "UnknownSocError",
    "UnsupportedEventLoopError",
    "UnsupportedFrequencyError",
    "UnsupportedGovernorError",
    "ZoneInfo",
    "ZoneState",
    "advise_batch_size",
    "discover",
    "discover_cpu_clusters",
    "get_profile",
    "known_socs",
    "load_model",
    "resolve_devices",
    "rk3588_profile",
)


def _show_as_public(obj: object) -> None:
    """Show a public object as ``hetsched.X`` in reprs and docs (anyio 4.x does the same)."""
    mod = getattr(obj, "__module__", None) or ""
    # Private modules of the core and of the subpackages (hetsched.backends._base, ...).
    if mod.startswith("hetsched.") and "._" in f".{mod.partition('.')[2]}":
        try:
            obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass


# Hidden from type checkers, which see the imports above: a misspelt name stays an error.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is not None:
            obj = getattr(_importlib.import_module(module, __name__), name)
            _show_as_public(obj)
            globals()[name] = obj
            return obj
        if name in _SUBMODULES:
            return _importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


for _name in __all__:
    if _name not in _LAZY:
        _show_as_public(globals()[_name])
del _name
