"""CostTable.save/load: a saved table comes back; what is not a regular file is refused unread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsched._errors import NotRegularFileError, ProfileError
from hetsched._planning.costs import CostTable


def test_a_saved_table_loads_back(tmp_path: Path) -> None:
    table = CostTable(smoothing=0.2)
    table.update("a..b#2", "cpu:0", 1e-3, analytic_s=5e-4)
    path = tmp_path / "costs.json"
    table.save(path)
    back = CostTable.load(path)
    assert back.get("a..b#2", "cpu:0") == pytest.approx(1e-3)
    assert back.factor("cpu:0") == pytest.approx(2.0)
    assert back.smoothing == pytest.approx(0.2)


def test_a_directory_is_refused_as_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "costs.json").mkdir()
    with pytest.raises(ProfileError, match=r"costs\.json") as info:
        CostTable.load(tmp_path / "costs.json")
    assert isinstance(info.value.__cause__, NotRegularFileError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # A plain read_text() blocks forever on a FIFO nobody writes to.
    fifo = tmp_path / "costs.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match=r"costs\.json") as info:
        CostTable.load(fifo)
    assert isinstance(info.value.__cause__, NotRegularFileError)


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this platform")
    link = tmp_path / "costs.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ProfileError) as info:
        CostTable.load(link)
    assert isinstance(info.value.__cause__, NotRegularFileError)


def test_binary_content_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="could not be read"):
        CostTable.load(path)


def test_a_control_flow_node_costs_its_costliest_branch() -> None:
    # If(c) then y = x @ W (2 * 64 * 64 * 64 FLOPs) else y = x: not "10 FLOPs per output element"
    import numpy as np
    from onnx import TensorProto, helper

    from hetsched._planning.costs import analytic_node_costs
    from hetsched._planning.graph import GraphIndex
    from hetsched._planning.model import load_model

    f = TensorProto.FLOAT
    w = helper.make_tensor("W", f, [64, 64], np.zeros(64 * 64, np.float32).tobytes(), raw=True)
    then = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", f, [64, 64])])  # x, W: the outer graph's
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", f, [64, 64])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", f, [64, 64])],
        [helper.make_tensor_value_info("y", f, [64, 64])], initializer=[w])
    index = GraphIndex(load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    (cost,) = analytic_node_costs(index)
    assert cost.flops >= 2.0 * 64 * 64 * 64
