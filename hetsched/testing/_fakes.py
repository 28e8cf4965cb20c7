"""Fake backends and devices for tests: no onnxruntime, no hardware.

::

    from hetsched.testing import FakeBackend, fake_device

    with FakeBackend("npu-fake", ops={"Conv", "Relu"}) as backend:     # registered while inside
        devices = ["cpu:0", fake_device("npu0", backend="npu-fake", kind="npu")]
        async with hetsched.Session(model, devices=devices) as s:
            await s.run(feeds)
        assert backend.calls                                          # what ran where
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import onnx

from hetsched._errors import CompileError, DeviceFailedError, StageExecutionError
from hetsched.backends import (
    NO_BACKEND_HOOKS,
    NO_STAGE_HOOKS,
    BackendHooks,
    Capabilities,
    Device,
    StageHooks,
    register_backend,
    unregister_backend,
)

__all__ = ["FakeBackend", "FakeCall", "FakeStage", "fake_device"]

Handler = Callable[[str, Mapping[str, np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class FakeCall:
    """One stage run: which stage, on which device, from which thread, with which inputs."""

    stage: str
    device: str
    thread: str
    inputs: tuple[str, ...]


class FakeStage:
    """A stage run by ``onnx.reference.ReferenceEvaluator`` (pure numpy) or by a handler."""

    def __init__(self, backend: FakeBackend, model: onnx.ModelProto, device: Device, name: str):
        self._backend = backend
        self.device = device
        self.name = name
        self.model = model
        self.input_names = tuple(i.name for i in model.graph.input
                                 if i.name not in {t.name for t in model.graph.initializer})
        self.output_names = tuple(o.name for o in model.graph.output)
        self.hooks: StageHooks = NO_STAGE_HOOKS
        """None of the optional protocols (a test's subclass may declare some)."""
        self._ref: Any = None
        if backend.handler is None:
            from onnx.reference import ReferenceEvaluator

            try:
                self._ref = ReferenceEvaluator(model)
            except Exception as exc:
                raise CompileError(f"fake backend could not compile {name!r}: {exc}") from exc

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self._backend._record(FakeCall(self.name, self.device.name, threading.current_thread().name,
                                       tuple(sorted(feeds))))
        if self._backend.fail_stages and self.name in self._backend.fail_stages:
            raise StageExecutionError(f"fake failure of stage {self.name!r} on {self.device.name!r}",
                                      stage=self.name, device=self.device.name)
        if self._backend.failed_devices and self.device.name in self._backend.failed_devices:
            raise DeviceFailedError(f"fake device {self.device.name!r} failed (made to fail by the test)",
                                    stage=self.name, device=self.device.name)
        try:
            if self._backend.handler is not None:
                return list(self._backend.handler(self.name, feeds))
            return list(self._ref.run(None, dict(feeds)))
        except StageExecutionError:
            raise
        except Exception as exc:
            raise StageExecutionError(f"stage {self.name!r} failed on fake device {self.device.name!r}: {exc}",
                                      stage=self.name, device=self.device.name) from exc

    def close(self) -> None:
        self._ref = None
        self._backend._closed(self.name)


_FakeT = TypeVar("_FakeT", bound="FakeBackend")


class FakeBackend:
    """A test backend: declares which ops it runs and records every stage run.

    :param name: the name devices refer to (``Device.backend``); registered with
        :func:`hetsched.backends.register_backend` while the ``with`` block is open.
    :param ops: op types it can run (None: all).
    :param handler: ``handler(stage_name, feeds) -> outputs`` instead of the reference evaluator.
    :param fail_stages: stage names whose runs raise :class:`StageExecutionError`.
    """

    def __init__(self, name: str = "fake", *, ops: Iterable[str] | None = None, handler: Handler | None = None,
                 fail_stages: Iterable[str] = ()):
        self.name = name
        self.ops = None if ops is None else frozenset(ops)
        self.handler = handler
        self.fail_stages = frozenset(fail_stages)
        self.calls: list[FakeCall] = []
        self.compiled: list[str] = []
        self.closed: list[str] = []
        """Names of the stages closed so far (a re-planned session closes its old plan's)."""
        self.hooks: BackendHooks = NO_BACKEND_HOOKS
        """None of the optional protocols (a test may declare some: ``slow_compile``)."""
        self.failed_devices: frozenset[str] = frozenset()
        """Devices whose every run raises :class:`~hetsched.DeviceFailedError` (see :meth:`fail_device`)."""
        self._lock = threading.Lock()

    def fail_device(self, name: str) -> None:
        """From now on, every stage run on device ``name`` raises
        :class:`~hetsched.DeviceFailedError` (a device failing for good: failover tests)."""
        with self._lock:
            self.failed_devices = self.failed_devices | {name}

    def _closed(self, name: str) -> None:
        with self._lock:
            self.closed.append(name)

    def capabilities(self, device: Device) -> Capabilities:
        if self.ops is None:
            return Capabilities.everything()
        return Capabilities.ops(self.ops)

    def compile(self, model: onnx.ModelProto, device: Device, *, name: str) -> FakeStage:
        with self._lock:
            self.compiled.append(name)
        return FakeStage(self, model, device, name)

    def _record(self, call: FakeCall) -> None:
        with self._lock:
            self.calls.append(call)

    def __enter__(self: _FakeT) -> _FakeT:  # a subclass's `with` keeps its own type
        register_backend(self.name, self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        unregister_backend(self.name)


def fake_device(name: str, *, backend: str = "fake", kind: str = "gpu", memory_domain: str = "host",
                peak_flops: float = 1e11, mem_bandwidth: float = 2e10, **options: Any) -> Device:
    """A :class:`Device` served by a fake backend (no CPU pinning)."""
    return Device(name=name, kind=kind, backend=backend, memory_domain=memory_domain,  # type: ignore[arg-type]
                  peak_flops=peak_flops, mem_bandwidth=mem_bandwidth, options=options)
