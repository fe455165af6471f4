"""The fold_scales pass and the plugin hooks it drives (as_scale, fold_scale): numeric
before/after checks on small models, negative cases that must not fold, and the hooks'
return values against NumPy float64 math."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.ir.graph import Node
from plugrt.passes import fold_scales
from plugrt.plugin import TensorInfo
from plugrt.registry import default_registry
from plugrt.testing import check_pass
from plugrt_builtin_ops.common.scale_folding import vector_along

F32 = np.float32
TOL = {"rtol": 1e-4, "atol": 1e-5}


def make_model(nodes, inputs, outputs, inits):
    """An opset-17 model: ``inputs`` maps graph-input names to float32 shapes."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bn_params(rng, channels: int, prefix: str = "bn") -> dict:
    """Random BatchNormalization parameters (positive variance), float32."""
    return {
        f"{prefix}_gamma": rng.uniform(0.5, 1.5, channels).astype(F32),
        f"{prefix}_beta": rng.standard_normal(channels).astype(F32),
        f"{prefix}_mean": rng.standard_normal(channels).astype(F32),
        f"{prefix}_var": rng.uniform(0.5, 2.0, channels).astype(F32),
    }


def bn_node(x: str, y: str, prefix: str = "bn") -> object:
    names = [f"{prefix}_{p}" for p in ("gamma", "beta", "mean", "var")]
    return helper.make_node("BatchNormalization", [x, *names], [y], name=prefix, epsilon=1e-3)


def folded(model, expect_ops, **tol):
    """Run the pass through check_pass; assert the node count fell and which ops remain."""
    before, after = check_pass(model, fold_scales.run, **(tol or TOL))
    assert len(after.nodes) < len(before.nodes)
    assert [n.op_type for n in after.nodes] == expect_ops
    return before, after


def unchanged(model):
    """Run the pass and assert it changed nothing (outputs compared by check_pass)."""
    before, after = check_pass(model, fold_scales.run, **TOL)
    assert [n.op_type for n in after.nodes] == [n.op_type for n in before.nodes]
    assert fold_scales.run(before.copy(), default_registry()) == 0


# ---------------------------------------------------------------------- the pass, positive


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_conv_bn(rng, bias, group):
    inits = {"w": rng.standard_normal((6, 4 // group, 3, 3)).astype(F32), **bn_params(rng, 6)}
    conv_inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(6).astype(F32)
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
             bn_node("c", "y")]
    before, after = folded(make_model(nodes, {"x": [2, 4, 5, 5]}, ["y"], inits), ["Conv"])
    conv = after.nodes[0]
    assert len(conv.inputs) == 3 and conv.outputs == ("y",)
    assert conv.origin == ("conv", "bn")
    assert after.values[conv.inputs[1]].const.dtype == F32 and after.values[conv.inputs[2]].const.dtype == F32
    np.testing.assert_array_equal(after.values["w"].const, inits["w"])  # never modified in place


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_bn(rng, group):
    inits = {"w": rng.standard_normal((4, 6 // group, 3, 3)).astype(F32), **bn_params(rng, 6)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], name="convt", strides=[2, 2], group=group),
             bn_node("c", "y")]
    folded(make_model(nodes, {"x": [1, 4, 3, 3]}, ["y"], inits), ["ConvTranspose"])


@pytest.mark.parametrize("c_shape", [None, (5,), (3, 1), (3, 5)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn(rng, trans_b, c_shape):
    inits = {"b": rng.standard_normal((5, 4) if trans_b else (4, 5)).astype(F32), **bn_params(rng, 5)}
    gemm_inputs = ["a", "b"]
    if c_shape is not None:
        inits["c"] = rng.standard_normal(c_shape).astype(F32)
        gemm_inputs.append("c")
    nodes = [helper.make_node("Gemm", gemm_inputs, ["g"], name="gemm", transB=trans_b, alpha=0.7, beta=1.5),
             bn_node("g", "y")]
    before, after = folded(make_model(nodes, {"a": [3, 4]}, ["y"], inits), ["Gemm"])
    assert len(after.nodes[0].inputs) == 3


def test_conv_mul_add(rng):
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32),
             "m": rng.standard_normal((1, 3, 1, 1)).astype(F32),
             "s": rng.standard_normal((3, 1, 1)).astype(F32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Mul", ["m", "c"], ["p"], name="mul"),
             helper.make_node("Add", ["p", "s"], ["y"], name="add")]
    before, after = folded(make_model(nodes, {"x": [1, 2, 6, 6]}, ["y"], inits), ["Conv"])
    assert after.nodes[0].origin == ("conv", "mul", "add")


def test_conv_bn_mul_add_chain_folds_whole(rng):
    inits = {"w": rng.standard_normal((3, 2, 1, 1)).astype(F32), **bn_params(rng, 3),
             "m": rng.uniform(0.5, 2, (3, 1, 1)).astype(F32), "s": np.float32(0.25)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn_node("c", "n"),
             helper.make_node("Mul", ["n", "m"], ["p"], name="mul"),
             helper.make_node("Add", ["p", "s"], ["y"], name="add")]
    model = make_model(nodes, {"x": [2, 2, 4, 4]}, ["y"], inits)
    before, after = folded(model, ["Conv"])
    assert fold_scales.run(before.copy(), default_registry()) == 3


def test_matmul_mul_per_column(rng):
    inits = {"b": rng.standard_normal((4, 5)).astype(F32), "m": rng.standard_normal(5).astype(F32)}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"], name="matmul"),
             helper.make_node("Mul", ["p", "m"], ["y"], name="mul")]
    folded(make_model(nodes, {"a": [2, 3, 4]}, ["y"], inits), ["MatMul"])


@pytest.mark.parametrize("op, constant_first", [("Sub", True), ("Sub", False), ("Div", False)])
def test_conv_sub_div(rng, op, constant_first):
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32), "b": rng.standard_normal(3).astype(F32),
             "k": rng.uniform(0.5, 2, (3, 1, 1)).astype(F32)}
    operands = ["k", "c"] if constant_first else ["c", "k"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node(op, operands, ["y"], name=op.lower())]
    folded(make_model(nodes, {"x": [1, 2, 5, 5]}, ["y"], inits), ["Conv"])


def test_bn_output_is_graph_output_and_read(rng):
    """The BN output is a graph output also read by a Relu: the Conv takes over its name."""
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32), **bn_params(rng, 3)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn_node("c", "y"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    before, after = folded(make_model(nodes, {"x": [1, 2, 5, 5]}, ["y", "z"], inits), ["Conv", "Relu"])
    assert after.nodes[0].outputs == ("y",) and after.nodes[1].inputs == ("y",)


# ---------------------------------------------------------------------- the pass, negative


def test_spatially_varying_mul_does_not_fold(rng):
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32), "m": rng.standard_normal((1, 3, 3, 3)).astype(F32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Mul", ["c", "m"], ["y"], name="mul")]
    unchanged(make_model(nodes, {"x": [1, 2, 5, 5]}, ["y"], inits))


def test_anchor_output_with_two_readers_does_not_fold(rng):
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32), **bn_params(rng, 3)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn_node("c", "y"),
             helper.make_node("Relu", ["c"], ["z"], name="relu")]
    unchanged(make_model(nodes, {"x": [1, 2, 5, 5]}, ["y", "z"], inits))


def test_matmul_add_does_not_fold(rng):
    inits = {"b": rng.standard_normal((4, 5)).astype(F32), "s": rng.standard_normal(5).astype(F32)}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"], name="matmul"),
             helper.make_node("Add", ["p", "s"], ["y"], name="add")]
    unchanged(make_model(nodes, {"a": [3, 4]}, ["y"], inits))


def test_bn_with_runtime_mean_does_not_fold(rng):
    inits = {"w": rng.standard_normal((3, 2, 3, 3)).astype(F32), **bn_params(rng, 3)}
    del inits["bn_mean"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn_node("c", "y")]
    unchanged(make_model(nodes, {"x": [1, 2, 5, 5], "bn_mean": [3]}, ["y"], inits))


# ---------------------------------------------------------------------- the hooks


def node(registry, op_type, n_inputs, **attrs):
    op = registry.find_op("", op_type, 17)
    full = {a.name: a.default for a in op.attributes}
    full.update(attrs)
    return op, Node(op_type.lower(), op_type, "", tuple(f"i{k}" for k in range(n_inputs)), ("out",), full, 17)


def const(array):
    return TensorInfo.of(np.asarray(array))


def var(shape, dtype=F32):
    return TensorInfo(np.dtype(dtype), tuple(shape))


def test_batchnorm_as_scale(registry, rng):
    params = bn_params(rng, 3)
    gamma, beta, mean, variance = (params[f"bn_{p}"] for p in ("gamma", "beta", "mean", "var"))
    op, bn = node(registry, "BatchNormalization", 5, epsilon=1e-3)
    infos = [var((2, 3, 4, 4)), *(const(p) for p in (gamma, beta, mean, variance))]
    scale = op.as_scale(bn, infos)
    want = gamma.astype(np.float64) / np.sqrt(variance.astype(np.float64) + 1e-3)
    assert scale.input == 0 and scale.scale.shape == (3, 1, 1) and scale.scale.dtype == np.float64
    np.testing.assert_allclose(scale.scale.reshape(-1), want, rtol=1e-12)
    np.testing.assert_allclose(scale.shift.reshape(-1), beta - mean.astype(np.float64) * want, rtol=1e-12)
    assert op.as_scale(bn, infos[:3] + [var((3,))] + infos[4:]) is None  # runtime mean
    assert op.as_scale(node(registry, "BatchNormalization", 5, training_mode=1)[1], infos) is None


def test_elementwise_as_scale(registry):
    c = np.array([[1.0], [2.0], [4.0]], F32)
    x, k = var((2, 3, 5)), const(c)
    mul, add, sub, div = (node(registry, op, 2) for op in ("Mul", "Add", "Sub", "Div"))

    def check(op_node, infos, index, scale, shift):
        got = op_node[0].as_scale(op_node[1], infos)
        assert got.input == index
        np.testing.assert_array_equal(np.broadcast_to(got.scale, (3, 1)), np.broadcast_to(scale, (3, 1)))
        np.testing.assert_array_equal(np.broadcast_to(got.shift, (3, 1)), np.broadcast_to(shift, (3, 1)))

    check(mul, [x, k], 0, c, 0.0)
    check(mul, [k, x], 1, c, 0.0)
    check(add, [k, x], 1, 1.0, c)
    check(sub, [x, k], 0, 1.0, -c)
    check(sub, [k, x], 1, -1.0, c)
    check(div, [x, k], 0, 1.0 / c.astype(np.float64), 0.0)
    assert div[0].as_scale(div[1], [k, x]) is None  # the constant is the dividend
    assert div[0].as_scale(div[1], [x, const(np.zeros((3, 1), F32))]) is None
    assert mul[0].as_scale(mul[1], [var((3, 5)), const(np.ones((2, 3, 5), F32))]) is None  # enlarges x
    assert mul[0].as_scale(mul[1], [var((3,), np.int32), const(np.ones(3, np.int32))]) is None
    assert mul[0].as_scale(mul[1], [x, var((3, 1))]) is None


def test_vector_along():
    np.testing.assert_array_equal(vector_along(np.arange(3.0).reshape(3, 1, 1), (2, 3, 4, 4), 1), [0, 1, 2])
    np.testing.assert_array_equal(vector_along(np.float64(2), (2, 3, 4), 1), [2, 2, 2])
    np.testing.assert_array_equal(vector_along(np.ones((1, 3, 4)), (2, 3, 4), 1), [1, 1, 1])  # constant along 2
    assert vector_along(np.arange(4.0), (2, 3, 4), 1) is None  # varies along axis 2
    assert vector_along(np.ones((2, 2, 3, 4)), (2, 3, 4), 1) is None  # would enlarge
    assert vector_along(np.ones(3), ("n", 3), 0) is None  # symbolic channel axis


def test_conv_fold_scale(registry, rng):
    w, b = rng.standard_normal((4, 1, 3, 3)).astype(F32), rng.standard_normal(4).astype(F32)
    s, t = rng.standard_normal((4, 1, 1)), rng.standard_normal((4, 1, 1))
    op, conv = node(registry, "Conv", 3, group=2)
    output = var((1, 4, 5, 5))
    got = op.fold_scale(conv, [var((1, 2, 7, 7)), const(w), const(b)], output, s, t)
    np.testing.assert_allclose(got[1], (w * s.reshape(4, 1, 1, 1)).astype(F32), rtol=1e-6)
    np.testing.assert_allclose(got[2], (b * s.reshape(-1) + t.reshape(-1)).astype(F32), rtol=1e-6)
    assert got[1].dtype == F32 and got[2].dtype == F32
    no_bias = op.fold_scale(conv, [var((1, 2, 7, 7)), const(w)], output, s, t)
    np.testing.assert_allclose(no_bias[2], t.reshape(-1).astype(F32), rtol=1e-6)
    assert op.fold_scale(conv, [var((1, 2, 7, 7)), var(w.shape)], output, s, t) is None
    assert op.fold_scale(conv, [var((1, 2, 7, 7)), const(w)], output, rng.standard_normal((4, 5, 1)), t) is None  # varies along H


def test_conv_transpose_fold_scale(registry, rng):
    group, c, mg = 2, 4, 3
    w = rng.standard_normal((c, mg, 2, 2)).astype(F32)
    s, t = rng.standard_normal(group * mg), rng.standard_normal(group * mg)
    op, convt = node(registry, "ConvTranspose", 2, group=group)
    got = op.fold_scale(convt, [var((1, c, 3, 3)), const(w)], var((1, group * mg, 4, 4)),
                        s.reshape(-1, 1, 1), t.reshape(-1, 1, 1))
    want = w.astype(np.float64).copy()
    for g in range(group):
        for j in range(mg):
            want[g * (c // group):(g + 1) * (c // group), j] *= s[g * mg + j]
    np.testing.assert_allclose(got[1], want.astype(F32), rtol=1e-6)
    np.testing.assert_allclose(got[2], t.astype(F32), rtol=1e-6)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_fold_scale(registry, rng, trans_b):
    b = rng.standard_normal((5, 4) if trans_b else (4, 5)).astype(F32)
    c = rng.standard_normal((3, 1)).astype(F32)
    s, t = rng.standard_normal(5), rng.standard_normal(5)
    op, gemm = node(registry, "Gemm", 3, transB=trans_b, beta=2.0)
    a, output = var((3, 4)), var((3, 5))
    got = op.fold_scale(gemm, [a, const(b), const(c)], output, s, t)
    want_b = b * (s[:, None] if trans_b else s)
    np.testing.assert_allclose(got[1], want_b.astype(F32), rtol=1e-6)
    np.testing.assert_allclose(got[2], (c * s + t / 2.0).astype(F32), rtol=1e-6)
    assert got[2].shape == (3, 5)
    absent = op.fold_scale(gemm, [a, const(b)], output, s, t)
    np.testing.assert_allclose(absent[2], (t / 2.0).astype(F32), rtol=1e-6)
    assert 2 not in op.fold_scale(gemm, [a, const(b)], output, s, np.zeros(()))
    zero_beta = node(registry, "Gemm", 3, transB=trans_b, beta=0.0)[1]
    assert op.fold_scale(zero_beta, [a, const(b)], output, s, t) is None
    assert op.fold_scale(gemm, [a, const(b)], output, np.ones((3, 1)) * s, t) is not None  # constant along rows
    assert op.fold_scale(gemm, [a, const(b)], output, rng.standard_normal((3, 5)), t) is None


def test_matmul_fold_scale(registry, rng):
    b, s = rng.standard_normal((4, 5)).astype(F32), rng.standard_normal(5)
    op, matmul = node(registry, "MatMul", 2)
    a, output = var((2, 3, 4)), var((2, 3, 5))
    got = op.fold_scale(matmul, [a, const(b)], output, s, np.zeros(()))
    np.testing.assert_allclose(got[1], (b * s).astype(F32), rtol=1e-6)
    assert set(got) == {1}
    assert op.fold_scale(matmul, [a, const(b)], output, s, np.ones(5)) is None  # no bias for a shift
    assert op.fold_scale(matmul, [a, var((4, 5))], output, s, np.zeros(())) is None
    batched = const(np.ones((2, 4, 5), F32))
    assert op.fold_scale(matmul, [a, batched], output, s, np.zeros(())) is None
