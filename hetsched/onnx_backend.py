"""An ``onnx.backend.base.Backend`` that runs models through hetsched.

::

    import onnx.backend.test
    from hetsched.onnx_backend import backend_for
    from hetsched.policies import RandomPolicy

    backend = backend_for(devices=["cpu:0", "cpu:1", "cpu:0-1"], policy=RandomPolicy(0), max_unit_nodes=1)
    onnx.backend.test.BackendTest(backend, __name__)

Each ``BackendRep.run`` opens a :class:`hetsched.SyncSession`, runs, and closes it, so
no threads outlive a call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx.backend.base import Backend as _OnnxBackend
from onnx.backend.base import BackendRep as _OnnxBackendRep

from hetsched.backends import Device
from hetsched.policies import PlacementPolicy

from ._planning.graph import GraphIndex
from ._planning.model import load_model
from ._session._sync import SyncSession

__all__ = ["HetschedBackend", "HetschedBackendRep", "backend_for", "prepare", "run_model", "run_node",
           "supports_device"]


class HetschedBackendRep(_OnnxBackendRep):
    """A prepared model; ``run(inputs)`` takes a list (required inputs in order) or a dict."""

    def __init__(self, model: onnx.ModelProto, options: Mapping[str, Any]):
        self.model = model
        self.options = dict(options)
        self._inputs = GraphIndex(model).required_inputs
        self._outputs = [o.name for o in model.graph.output]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) > len(self._inputs):
                # IR < 4 models list initializers as inputs; onnxruntime maps positionally over all inputs.
                names = [i.name for i in self.model.graph.input]
            else:
                names = list(self._inputs)
            feeds = dict(zip(names, inputs, strict=False))  # old IRs list initializers as inputs too
        else:
            feeds = {self._inputs[0]: inputs}
        with SyncSession(self.model, **self.options) as session:
            return tuple(session.run(None, feeds))


class HetschedBackend(_OnnxBackend):
    """hetsched as an ONNX backend, on the default devices (the host's CPU clusters)."""

    options: ClassVar[dict[str, Any]] = {}  # backend_for() makes a subclass with its own

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> HetschedBackendRep:
        loaded = load_model(model)
        return HetschedBackendRep(loaded, cls.options)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        arrays = [np.asarray(x) for x in inputs]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(node.input, arrays, strict=False)  # trailing optional inputs may be omitted
        ]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        # The lowest IR version the opset needs, not onnx's newest: an older onnxruntime refuses a newer IR.
        model.ir_version = max(4, onnx.helper.find_min_ir_version_for(list(model.opset_import), True))
        return cls.run_model(model, arrays, device, **kwargs)


def backend_for(
    devices: Sequence[str | Device] | None = None,
    policy: PlacementPolicy | str | None = None,
    max_unit_nodes: int | None = None,
    **session_options: Any,
) -> type[HetschedBackend]:
    """A backend class bound to these devices, policy and unit size (usable with ``BackendTest``)."""
    opts = dict(session_options, devices=devices, policy=policy, max_unit_nodes=max_unit_nodes)
    return type("HetschedBackendFor", (HetschedBackend,), {"options": opts})


prepare = HetschedBackend.prepare
run_model = HetschedBackend.run_model
run_node = HetschedBackend.run_node
supports_device = HetschedBackend.supports_device
