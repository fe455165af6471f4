"""The pattern matcher and the fusions built on it: LayerNorm, Softmax and GELU written in
primitive ops (as exporters write them) become one fused node, with the same outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.passes import pattern as P
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_pass, random_feeds
from plugrt_builtin_ops.activation import fuse_gelu
from plugrt_builtin_ops.normalization import fuse_layernorm
from plugrt_builtin_ops.reduction import fuse_softmax


class ModelBuilder:
    """A tiny ONNX graph written node by node, float32 input ``x``."""

    def __init__(self, opset: int, shape=(2, 3, 8), constant_nodes: bool = False):
        self.opset, self.shape, self.constant_nodes = opset, shape, constant_nodes
        self.nodes, self.inits, self.count = [], [], 0

    def _name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, value, dtype=np.float32):
        name = self._name("c")
        array = np.asarray(value, dtype)
        if self.constant_nodes:
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"/{name}",
                                               value=numpy_helper.from_array(array)))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op_type, *inputs, **attrs):
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"/{out}", **attrs))
        return out

    def reduce(self, op_type, x, axes, keepdims=1):
        """A reduction with axes as an attribute or (opset 18 on; ReduceSum 13 on) an input."""
        since = 13 if op_type == "ReduceSum" else 18
        if self.opset >= since:
            return self.node(op_type, x, self.const(axes, np.int64), keepdims=keepdims)
        return self.node(op_type, x, axes=axes, keepdims=keepdims)

    def model(self, *outputs):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, self.shape)
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "patterns", [x], outs, initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])


def op_types(graph):
    return [n.op_type for n in graph.nodes]


def fused(after, op_type):
    found = [n for n in after.nodes if n.op_type == op_type]
    assert len(found) == 1, op_types(after)
    return found[0]


def assert_unchanged(model, run, registry):
    before, after = check_pass(model, run, registry=registry)
    assert op_types(after) == op_types(before)


# ---------------------------------------------------------------- LayerNormalization

def layernorm(b: ModelBuilder, x="x", axes=(-1,), gamma=True, beta=True, square="pow", eps=1e-5,
              variance="torchscript"):
    axes = list(axes)
    mean = b.reduce("ReduceMean", x, axes)
    d = b.node("Sub", x, mean)
    if variance == "torchscript":
        sq = b.node("Pow", d, b.const(2.0)) if square == "pow" else b.node("Mul", d, d)
        var = b.reduce("ReduceMean", sq, axes)
    else:  # E[x^2] - mean^2
        var = b.node("Sub", b.reduce("ReduceMean", b.node("Mul", x, x), axes), b.node("Mul", mean, mean))
    y = b.node("Div", d, b.node("Sqrt", b.node("Add", var, b.const(eps))))
    normalized = [b.shape[a] for a in axes]
    if gamma:
        y = b.node("Mul", y, b.const(np.linspace(0.5, 1.5, normalized[-1])))
    if beta:
        y = b.node("Add", y, b.const(np.linspace(-1, 1, normalized[-1])))
    return y


@pytest.mark.parametrize("opset", [13, 17, 18])
def test_layernorm_torchscript(opset, registry):
    b = ModelBuilder(opset)
    model = b.model(layernorm(b, eps=1e-6))
    before, after = check_pass(model, fuse_layernorm.run, registry=registry, atol=1e-5)
    assert len(after.nodes) < len(before.nodes) and op_types(after) == ["LayerNormalization"]
    node = fused(after, "LayerNormalization")
    assert node.attrs["axis"] == -1 and node.attrs["epsilon"] == pytest.approx(1e-6)
    assert len(node.origin) == 9 and node.outputs == tuple(before.outputs)


@pytest.mark.parametrize("opset", [13, 18])
def test_layernorm_two_axes_without_affine_and_mul_square(opset, registry):
    b = ModelBuilder(opset)
    model = b.model(layernorm(b, axes=(-2, -1), gamma=False, beta=False, square="mul"))
    before, after = check_pass(model, fuse_layernorm.run, registry=registry, atol=1e-5)
    node = fused(after, "LayerNormalization")
    assert len(after.nodes) == 1 and node.attrs["axis"] == -2
    np.testing.assert_array_equal(after.values[node.inputs[1]].const, np.ones((3, 8), np.float32))
    assert len(node.inputs) == 2  # no bias: beta was absent


def test_layernorm_broadcast_gamma_and_readers_kept(registry):
    b = ModelBuilder(13)
    y = layernorm(b, axes=(1, 2))  # gamma/beta of shape (8,) broadcast over (3, 8)
    model = b.model(b.node("Relu", y), y)
    before, after = check_pass(model, fuse_layernorm.run, registry=registry, atol=1e-5)
    assert op_types(after) == ["LayerNormalization", "Relu"]
    assert fused(after, "LayerNormalization").attrs["axis"] == -2


def test_layernorm_variance_as_mean_of_squares(registry):
    b = ModelBuilder(13)
    model = b.model(layernorm(b, variance="moments"))
    before, after = check_pass(model, fuse_layernorm.run, registry=registry, atol=1e-4)
    assert op_types(after) == ["LayerNormalization"]


@pytest.mark.parametrize("case", ["pow3", "middle_axis", "shared_d", "gamma_not_const"])
def test_layernorm_not_fused(case, registry):
    b = ModelBuilder(13)
    if case == "pow3":
        mean = b.reduce("ReduceMean", "x", [-1])
        d = b.node("Sub", "x", mean)
        var = b.reduce("ReduceMean", b.node("Pow", d, b.const(3.0)), [-1])
        outs = [b.node("Div", d, b.node("Sqrt", b.node("Add", b.node("Abs", var), b.const(1e-5))))]
    elif case == "middle_axis":
        outs = [layernorm(b, axes=(1,), gamma=False, beta=False)]
    elif case == "shared_d":  # the centered value is also a graph output
        y = layernorm(b, gamma=False, beta=False)
        outs = [y, b.nodes[1].output[0]]
    else:
        y = layernorm(b, gamma=False, beta=False)
        outs = [b.node("Mul", y, "x")]
    model = b.model(*outs)
    if case == "gamma_not_const":  # the plain LayerNorm under the Mul still fuses
        before, after = check_pass(model, fuse_layernorm.run, registry=registry, atol=1e-5)
        assert op_types(after) == ["LayerNormalization", "Mul"]
        return
    assert_unchanged(model, fuse_layernorm.run, registry)


def test_layernorm_needs_the_fused_op(registry, monkeypatch):
    real = registry.find_op
    monkeypatch.setattr(registry, "find_op", lambda d, t, o: None if t == "LayerNormalization" else real(d, t, o))
    b = ModelBuilder(13)
    assert_unchanged(b.model(layernorm(b)), fuse_layernorm.run, registry)


# ---------------------------------------------------------------- Softmax

def softmax(b: ModelBuilder, x="x", axis=-1, shift=True, max_axis=None):
    if shift:
        x = b.node("Sub", x, b.reduce("ReduceMax", x, [axis if max_axis is None else max_axis]))
    e = b.node("Exp", x)
    return b.node("Div", e, b.reduce("ReduceSum", e, [axis]))


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("shift", [True, False])
def test_softmax(opset, shift, registry):
    b = ModelBuilder(opset)
    model = b.model(softmax(b, axis=1, shift=shift))
    before, after = check_pass(model, fuse_softmax.run, registry=registry)
    assert len(after.nodes) < len(before.nodes) and op_types(after) == ["Softmax"]
    node = fused(after, "Softmax")
    assert node.attrs["axis"] == 1 and node.opset == 13


def test_softmax_not_fused(registry):
    b = ModelBuilder(13)
    e = b.node("Exp", "x")
    two_axes = b.node("Div", e, b.reduce("ReduceSum", e, [1, 2]))
    assert_unchanged(b.model(two_axes), fuse_softmax.run, registry)


def test_softmax_max_over_another_axis_stays(registry):
    b = ModelBuilder(13)
    model = b.model(softmax(b, axis=-1, max_axis=1))  # the shift is kept: a softmax of x - max
    before, after = check_pass(model, fuse_softmax.run, registry=registry)
    assert op_types(after) == ["ReduceMax", "Sub", "Softmax"]


def test_softmax_exp_read_elsewhere(registry):
    b = ModelBuilder(13)
    e = b.node("Exp", "x")
    y = b.node("Div", e, b.reduce("ReduceSum", e, [-1]))
    assert_unchanged(b.model(y, b.node("Neg", e)), fuse_softmax.run, registry)


# ---------------------------------------------------------------- GELU

def gelu(b: ModelBuilder, x="x", where="product", scale="div", half=0.5):
    scaled = b.node("Div", x, b.const(math.sqrt(2.0))) if scale == "div" else \
        b.node("Mul", x, b.const([1 / math.sqrt(2.0)]))
    term = b.node("Add", b.node("Erf", scaled), b.const(1.0))
    if where == "x":
        return b.node("Mul", b.node("Mul", x, b.const(half)), term)
    if where == "term":
        return b.node("Mul", x, b.node("Mul", b.const(half), term))
    return b.node("Mul", b.node("Mul", x, term), b.const(half))


def gelu_tanh(b: ModelBuilder, x="x", cube="pow", where="x"):
    c = b.node("Pow", x, b.const(3.0)) if cube == "pow" else b.node("Mul", x, b.node("Mul", x, x))
    inner = b.node("Add", x, b.node("Mul", b.const(0.044715), c))
    t = b.node("Tanh", b.node("Mul", b.const(math.sqrt(2.0 / math.pi)), inner))
    term = b.node("Add", b.const(1.0), t)
    if where == "x":
        return b.node("Mul", b.node("Mul", b.const(0.5), x), term)
    return b.node("Mul", b.node("Mul", x, term), b.const(0.5))


@pytest.mark.parametrize("where", ["x", "term", "product"])
@pytest.mark.parametrize("scale", ["div", "mul"])
def test_gelu_exact(where, scale, registry):
    b = ModelBuilder(13, constant_nodes=(where == "product"))  # TorchScript writes Constant nodes
    model = b.model(gelu(b, where=where, scale=scale))
    before, after = check_pass(model, fuse_gelu.run, registry=registry)
    assert fused(after, "Gelu").attrs["approximate"] == "none"
    assert [t for t in op_types(after) if t != "Constant"] == ["Gelu"] and len(after.nodes) < len(before.nodes)


@pytest.mark.parametrize("cube,where", [("pow", "x"), ("mul", "product")])
def test_gelu_tanh(cube, where, registry):
    b = ModelBuilder(13)
    model = b.model(gelu_tanh(b, cube=cube, where=where))
    before, after = check_pass(model, fuse_gelu.run, registry=registry)
    assert op_types(after) == ["Gelu"] and fused(after, "Gelu").attrs["approximate"] == "tanh"


def test_gelu_not_fused(registry, monkeypatch):
    b = ModelBuilder(13)
    assert_unchanged(b.model(gelu(b, half=0.6)), fuse_gelu.run, registry)
    real = registry.find_op
    monkeypatch.setattr(registry, "find_op", lambda d, t, o: None if t == "Gelu" else real(d, t, o))
    b = ModelBuilder(13)
    assert_unchanged(b.model(gelu(b)), fuse_gelu.run, registry)


def test_gelu_inner_value_read_elsewhere(registry):
    b = ModelBuilder(13)
    y = gelu(b, where="x")
    erf = next(n.output[0] for n in b.nodes if n.op_type == "Erf")
    assert_unchanged(b.model(y, erf), fuse_gelu.run, registry)


# ---------------------------------------------------------------- the matcher itself

def test_matcher_commutes_binds_and_requires_closure(registry):
    b = ModelBuilder(13)
    square = b.node("Mul", "x", "x")
    y = b.node("Add", b.const(1.0), square)
    graph = import_model(b.model(y, square), registry=registry)
    pattern = P.op("Add", P.op("Mul", P.capture("a"), P.capture("a"), name="sq"), P.const("one", P.close_to(1.0)))
    root = graph.nodes[-1]
    matcher = P.Matcher(graph, registry)
    assert matcher.match(pattern, root) is None  # the square is a graph output too
    graph.outputs.remove(square)
    match = P.Matcher(graph, registry).match(pattern, root)
    assert match.values["a"] == "x" and match.node("sq").op_type == "Mul" and float(match.const("one")) == 1.0
    assert [n.op_type for n in match.nodes] == ["Add", "Mul"]
    different = P.op("Add", P.op("Mul", P.capture("a"), P.const("a")), P.capture("b"))
    assert P.Matcher(graph, registry).match(different, root) is None


def test_rewrites_leave_the_graph_in_order_for_the_next_match(registry):
    """A replacement (and a node a rule adds) goes to the graph's end, where a reader of the
    root's outputs may precede it: the graph is put back in order before the next rule runs
    (a rule may run the graph, as shape facts do)."""
    b = ModelBuilder(13)
    y = b.node("Relu", b.node("Relu", b.node("Relu", "x")))  # /relu_1, /relu_2, /relu_3
    graph = import_model(b.model(y), registry=registry)
    seen = []

    def in_order(graph):
        made = set(graph.inputs) | {v.name for v in graph.values.values() if v.is_const}
        for node in graph.nodes:
            if any(name and name not in made for name in node.inputs):
                return False
            made.update(name for name in node.outputs if name)
        return True

    def to_sigmoid(graph, registry, match):
        seen.append((match.root.name, in_order(graph)))
        negated = P.fresh_name(graph, "negated")
        graph.add_node(P.make_node(graph, registry, "Neg", [match.values["x"]], [negated], opset=13))
        return match.fused(registry, "Sigmoid", [negated], opset=13)

    rule = P.Rule("to_sigmoid", P.op("Relu", P.capture("x")), lambda g, r, m: to_sigmoid(g, r, m)
                  if m.root.name in ("/relu_1", "/relu_2") else None)
    assert P.rewrite_matches(graph, registry, [rule]) == 2
    assert seen == [("/relu_2", True), ("/relu_1", True)] and in_order(graph)
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    got = ReferenceExecutor(graph, registry).run({"x": x})[graph.outputs[0]]
    expected = np.maximum(1 / (1 + np.exp(-(-(1 / (1 + np.exp(-(-x))))))), 0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


# ---------------------------------------------------------------- the whole pipeline

def test_pipeline_fuses_layernorm_gelu_softmax(registry):
    b = ModelBuilder(13)
    y = softmax(b, gelu(b, layernorm(b), where="product"), axis=-1)
    graph = import_model(b.model(y), registry=registry)
    before = graph.copy()
    results = optimize(graph, registry)
    for name in ("LayerNormalization", "Gelu", "Softmax"):
        fused(graph, name)
    assert len(graph.nodes) < len(before.nodes)
    assert {r.name: r.rewrites for r in results}["builtin-normalization:fuse_layernorm"] == 1
    feeds = random_feeds(before)
    want = ReferenceExecutor(before, registry).run(feeds)[y]
    got = ReferenceExecutor(graph, registry).run(feeds)[y]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
