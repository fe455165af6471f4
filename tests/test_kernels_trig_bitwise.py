"""The trigonometric and hyperbolic ops (Tan, Asin, ..., Atanh), Shrink, and the bitwise ops
(BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot): every CUDA tactic (in the simulator without
a GPU) against the NumPy reference on small random inputs inside each op's domain, every
float dtype, domain edges and special values, every integer type, broadcasting; and the
conformance kit on each op's examples."""

from __future__ import annotations

import numpy as np
import pytest

from onnx import TensorProto, helper

from plugrt.engine import Builder
from plugrt.fusion.op import FUSED_DOMAIN
from plugrt.passes import fuse_pointwise
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_node, check_pass, check_plugin

# The simulator computes on NumPy scalars, which warn where the GPU silently wraps or overflows.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLOATS = [np.float32, np.float16, np.float64]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
TOLERANCE = {np.float16: (2e-3, 2e-3), np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-14)}

# op -> (opset it arrived in, where its random inputs are drawn)
TRIG = {
    "Tan": (7, (-1.4, 1.4)),
    "Asin": (7, (-1.0, 1.0)),
    "Acos": (7, (-1.0, 1.0)),
    "Atan": (7, (-6.0, 6.0)),
    "Sinh": (9, (-5.0, 5.0)),
    "Cosh": (9, (-5.0, 5.0)),
    "Asinh": (9, (-6.0, 6.0)),
    "Acosh": (9, (1.0, 6.0)),
    "Atanh": (9, (-0.99, 0.99)),
}
BITWISE_BINARY = ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]


def _check(op, feeds, attrs=None, opset=17, dtype=np.float32):
    rtol, atol = TOLERANCE.get(np.dtype(dtype).type, (0, 0))
    return check_node(op, feeds, attrs, opset=opset, rtol=rtol, atol=atol)


def _ints(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


# ---------------------------------------------------------------------- trigonometric, hyperbolic


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(TRIG))
def test_trig_random(rng, op, dtype):
    since, (low, high) = TRIG[op]
    x = rng.uniform(low, high, (3, 7)).astype(dtype)
    for opset in (since, 17):
        _check(op, {"x": x}, opset=opset, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(TRIG))
def test_trig_domain_edges(op, dtype):
    """Outside the domain NaN, at Atanh's poles ±inf, Sinh/Cosh overflow to ±inf."""
    x = np.array([-2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 2.0, 100.0, -800.0, np.inf, -np.inf, np.nan], dtype)
    if op == "Tan":
        x = x[np.abs(x) != 100.0]  # tan(100) is ill-conditioned: the argument reduction differs
    _check(op, {"x": x}, dtype=dtype)


def test_trig_empty_and_scalar(rng):
    for op in TRIG:
        _check(op, {"x": np.zeros((0, 3), np.float32)})
        _check(op, {"x": np.array(0.5 if op != "Acosh" else 1.5, np.float32)})


# ---------------------------------------------------------------------- Shrink


@pytest.mark.parametrize("dtype", FLOATS)
def test_shrink_float(rng, dtype):
    x = (rng.standard_normal((4, 6)) * 2).astype(dtype)
    x[0, :3] = [0.5, -0.5, 0.0]  # on the thresholds: zero
    for attrs in ({}, {"lambd": 1.5}, {"bias": 1.5, "lambd": 1.5}, {"bias": -0.3, "lambd": 0.1}):
        _check("Shrink", {"x": x}, attrs, opset=9, dtype=dtype)


@pytest.mark.parametrize("dtype", INTS)
def test_shrink_int(rng, dtype):
    """Integers compare and shift in float64 and truncate back (results kept in range)."""
    low = 0 if np.dtype(dtype).kind == "u" else -60
    x = rng.integers(low, 60, (3, 5)).astype(dtype)
    _check("Shrink", {"x": x}, {}, dtype=dtype)
    x = np.where(x < 3, 3, x) if low == 0 else x
    _check("Shrink", {"x": x}, {"bias": 2.0, "lambd": 2.5}, dtype=dtype)
    _check("Shrink", {"x": x}, {"bias": 0.5, "lambd": 1.0}, dtype=dtype)  # truncates x - 0.5


# ---------------------------------------------------------------------- bitwise


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", BITWISE_BINARY)
def test_bitwise_binary(rng, op, dtype):
    _check(op, {"a": _ints(rng, (3, 4), dtype), "b": _ints(rng, (3, 4), dtype)}, opset=18)
    _check(op, {"a": _ints(rng, (2, 3, 4), dtype), "b": _ints(rng, (4,), dtype)}, opset=18)
    _check(op, {"a": _ints(rng, (3, 1), dtype), "b": _ints(rng, (1, 5), dtype)}, opset=18)


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_not(rng, dtype):
    info = np.iinfo(dtype)
    _check("BitwiseNot", {"x": _ints(rng, (3, 5), dtype)}, opset=18)
    _check("BitwiseNot", {"x": np.array([info.min, info.max, 0, 1], dtype)}, opset=18)


def test_bitwise_extremes():
    for dtype in INTS:
        info = np.iinfo(dtype)
        a = np.array([info.min, info.max, 0, info.max], dtype)
        b = np.array([info.max, info.min, info.max, 1], dtype)
        for op in BITWISE_BINARY:
            _check(op, {"a": a, "b": b}, opset=18)


def test_bitwise_rejects_floats():
    from plugrt.errors import PlugrtError

    with pytest.raises(PlugrtError):
        check_node("BitwiseAnd", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, opset=18)


# ---------------------------------------------------------------------- fusion


def _chain_model(ops, elem_type, opset=18):
    """x -> ops[0] -> ... -> y, each op given as (op_type, attributes)."""
    names = ["x"] + [f"v{k}" for k in range(len(ops) - 1)] + ["y"]
    nodes = [helper.make_node(op, [names[k]], [names[k + 1]], name=f"n{k}", **attrs)
             for k, (op, attrs) in enumerate(ops)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", elem_type, [3, 4])],
                              [helper.make_tensor_value_info("y", elem_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("ops, elem_type, x", [
    ([("Tanh", {}), ("Atanh", {}), ("Shrink", {"bias": 0.1, "lambd": 0.2}), ("Sinh", {}), ("Asinh", {}),
      ("Cos", {}), ("Acos", {}), ("Tan", {}), ("Atan", {}), ("Cosh", {}), ("Acosh", {})],
     TensorProto.FLOAT, np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)),
    ([("BitwiseNot", {}), ("Shrink", {"bias": 1.0, "lambd": 1.5}), ("BitwiseNot", {})],
     TensorProto.INT32, np.arange(-6, 6, dtype=np.int32).reshape(3, 4)),
])
def test_new_ops_fuse_into_one_pointwise_kernel(registry, ops, elem_type, x):
    """The ops chain into one fused node whose engine matches the unfused reference."""
    onnx_model = _chain_model(ops, elem_type)
    before, after = check_pass(onnx_model, fuse_pointwise.run, registry=registry, feeds={"x": x})
    assert len(before.nodes) == len(ops) and len(after.nodes) == 1
    assert after.nodes[0].domain == FUSED_DOMAIN
    want = ReferenceExecutor(before, registry).run({"x": x})["y"]
    got = Builder(registry).build_engine(onnx_model).create_execution_context().execute({"x": x})["y"]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- conformance kit


@pytest.mark.parametrize("op", sorted(TRIG) + ["Shrink"])
def test_activation_ops_pass_the_conformance_kit(registry, op):
    report = check_plugin("builtin-activation", registry=registry, ops=[op])
    assert report.ops() == [op]
    assert len(report.results) > 1 + 3  # claims, then every check of every example


@pytest.mark.parametrize("op", BITWISE_BINARY + ["BitwiseNot"])
def test_elementwise_ops_pass_the_conformance_kit(registry, op):
    report = check_plugin("builtin-elementwise", registry=registry, ops=[op])
    assert report.ops() == [op]
    assert len(report.results) > 1 + 5
