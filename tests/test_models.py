"""The light models shipped in the onnx wheel, cut into stages across three CPU devices, match onnxruntime."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hetsched import ModelNotFoundError, Session, load_model
from hetsched._planning.model import embedded_model, embedded_model_names, model_path
from hetsched.policies import HEFT, Pinned, PlacementPolicy, PowerThermalWeighted, RandomPolicy

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["squeezenet", "resnet50", "shufflenet", "inception_v1", "densenet121"]
DEVICES = ["cpu:0", "cpu:1", "cpu:0-1"]
# Splitting a model changes which kernels onnxruntime fuses at stage boundaries, so
# results may differ in the last bits; anything beyond float32 rounding is a bug.
RTOL, ATOL = 1e-5, 1e-5


def _path(name: str) -> Path:
    return LIGHT / f"light_{name}.onnx"


@cache
def _reference(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray], int]:
    """Random feeds, onnxruntime's outputs, and the node count."""
    sess = ort.InferenceSession(str(_path(name)), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    n_nodes = len(onnx.load(str(_path(name)), load_external_data=False).graph.node)
    return feeds, sess.run(None, feeds), n_nodes


async def _run(name: str, policy: PlacementPolicy | str | None, max_unit_nodes: int | None) -> tuple[list[np.ndarray], int, set[str]]:
    feeds, _, _ = _reference(name)
    async with Session(_path(name), devices=DEVICES, policy=policy, max_unit_nodes=max_unit_nodes) as s:
        out = await s.run(None, feeds)
        return out, len(s.plan.stages), {st.device for st in s.plan.stages}


def _check(name: str, got: list[np.ndarray]) -> None:
    _, expected, _ = _reference(name)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)


def _alternate(u) -> str:  # type: ignore[no-untyped-def]
    return DEVICES[u.id % len(DEVICES)]


# (label, policy factory, units wanted): the model is cut into that many unit subgraphs
# through max_unit_nodes = ceil(nodes / units), then placed.
CUTS = [
    ("pinned-alternating-3", lambda: Pinned(_alternate), 3),
    ("pinned-alternating-8", lambda: Pinned(_alternate), 8),
    ("random-seed4-4", lambda: RandomPolicy(4), 4),
    ("random-seed6-6", lambda: RandomPolicy(6), 6),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("label", "make_policy", "units"), CUTS, ids=[c[0] for c in CUTS])
def test_cut_into_2_to_8_stages_matches_onnxruntime(model: str, label: str, make_policy: Callable[[], PlacementPolicy],
                                                   units: int) -> None:
    _, _, n_nodes = _reference(model)
    got, n_stages, used = anyio.run(_run, model, make_policy(), math.ceil(n_nodes / units))
    assert 2 <= n_stages <= 8, f"{model} {label}: {n_stages} stages"
    assert len(used) >= 2
    _check(model, got)


POLICIES = [
    ("power-thermal", PowerThermalWeighted),
    ("heft", HEFT),
    ("random", lambda: RandomPolicy(1)),
    ("pinned", lambda: Pinned("cpu:1")),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("label", "make_policy"), POLICIES, ids=[p[0] for p in POLICIES])
def test_each_builtin_policy_matches_onnxruntime(model: str, label: str, make_policy: Callable[[], PlacementPolicy]) -> None:
    _, _, n_nodes = _reference(model)
    got, n_stages, used = anyio.run(_run, model, make_policy(), math.ceil(n_nodes / 4))
    assert 1 <= n_stages <= 4
    if label == "pinned":
        assert used == {"cpu:1"} and n_stages == 1
    _check(model, got)


# -- embedded models by name ---------------------------------------------------------------------


def test_embedded_names_are_the_light_models_in_the_wheel() -> None:
    names = embedded_model_names()
    assert {f"light_{m}" for m in MODELS} <= set(names)
    assert names == tuple(sorted(p.stem for p in LIGHT.glob("light_*.onnx")))


@pytest.mark.parametrize("name", ["light_squeezenet", "squeezenet"])
def test_load_model_accepts_an_embedded_name(name: str) -> None:
    got = load_model(name)
    expected = load_model(_path("squeezenet"))
    assert got.graph.SerializeToString() == expected.graph.SerializeToString()


def test_a_file_wins_over_an_embedded_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    tiny = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "tiny", [x], [y]))
    (tmp_path / "squeezenet").write_bytes(tiny.SerializeToString())
    monkeypatch.chdir(tmp_path)
    assert model_path("squeezenet") == Path("squeezenet")
    assert load_model("squeezenet").graph.name == "tiny"


def test_unknown_name_lists_the_embedded_models() -> None:
    with pytest.raises(ModelNotFoundError, match="'nosuchnet' is neither a file nor an embedded model") as info:
        load_model("nosuchnet")
    assert all(n in str(info.value) for n in embedded_model_names())
    with pytest.raises(ModelNotFoundError, match="nosuchnet"):
        embedded_model("nosuchnet")
    # something that looks like a path is a path: no embedded lookup
    with pytest.raises(ModelNotFoundError, match=r"model file 'squeezenet\.onnx' does not exist"):
        load_model("squeezenet.onnx")


def test_with_input_shapes_fixes_free_dimensions_and_names_bad_input() -> None:
    from onnx import TensorProto, helper

    from hetsched import InputError
    from hetsched._planning.model import with_input_shapes

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    fixed = with_input_shapes(m, {"x": (4, 3)})
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [4, 3]
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [4, 3]
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "n"  # the original is untouched
    with pytest.raises(InputError, match="'z' is not a tensor input"):
        with_input_shapes(m, {"z": (1, 3)})
    with pytest.raises(InputError, match="rank 2"):
        with_input_shapes(m, {"x": (1, 3, 1)})
    with pytest.raises(InputError, match="dimension 1 is fixed at 3"):
        with_input_shapes(m, {"x": (1, 4)})
