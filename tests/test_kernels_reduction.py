"""CUDA tactics of the reductions and the softmax family against their NumPy references
(simulator without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.errors import UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, single_node_model
from plugrt_builtin_ops.reduction import reduce
from plugrt_builtin_ops.reduction.reduce import AxesView

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: dict(rtol=3e-3, atol=3e-3), F32: dict(rtol=2e-5, atol=1e-5), F64: dict(rtol=1e-12, atol=1e-12)}
REDUCE_OPS = ["ReduceSum", "ReduceSumSquare", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin",
              "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"]


def data(rng, op, shape, dtype=F32):
    """Random data in the op's domain: positive for ReduceLogSum, near 1 for ReduceProd."""
    if op == "ReduceLogSum":
        x = rng.uniform(0.5, 2.0, shape)
    elif op == "ReduceProd":
        x = rng.uniform(0.6, 1.5, shape) * rng.choice([-1, 1], shape)
    else:
        x = rng.standard_normal(shape) * 2
    return np.asarray(x).astype(dtype)


def integers(rng, shape, dtype, low=-9, high=10):
    if np.dtype(dtype).kind == "u":
        low = 0
    return rng.integers(low, high, shape).astype(dtype)


def reduce_case(op, x, axes=None, keepdims=1, noop=0, as_input=False, **tol):
    """check_node for a Reduce* node, axes as an attribute (opset 17/12) or a constant input (18)."""
    attrs = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = noop
    feeds = {"x": x}
    if as_input:
        opset = 18
        if axes is not None:
            feeds["axes"] = np.asarray(axes, np.int64)
    else:
        opset = 12 if op == "ReduceSum" else 17
        if axes is not None:
            attrs["axes"] = list(axes)
    return check_node(op, feeds, attrs, constants={"axes"}, opset=opset, **tol)


def graph_tactics(op, feeds, attrs, constants=(), opset=17):
    registry = default_registry()
    graph = import_model(single_node_model(op, feeds, attrs, constants, "", opset), registry=registry)
    return node_tactics(graph, registry)


# --------------------------------------------------------------------------- axes view


def test_axes_view_merges_neighbouring_axes():
    view = AxesView((2, 3, 4, 5), (1, 2))
    assert view.merged == ([[2, 60], [5, 1]], [[12, 5]])
    assert (view.n_out, view.n_red, view.innermost_reduced) == (10, 12, False)
    view = AxesView((2, 1, 3, 4), (0, 1, 3))
    assert view.merged == ([[3, 4]], [[2, 12], [4, 1]]) and view.innermost_reduced
    assert AxesView((), ()).merged == ([], []) and AxesView((), ()).n_out == 1


def test_equal_nodes_share_kernels():
    a = reduce.reduce_block_kernel("ReduceSum", "float32", 4, 2)
    assert a is reduce.reduce_block_kernel("ReduceSum", "float32", 4, 2)


def test_both_tactics_offered_in_heuristic_order():
    x = np.ones((2, 64), F32)
    assert [t.name for t in graph_tactics("ReduceSum", {"x": x}, {"axes": [1]}, opset=12)] == ["block32x2", "thread"]
    assert [t.name for t in graph_tactics("ReduceSum", {"x": x}, {"axes": [0]}, opset=12)] == ["thread", "block32x8"]


# --------------------------------------------------------------------------- Reduce*


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape, axes, keepdims, as_input", [
    ((2, 3, 5), [1], 1, False),
    ((3, 4, 5), [0, 2], 0, False),
    ((2, 3, 4), [-1, -3], 1, True),
    ((3, 7), None, 0, False),
])
def test_reduce_float32_axes(rng, op, shape, axes, keepdims, as_input):
    reduce_case(op, data(rng, op, shape), axes, keepdims, as_input=as_input, **TOL[F32])


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(rng, op):
    reduce_case(op, data(rng, op, (2, 3)), None, 1, noop=1, as_input=True, **TOL[F32])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("dtype", [F16, F64])
def test_reduce_float16_float64(rng, op, dtype):
    reduce_case(op, data(rng, op, (3, 2, 5), dtype), [0, -1], 0, **TOL[dtype])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1",
                                "ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_reduce_integers(rng, op, dtype):
    low, high = (-3, 4) if op == "ReduceProd" else (-9, 10)
    reduce_case(op, integers(rng, (2, 3, 3), dtype, low, high), [1, 2], 1)


def test_reduce_mean_int_truncates_toward_zero():
    x = np.array([[-3, -4, 2], [5, 1, 1]], np.int32)  # means -5/3 and 7/3
    out = reduce_case("ReduceMean", x, [1], 0)[0]
    np.testing.assert_array_equal(out, [-1, 2])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_])
def test_reduce_max_min_small_types(rng, op, dtype):
    x = rng.integers(0, 2, (3, 5)).astype(dtype) if dtype == np.bool_ else integers(rng, (3, 5), dtype, -100, 100)
    reduce_case(op, x, [1], 0)
    reduce_case(op, x, [0], 1)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_propagate_nan(op):
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -1.0]], F32)
    out = reduce_case(op, x, [1], 0)[0]
    assert np.isnan(out[0]) and not np.isnan(out[1])


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_over_empty_axis(rng, op):
    reduce_case(op, np.zeros((3, 0, 2), F32), [1], 1, **TOL[F32])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_reduce_max_min_empty_integers(op, dtype):
    reduce_case(op, np.zeros((2, 0), dtype), [1], 0)


def test_reduce_empty_output_and_rank0(rng):
    reduce_case("ReduceSum", np.zeros((0, 3), F32), [1], 0)
    reduce_case("ReduceMean", np.asarray(rng.standard_normal(), F32), None, 0, **TOL[F32])
    reduce_case("ReduceLogSumExp", np.asarray(1.5, F64), None, 1, **TOL[F64])


def test_reduce_many_outputs_long_rows(rng):
    reduce_case("ReduceSum", data(rng, "ReduceSum", (3, 41)), [1], 1, **TOL[F32])
    reduce_case("ReduceMax", data(rng, "ReduceMax", (17, 3)), [1], 0)
    reduce_case("ReduceLogSumExp", data(rng, "ReduceLogSumExp", (2, 9, 3)), [0, 2], 0, **TOL[F32])


def test_reduce_runtime_axes_unsupported(rng):
    feeds = {"x": data(rng, "ReduceSum", (2, 3)), "axes": np.array([1], np.int64)}
    with pytest.raises(UnsupportedError, match="axes"):
        graph_tactics("ReduceSum", feeds, {"keepdims": 1}, opset=13)


# --------------------------------------------------------------------------- ArgMax, ArgMin


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(1, 1, 0), (-1, 0, 1), (0, 0, 0), (-3, 1, 1)])
def test_arg_ties_and_axes(rng, op, axis, keepdims, last):
    x = rng.integers(0, 3, (3, 4, 5)).astype(F32)  # many ties
    check_node(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last})


@pytest.mark.parametrize("dtype", [F16, F64, np.int8, np.uint8, np.int32, np.uint64])
def test_arg_dtypes(rng, dtype):
    x = integers(rng, (4, 7), dtype, -5, 6) if np.dtype(dtype).kind in "iu" else rng.standard_normal((4, 7)).astype(dtype)
    check_node("ArgMax", {"x": x}, {"axis": 1, "select_last_index": 1})
    check_node("ArgMin", {"x": x}, {"axis": 0, "keepdims": 0})


@pytest.mark.parametrize("last", [0, 1])
def test_arg_nan_counts_as_extremum(last):
    x = np.array([[1.0, np.nan, 7.0, np.nan], [2.0, 9.0, 9.0, -1.0]], F32)
    check_node("ArgMax", {"x": x}, {"axis": 1, "select_last_index": last})
    check_node("ArgMin", {"x": x}, {"axis": 1, "select_last_index": last})


def test_arg_long_axis(rng):
    check_node("ArgMax", {"x": rng.standard_normal((2, 37)).astype(F32)}, {"axis": 1})


# --------------------------------------------------------------------------- Softmax, LogSoftmax, Hardmax


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("shape, axis, opset", [
    ((3, 7), -1, 13), ((2, 3, 4), 1, 13), ((2, 3, 4), 0, 13), ((5,), 0, 13),
    ((2, 3, 4), 1, 11), ((2, 3, 2), 0, 11), ((2, 3), 2, 11),
])
def test_softmax_family_axes(rng, op, shape, axis, opset):
    x = rng.standard_normal(shape).astype(F32) * 3
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    check_node(op, {"x": x}, {"axis": axis}, opset=opset, **TOL[F32])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("dtype", [F16, F64])
def test_softmax_family_dtypes(rng, op, dtype):
    x = (rng.standard_normal((3, 6)) * 3).astype(dtype)
    tol = dict(rtol=1e-2, atol=2e-3) if dtype == F16 else TOL[dtype]
    check_node(op, {"x": x}, {"axis": -1}, opset=13, **tol)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "ReduceLogSumExp"])
def test_exp_family_non_finite_rows(op):
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0], [np.nan, 0.0, 1.0], [-np.inf, 0.0, 1e4]], F32)
    if op == "ReduceLogSumExp":
        reduce_case(op, x, [1], 0, **TOL[F32])
    else:
        check_node(op, {"x": x}, {"axis": 1}, opset=13, **TOL[F32])


def test_softmax_long_rows_and_empty(rng):
    check_node("Softmax", {"x": rng.standard_normal((3, 45)).astype(F32) * 4}, {"axis": -1}, opset=13, **TOL[F32])
    check_node("LogSoftmax", {"x": np.zeros((0, 4), F32)}, {"axis": -1}, opset=13)
    check_node("Softmax", {"x": np.zeros((2, 0), F32)}, {"axis": -1}, opset=13)
