"""The exception tree of hetsched.

Every error hetsched raises on purpose is a :class:`HetschedError`. Where a
builtin describes the condition too, the class also derives from it, so callers
that already catch ``FileNotFoundError`` or ``PermissionError`` keep working::

    HetschedError
    ├── ModelError                      loading a model failed
    │   ├── ModelNotFoundError          (+ FileNotFoundError) no such file
    │   ├── ModelFormatError            (+ ValueError) bytes are not an ONNX model
    │   └── InvalidModelError           (+ ValueError) onnx.checker / shape inference refused it
    ├── PartitionError                  (+ ValueError) no device can run some ops
    ├── PlacementError                  (+ ValueError) a policy returned an unusable placement
    ├── DeviceSpecError                 (+ ValueError) a device spec string could not be parsed
    ├── InputError                      (+ ValueError) feeds: unknown/missing name, wrong dtype/shape
    │   └── FreeDimsError               inputs with free dims and no shapes= / --shape (names them)
    ├── BackendError                    a backend failed
    │   ├── BackendUnavailableError     (+ ImportError) optional SDK missing; names the pip extra
    │   ├── CompileError                a stage could not be compiled for its device
    │   ├── ToolkitWorkerError          a vendor toolkit's worker process died or broke its protocol
    │   └── StageExecutionError         a stage failed at run time (names stage and device)
    │       └── DeviceFailedError       the device itself failed (not the input): counts toward failover
    ├── RuntimeStateError               (+ RuntimeError) session used outside ``async with``/after close
    │   └── UnsupportedEventLoopError   the running event loop is neither asyncio nor trio
    ├── BufferStateError                (+ RuntimeError) illegal buffer lifecycle transition / refcount
    │   └── BufferLeakError             buffers still referenced at session close
    ├── TransferError                   a copy between memory domains failed
    ├── PlatformError                   the board could not be read or written
    │   ├── SysfsError                  (+ OSError) a sysfs/procfs/debugfs access failed
    │   │   ├── SysfsPermissionError    (+ GovernorError, PermissionError) no permission on a path
    │   │   └── PathOutsideRootError    (+ ValueError) refused to touch a path outside the root
    │   ├── UnknownSocError             (+ LookupError) no profile for this SoC name
    │   └── TwinError                   the SoC twin was misused (e.g. bad speed, bad root)
    ├── GovernorError                   the DVFS governor failed
    │   ├── UnsupportedFrequencyError   (+ ValueError) frequency not in the available list
    │   ├── UnsupportedGovernorError    (+ ValueError) governor not in the available list
    │   ├── FrequencyLockError          a domain's clock did not follow the written value
    │   ├── GovernorBusyError           another hetsched governor owns this root's clocks
    │   └── PowerBudgetError            (+ ValueError) no operating point fits the power budget
    ├── ProfileError                    (+ ValueError) a saved profile/JSON file is malformed
    ├── NotRegularFileError             (+ ValueError) a file to read is a FIFO, device, socket or directory
    └── TraceWriteError                 (+ OSError) the trace file could not be written (disk full...)

Errors from onnxruntime and the OS are translated at the boundary with
``raise ... from exc`` so the original stays visible as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "BufferLeakError",
    "BufferStateError",
    "CompileError",
    "DeviceFailedError",
    "DeviceSpecError",
    "FreeDimsError",
    "FrequencyLockError",
    "GovernorBusyError",
    "GovernorError",
    "HetschedError",
    "InputError",
    "InvalidModelError",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "NotRegularFileError",
    "PartitionError",
    "PathOutsideRootError",
    "PlacementError",
    "PlatformError",
    "PowerBudgetError",
    "ProfileError",
    "RuntimeStateError",
    "StageExecutionError",
    "SysfsError",
    "SysfsPermissionError",
    "ToolkitWorkerError",
    "TraceWriteError",
    "TransferError",
    "TwinError",
    "UnknownSocError",
    "UnsupportedEventLoopError",
    "UnsupportedFrequencyError",
    "UnsupportedGovernorError",
]


class HetschedError(Exception):
    """Base class of every error hetsched raises on purpose."""


# -- models -----------------------------------------------------------------


class ModelError(HetschedError):
    """Loading a model failed. Raised by :func:`hetsched.load_model` and ``Session``."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model path does not exist (the message names the path)."""


class ModelFormatError(ModelError, ValueError):
    """The file or bytes could not be parsed as an ONNX ``ModelProto``."""


class InvalidModelError(ModelError, ValueError):
    """``onnx.checker`` or shape inference rejected the model; the reason is in the message."""


# -- planning -----------------------------------------------------------------


class PartitionError(HetschedError, ValueError):
    """Some op types can run on none of the devices asked for.

    Attributes ``op_types`` (sorted list) and ``devices`` (names asked) say which.
    """

    op_types: list[str]
    devices: list[str]

    def __init__(self, message: str, *, op_types: list[str] | None = None, devices: list[str] | None = None):
        super().__init__(message)
        self.op_types = list(op_types or [])
        self.devices = list(devices or [])


class PlacementError(HetschedError, ValueError):
    """A placement policy returned an unknown or incapable device, or left a unit unplaced."""


class DeviceSpecError(HetschedError, ValueError):
    """A device spec such as ``"cpu:0-3"`` could not be parsed or names CPUs the host lacks."""


class InputError(HetschedError, ValueError):
    """The feeds given to ``Session.run`` do not match the model's inputs.

    The message names the input, what was expected and what was given.
    """


class FreeDimsError(InputError):
    """The model has inputs with free dimensions and nothing fixes them (``shapes=``,
    ``--shape``) where fixed shapes are needed: accelerator stages, and the CLI, which makes up
    inputs. The message names every such input, its free dims, and the ``--shape`` to pass.
    ``inputs``: ``{input name: (free dim names, ...)}``; ``suggestion``: ``{input: example shape}``.
    """

    def __init__(self, message: str, *, inputs: dict[str, tuple[str, ...]] | None = None,
                 suggestion: dict[str, tuple[int, ...]] | None = None):
        super().__init__(message)
        self.inputs = dict(inputs or {})
        self.suggestion = dict(suggestion or {})


# -- backends -----------------------------------------------------------------


class BackendError(HetschedError):
    """A backend failed; subclasses say whether at import, compile or run time."""


class BackendUnavailableError(BackendError, ImportError):
    """An optional SDK (tensorrt, rknnlite, torch) is missing; the message names the pip extra."""


class CompileError(BackendError):
    """A stage could not be compiled (e.g. onnxruntime refused the extracted subgraph)."""


class ToolkitWorkerError(BackendError):
    """A vendor toolkit's worker process (the RKNN toolkit runs in its own environment) died,
    could not be started, or answered outside its protocol. The message names the process and
    what it was doing; the stage that used it fails its request with a :class:`StageExecutionError`.
    """


class StageExecutionError(BackendError):
    """A stage failed while running a request. ``stage`` and ``device`` name where."""

    stage: str | None
    device: str | None

    def __init__(self, message: str, *, stage: str | None = None, device: str | None = None):
        super().__init__(message)
        self.stage = stage
        self.device = device


class DeviceFailedError(StageExecutionError):
    """The device failed, not the request's data: a vendor worker process died, a driver or
    device was lost. A backend raises it so that the session's failover counts the failure
    (repeated ones quarantine the device and re-place its work; the request is retried)."""


# -- runtime ------------------------------------------------------------------


class RuntimeStateError(HetschedError, RuntimeError):
    """A Session (or pool, engine) was used before ``async with`` entered it or after it closed."""


class UnsupportedEventLoopError(RuntimeStateError):
    """A session was entered on an event loop hetsched has no loop module for.

    Raised by ``async with Session(...)`` (the scheduler picks the loop module of the running
    loop); hetsched runs on asyncio and trio (through anyio).
    """


class BufferStateError(HetschedError, RuntimeError):
    """An illegal buffer lifecycle transition or a reference count going below zero."""


class BufferLeakError(BufferStateError):
    """Buffers were still referenced when their pool closed; the message names their stages.

    ``labels``: the label of each leaked buffer (``"<stage>:<value>"``, None if unlabelled);
    ``stages``: the stages that produced them, sorted (filled in by ``Session`` on close).
    """

    labels: list[str | None]
    stages: list[str]

    def __init__(self, message: str, *, labels: Iterable[str | None] = (), stages: Iterable[str] = ()):
        super().__init__(message)
        self.labels = list(labels)
        self.stages = list(stages)


class TransferError(HetschedError):
    """A copy between memory domains failed or was given inconsistent buffers."""


# -- platform -----------------------------------------------------------------


class PlatformError(HetschedError):
    """Reading or writing the board (sysfs, procfs, debugfs) failed."""


class GovernorError(HetschedError):
    """The DVFS governor could not do what was asked."""


class SysfsError(PlatformError, OSError):
    """A sysfs/procfs/debugfs access failed for a reason other than a missing file."""


class SysfsPermissionError(SysfsError, GovernorError, PermissionError):
    """No permission to read or write a path; the message names it (run as root, or ``strict=False``)."""


class PathOutsideRootError(SysfsError, ValueError):
    """A path resolved (through ``..`` or a symlink) outside the injected root; nothing was touched."""


class UnknownSocError(PlatformError, LookupError):
    """No SoC profile with that name; the message lists the known ones."""


class TwinError(PlatformError):
    """The SoC twin was given bad parameters (unknown SoC, bad root, bad speed)."""


class UnsupportedFrequencyError(GovernorError, ValueError):
    """A frequency is not in the domain's available list (the message shows the list)."""


class FrequencyLockError(GovernorError):
    """A domain's achieved frequency did not follow what was written (e.g. nvpmodel re-applied)."""


class GovernorBusyError(GovernorError):
    """Another hetsched governor (this process or another) holds the root's governor lock.

    Raised at start, before any knob was saved or written. Attributes ``root`` (the sysfs
    root) and ``pid`` (the holder's, None when it could not be read) say which.
    """

    root: str
    pid: int | None

    def __init__(self, message: str, *, root: str = "", pid: int | None = None):
        super().__init__(message)
        self.root = root
        self.pid = pid


class PowerBudgetError(GovernorError, ValueError):
    """Even the lowest operating point is predicted to exceed the power budget."""


class ProfileError(HetschedError, ValueError):
    """A saved profile (cost table, governor profile) is malformed or for another board."""


class UnsupportedGovernorError(GovernorError, ValueError):
    """A cpufreq/devfreq governor name is not in the domain's available list (the message shows it)."""


class NotRegularFileError(HetschedError, ValueError):
    """A path hetsched reads whole (a model or its external data, a trace, calibration data, a
    manifest) is a FIFO, a character device, a socket or a directory (or a link to one): it is
    refused before anything is read from it. ``path`` names it, ``kind`` says what it is."""

    path: str
    kind: str

    def __init__(self, message: str, *, path: str = "", kind: str = ""):
        super().__init__(message)
        self.path = path
        self.kind = kind


class TraceWriteError(HetschedError, OSError):
    """The session's trace file could not be written (the disk filled up, say). Raised when the
    session closes, after every request was answered; the requests' results are unaffected.
    ``path`` names the file, ``events_written`` how many events it holds, and ``complete`` says
    whether the file was still ended as valid JSON (else it stops after the last whole event,
    at byte ``size``)."""

    path: str
    events_written: int
    size: int
    complete: bool

    def __init__(self, message: str, *, path: str = "", events_written: int = 0, size: int = 0,
                 complete: bool = False):
        super().__init__(message)
        self.path = path
        self.events_written = events_written
        self.size = size
        self.complete = complete
