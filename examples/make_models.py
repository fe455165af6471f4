"""Make the small example ONNX models: a conv net and a transformer encoder layer.

Both are built from primitive ONNX ops with onnx.helper (no framework needed), with
random weights from a fixed seed. Run ``python examples/make_models.py [DIR]``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def weight(self, shape, scale=None, name="w"):
        scale = scale if scale is not None else 1.0 / np.sqrt(np.prod(shape[1:]) or 1)
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(array, name)

    def const(self, array, name="c"):
        self.count += 1
        full = f"{name}_{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), full))
        return full

    def op(self, op_type, inputs, outputs=1, **attrs):
        self.count += 1
        names = [f"{op_type.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"{op_type}_{self.count}", **attrs))
        return names[0] if outputs == 1 else names


def conv_bn_relu(b: _Builder, x, cin, cout, stride=1, relu=True):
    w = b.weight((cout, cin, 3, 3))
    y = b.op("Conv", [x, w, b.weight((cout,), 0.1)], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride])
    scale = b.const((1.0 + 0.1 * b.rng.standard_normal(cout)).astype(np.float32), "bn_scale")
    bias = b.const((0.1 * b.rng.standard_normal(cout)).astype(np.float32), "bn_bias")
    mean = b.const((0.1 * b.rng.standard_normal(cout)).astype(np.float32), "bn_mean")
    var = b.const((0.5 + b.rng.random(cout)).astype(np.float32), "bn_var")
    y = b.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def make_convnet() -> onnx.ModelProto:
    """A small ResNet-style net: stem, two residual blocks, pooling, classifier."""
    b = _Builder(seed=1)
    x = conv_bn_relu(b, "input", 3, 16)
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    for cout, stride in ((16, 1), (32, 2)):
        cin = 16
        y = conv_bn_relu(b, x, cin, cout, stride)
        y = conv_bn_relu(b, y, cout, cout, relu=False)
        if stride != 1 or cin != cout:
            shortcut = b.op("Conv", [x, b.weight((cout, cin, 1, 1))], kernel_shape=[1, 1], strides=[stride, stride])
        else:
            shortcut = x
        x = b.op("Relu", [b.op("Add", [y, shortcut])])
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    logits = b.op("Gemm", [x, b.weight((10, 32)), b.weight((10,), 0.1)], transB=1)
    b.nodes[-1].output[0] = "logits"
    graph = helper.make_graph(
        b.nodes, "convnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="plugrt-examples")


def layer_norm(b: _Builder, x, dim):
    """LayerNorm written as primitive ops, the way older exporters emit it."""
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    centered = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [centered, b.const(np.float32(2.0), "two")])], axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, b.const(np.float32(1e-5), "eps")])])
    normed = b.op("Div", [centered, std])
    gamma = b.const((1.0 + 0.1 * b.rng.standard_normal(dim)).astype(np.float32), "gamma")
    beta = b.const((0.1 * b.rng.standard_normal(dim)).astype(np.float32), "beta")
    return b.op("Add", [b.op("Mul", [normed, gamma]), beta])


def gelu(b: _Builder, x):
    """Erf-based GELU from primitive ops."""
    scaled = b.op("Div", [x, b.const(np.float32(np.sqrt(2.0)), "sqrt2")])
    inner = b.op("Add", [b.op("Erf", [scaled]), b.const(np.float32(1.0), "one")])
    return b.op("Mul", [b.op("Mul", [x, inner]), b.const(np.float32(0.5), "half")])


def make_encoder(dim=32, heads=4, ffn=64) -> onnx.ModelProto:
    """A post-norm transformer encoder layer: self-attention, LayerNorm, GELU MLP."""
    b = _Builder(seed=2)
    head = dim // heads
    x = "tokens"

    def project(t):
        return b.op("Add", [b.op("MatMul", [t, b.weight((dim, dim))]), b.weight((dim,), 0.1)])

    def split_heads(t):
        t = b.op("Reshape", [t, b.const(np.array([0, 0, heads, head], np.int64), "shape")])
        return b.op("Transpose", [t], perm=[0, 2, 1, 3])

    q, k, v = (split_heads(project(x)) for _ in range(3))
    scores = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = b.op("Mul", [scores, b.const(np.float32(1.0 / np.sqrt(head)), "scale")])
    attn = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [attn, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const(np.array([0, 0, dim], np.int64), "shape")])
    x = layer_norm(b, b.op("Add", [x, project(ctx)]), dim)
    hidden = gelu(b, b.op("Add", [b.op("MatMul", [x, b.weight((dim, ffn))]), b.weight((ffn,), 0.1)]))
    out = b.op("Add", [b.op("MatMul", [hidden, b.weight((ffn, dim))]), b.weight((dim,), 0.1)])
    y = layer_norm(b, b.op("Add", [x, out]), dim)
    b.nodes[-1].output[0] = "encoded"
    graph = helper.make_graph(
        b.nodes, "encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", dim])],
        [helper.make_tensor_value_info("encoded", TensorProto.FLOAT, ["batch", "seq", dim])],
        initializer=b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="plugrt-examples")


MODELS = {"convnet": make_convnet, "encoder": make_encoder}
#: Example input shapes (batch 2) for each model's single input.
EXAMPLE_SHAPES = {"convnet": {"input": (2, 3, 8, 8)}, "encoder": {"tokens": (2, 8, 32)}}


def main(out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, make in MODELS.items():
        model = make()
        onnx.checker.check_model(model)
        path = os.path.join(out_dir, f"{name}.onnx")
        onnx.save(model, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))):
        print(p)
