"""hetsched: an async runtime for heterogeneous edge SoCs (RK3588, Jetson Orin).

Load an ONNX model, partition it across CPU clusters / GPU / NPU with a
power-and-thermal-weighted placement, and run requests through the stages::

    async with hetsched.Session("model.onnx", devices=["big", "little"]) as s:
        outputs = await s.run({"input": x})
        print(s.plan.table())
"""

from ._costs import CostTable as CostTable
from ._costs import CostTableStatistics as CostTableStatistics
from ._devices import CpuCluster as CpuCluster
from ._devices import discover_cpu_clusters as discover_cpu_clusters
from ._devices import resolve_devices as resolve_devices
from ._errors import BackendError as BackendError
from ._errors import BackendUnavailableError as BackendUnavailableError
from ._errors import BufferLeakError as BufferLeakError
from ._errors import BufferStateError as BufferStateError
from ._errors import CompileError as CompileError
from ._errors import DeviceSpecError as DeviceSpecError
from ._errors import FrequencyLockError as FrequencyLockError
from ._errors import GovernorError as GovernorError
from ._errors import HetschedError as HetschedError
from ._errors import InputError as InputError
from ._errors import InvalidModelError as InvalidModelError
from ._errors import ModelError as ModelError
from ._errors import ModelFormatError as ModelFormatError
from ._errors import ModelNotFoundError as ModelNotFoundError
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
from ._errors import TransferError as TransferError
from ._errors import TwinError as TwinError
from ._errors import UnknownSocError as UnknownSocError
from ._errors import UnsupportedFrequencyError as UnsupportedFrequencyError
from ._events import Event as Event
from ._events import EventInfo as EventInfo
from ._events import Hooks as Hooks
from ._events import Priority as Priority
from ._model import load_model as load_model
from ._partition import StageSpec as StageSpec
from ._plan import Plan as Plan
from ._session import Session as Session
from ._session import SessionStatistics as SessionStatistics
from ._session import SyncSession as SyncSession
from ._snapshot import DomainState as DomainState
from ._snapshot import RailState as RailState
from ._snapshot import Snapshot as Snapshot
from ._snapshot import ZoneState as ZoneState
from .backends import Device as Device
from .policies import DeviceState as DeviceState
from .policies import Placement as Placement
from .policies import PlacementProblem as PlacementProblem

__version__ = "0.1.0"

__all__ = (
    "BackendError",
    "BackendUnavailableError",
    "BufferLeakError",
    "BufferStateError",
    "CompileError",
    "CostTable",
    "CostTableStatistics",
    "CpuCluster",
    "Device",
    "DeviceSpecError",
    "DeviceState",
    "DomainState",
    "Event",
    "EventInfo",
    "FrequencyLockError",
    "GovernorError",
    "HetschedError",
    "Hooks",
    "InputError",
    "InvalidModelError",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "PartitionError",
    "PathOutsideRootError",
    "Placement",
    "PlacementError",
    "PlacementProblem",
    "Plan",
    "PlatformError",
    "PowerBudgetError",
    "Priority",
    "ProfileError",
    "RailState",
    "RuntimeStateError",
    "Session",
    "SessionStatistics",
    "Snapshot",
    "StageExecutionError",
    "StageSpec",
    "SyncSession",
    "SysfsError",
    "SysfsPermissionError",
    "TransferError",
    "TwinError",
    "UnknownSocError",
    "UnsupportedFrequencyError",
    "ZoneState",
    "discover_cpu_clusters",
    "load_model",
    "resolve_devices",
)

# Show public objects as hetsched.X in reprs and docs (anyio 4.x does the same).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("hetsched._"):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
