"""A YOLOv8-style detector exported as ultralytics exports it with ``dynamic=True`` (issue 24).

Opset 17, input ``images`` with free dims ``batch, height, width``; SiLU convs, a C2f-like split,
SPPF, nearest ``Resize`` upsampling, and the head's shape arithmetic: each level's output is
flattened by ``Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [C], [-1]))``, the DFL reshapes
through ``Shape``/``Gather``/``Concat`` chains, and the anchor grid is built from the feature
maps' sizes (``Shape -> Gather -> Cast -> Range``: 0-d float and int64 shape tensors). Seeded
random weights, small channels: the toolkit simulator converts and runs it in seconds.
Output ``output0``: ``[batch, 4 + classes, anchors]`` (boxes in pixels, class scores).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64

REG_MAX = 4
CLASSES = 4
STRIDES = (8, 16, 32)


def yolov8_style(seed: int = 0, *, dynamic: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    count = [0]

    def name(prefix: str) -> str:
        count[0] += 1
        return f"/model.{count[0]}/{prefix}"

    def const(value: np.ndarray, hint: str = "const") -> str:
        n = name(hint)
        inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def node(op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        base = name(op)
        outs = [f"{base}_output_{k}" for k in range(n_out)]
        nodes.append(helper.make_node(op, inputs, outs, name=base, **attrs))
        return outs

    def conv(x: str, cin: int, cout: int, k: int = 3, s: int = 1, act: bool = True) -> str:
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(1.0 / (cin * k * k))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        (y,) = node("Conv", [x, const(w, "weight"), const(b, "bias")], kernel_shape=[k, k], strides=[s, s],
                    pads=[k // 2] * 4)
        if not act:
            return y
        (sig,) = node("Sigmoid", [y])
        return node("Mul", [y, sig])[0]

    def dim(x: str, axis: int) -> str:
        """``Gather(Shape(x), axis)``: a 0-d int64 tensor."""
        (shape,) = node("Shape", [x])
        return node("Gather", [shape, const(np.array(axis, np.int64), "axis")], axis=0)[0]

    def unsq(x: str) -> str:
        return node("Unsqueeze", [x, const(np.array([0], np.int64), "axes")])[0]

    x = "images"
    c1 = conv(x, 3, 8, s=2)
    c2 = conv(c1, 8, 16, s=2)
    p3 = conv(c2, 16, 16, s=2)
    # C2f-like: split, a conv on one half, concat
    a, b = node("Split", [p3, const(np.array([8, 8], np.int64), "split")], 2, axis=1)
    p3 = conv(node("Concat", [a, b, conv(b, 8, 8)], axis=1)[0], 24, 16, k=1)
    p4 = conv(p3, 16, 32, s=2)
    p5 = conv(p4, 32, 32, s=2)
    # SPPF
    m1 = node("MaxPool", [p5], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])[0]
    m2 = node("MaxPool", [m1], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])[0]
    p5 = conv(node("Concat", [p5, m1, m2], axis=1)[0], 96, 32, k=1)
    scales = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    up5 = node("Resize", [p5, "", const(scales, "scales")], mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor")[0]
    n4 = conv(node("Concat", [up5, p4], axis=1)[0], 64, 32, k=1)
    up4 = node("Resize", [n4, "", const(scales, "scales")], mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor")[0]
    n3 = conv(node("Concat", [up4, p3], axis=1)[0], 48, 16, k=1)

    no = 4 * REG_MAX + CLASSES
    flat: list[str] = []
    anchors: list[str] = []
    strides: list[str] = []
    for feat, ch, stride in ((n3, 16, 8), (n4, 32, 16), (p5, 32, 32)):
        box = conv(conv(feat, ch, 16), 16, 4 * REG_MAX, k=1, act=False)
        cls = conv(conv(feat, ch, 16), 16, CLASSES, k=1, act=False)
        y = node("Concat", [box, cls], axis=1)[0]
        target = node("Concat", [unsq(dim(y, 0)), const(np.array([no], np.int64)), const(np.array([-1], np.int64))],
                      axis=0)[0]
        flat.append(node("Reshape", [y, target])[0])
        # the anchor grid from the feature map's size (ultralytics' make_anchors, traced)
        h = node("Cast", [dim(feat, 2)], to=F)[0]
        w = node("Cast", [dim(feat, 3)], to=F)[0]
        zero, one, half = (const(np.array(v, np.float32)) for v in (0.0, 1.0, 0.5))
        sx = node("Add", [node("Range", [zero, w, one])[0], half])[0]
        sy = node("Add", [node("Range", [zero, h, one])[0], half])[0]
        hw = node("Concat", [unsq(dim(feat, 2)), unsq(dim(feat, 3))], axis=0)[0]
        gx = node("Expand", [node("Unsqueeze", [sx, const(np.array([0], np.int64))])[0], hw])[0]
        gy = node("Expand", [node("Unsqueeze", [sy, const(np.array([1], np.int64))])[0], hw])[0]
        grid = node("Concat", [node("Unsqueeze", [gx, const(np.array([-1], np.int64))])[0],
                               node("Unsqueeze", [gy, const(np.array([-1], np.int64))])[0]], axis=-1)[0]
        anchors.append(node("Reshape", [grid, const(np.array([-1, 2], np.int64))])[0])
        n_anchor = node("Mul", [unsq(dim(feat, 2)), unsq(dim(feat, 3))])[0]
        shape = node("Concat", [n_anchor, const(np.array([1], np.int64))], axis=0)[0]
        strides.append(node("Expand", [const(np.array([[float(stride)]], np.float32)), shape])[0])
    cat = node("Concat", flat, axis=2)[0]
    box, cls = node("Split", [cat, const(np.array([4 * REG_MAX, CLASSES], np.int64))], 2, axis=1)
    # DFL: [n, 4*R, A] -> [n, 4, R, A] -> [n, R, 4, A] -> softmax -> 1x1 conv with arange(R) -> [n, 4, A]
    dfl_shape = node("Concat", [unsq(dim(box, 0)), const(np.array([4, REG_MAX], np.int64)), unsq(dim(box, 2))],
                     axis=0)[0]
    d = node("Transpose", [node("Reshape", [box, dfl_shape])[0]], perm=[0, 2, 1, 3])[0]
    d = node("Softmax", [d], axis=1)[0]
    d = node("Conv", [d, const(np.arange(REG_MAX, dtype=np.float32).reshape(1, REG_MAX, 1, 1), "dfl")],
             kernel_shape=[1, 1])[0]
    out_shape = node("Concat", [unsq(dim(box, 0)), const(np.array([4], np.int64)), unsq(dim(box, 2))], axis=0)[0]
    dist = node("Reshape", [d, out_shape])[0]
    anc = node("Transpose", [node("Concat", anchors, axis=0)[0]], perm=[1, 0])[0]   # [2, A]
    std = node("Transpose", [node("Concat", strides, axis=0)[0]], perm=[1, 0])[0]   # [1, A]
    lt, rb = node("Split", [dist, const(np.array([2, 2], np.int64))], 2, axis=1)
    x1y1 = node("Sub", [anc, lt])[0]
    x2y2 = node("Add", [anc, rb])[0]
    c_xy = node("Div", [node("Add", [x1y1, x2y2])[0], const(np.array(2.0, np.float32))])[0]
    wh = node("Sub", [x2y2, x1y1])[0]
    dbox = node("Mul", [node("Concat", [c_xy, wh], axis=1)[0], std])[0]
    nodes.append(helper.make_node("Concat", [dbox, node("Sigmoid", [cls])[0]], ["output0"], axis=1,
                                  name="/model.out/Concat"))
    dims: list[str | int] = ["batch", 3, "height", "width"] if dynamic else [1, 3, 64, 64]
    out_dims: list[str | int] = ["batch", no - 4 * REG_MAX + 4, "anchors"]
    graph = helper.make_graph(nodes, "yolov8-style", [helper.make_tensor_value_info("images", F, dims)],
                              [helper.make_tensor_value_info("output0", F, out_dims)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
