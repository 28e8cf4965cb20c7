"""The backend seam's optional hooks are declared (``hooks``), never discovered by name (issue 25)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetsched._runtime import Topology, pools_for
from hetsched._runtime._program import StageRuntime
from hetsched._runtime._transfer import TransferEngine
from hetsched.backends import NO_STAGE_HOOKS, Device, StageHooks
from hetsched.backends.cpu import CpuBackend
from hetsched.backends.sim import SimBackend, twin_devices

_SPEC = SimpleNamespace(id=0, name="s0", device="d")


def _neg() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Undeclared:
    """Has every optional method by name, declares none of them."""

    input_names: tuple[str, ...] = ("x",)
    output_names: tuple[str, ...] = ("y",)
    hooks = NO_STAGE_HOOKS

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [-feeds["x"]]

    def output_specs(self) -> Any:
        return [(np.dtype(np.float32), (4,))]

    def run_into(self, feeds: Mapping[str, np.ndarray], outputs: Any) -> None:
        raise AssertionError("never called")

    def last_run_seconds(self) -> float:
        return 1.0

    def last_run_energy_j(self) -> float:
        return 1.0

    def worker_state(self, worker: object) -> object:
        return object()

    def close_worker_state(self, state: object) -> None:
        pass

    def close(self) -> None:
        pass


def test_methods_a_stage_does_not_declare_are_never_used() -> None:
    st = StageRuntime(_SPEC, _Undeclared(), "k", 0.0, "host")
    assert not st.bound and st.specs is None
    assert st.seconds_fn is None and st.energy_fn is None
    assert not st.stateful and st.state_alive is None
    assert st.fallback_reason == "the backend cannot run it in place"


def test_what_a_stage_declares_is_what_the_runtime_uses() -> None:
    stage = _Undeclared()
    stage.hooks = StageHooks(in_place=stage, worker_state=stage, modelled=stage)  # type: ignore[arg-type]
    st = StageRuntime(_SPEC, stage, "k", 0.0, "host")
    assert st.bound and st.specs == ((np.dtype(np.float32), (4,)),)
    assert st.seconds_fn is not None and st.seconds_fn() == 1.0 and st.energy_fn is not None
    assert st.stateful and st.state_alive is None  # no state_probe declared


def test_built_in_stages_declare_their_hooks() -> None:
    cpu = CpuBackend().compile(_neg(), Device(name="cpu:0", cpus=()), name="s")
    itself: object = cpu  # the declared CompiledStage is not a BindableStage by type; the object is
    try:
        assert cpu.hooks.in_place is itself and cpu.hooks.modelled is None and cpu.hooks.worker_state is None
    finally:
        cpu.close()
    npu = next(d for d in twin_devices("rk3588", host=(0,)) if d.kind == "npu")
    sim = SimBackend().compile(_neg(), npu, name="s")
    sim_itself: object = sim
    try:
        assert all(hook is sim_itself for hook in (sim.hooks.in_place, sim.hooks.modelled, sim.hooks.statistics))
        st = StageRuntime(_SPEC, sim, "k", 0.0, "host")
        assert st.bound and st.seconds_fn is not None
    finally:
        sim.close()
    assert CpuBackend().hooks.workers is not None and not CpuBackend().hooks.slow_compile
    assert SimBackend().hooks.workers is None


@pytest.mark.anyio
async def test_transfer_hooks_that_are_none_cost_nothing(tmp_path: Any) -> None:
    seen: list[str] = []

    class Hooks:
        before_transfer = preempted = resumed = None

        def after_transfer(self, info: Any) -> None:
            seen.append(info.dst)

    topo = Topology.unified(devices=("npu",))
    pools = pools_for(topo, root=tmp_path)
    buf = pools["host"].acquire_nowait((np.uint8, (64,)), label="x")
    async with TransferEngine(topo, pools, hooks=Hooks()) as eng:
        out = await eng.transfer(buf, "npu")
    out.release()
    buf.release()
    assert seen == ["npu"]
