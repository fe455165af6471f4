"""The scatter ops (ScatterElements, Scatter, ScatterND): their references against ONNX's
own reference implementations, every CUDA tactic against the reference (simulator without
a GPU) on odd shapes, every dtype and reduction, the errors, the conformance kit, and the
kernels typed for a real GPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from plugrt.errors import ModelError, ShapeError, UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_node, check_plugin
from plugrt.testing.nodes import node_tactics, run_tactic, single_node_model

REDUCTIONS = ["none", "add", "mul", "max", "min"]
TOL = {np.float16: {"rtol": 1e-3, "atol": 1e-3}}


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(1, 4, shape).astype(dtype)  # small: products stay small


def _element_indices(rng, idx_shape, axis, dim, distinct, dtype=np.int64):
    """ScatterElements indices into ``dim``, half negative; ``distinct``: none repeats along
    ``axis`` (no two updates meet)."""
    if distinct:
        lines = np.moveaxis(np.empty(idx_shape), axis, -1).shape
        picks = np.stack([rng.permutation(dim)[:lines[-1]] for _ in np.ndindex(lines[:-1])]).reshape(lines)
        idx = np.moveaxis(picks, -1, axis)
    else:
        idx = rng.integers(0, dim, idx_shape)
    return np.where(rng.random(idx_shape) < 0.5, idx - dim, idx).astype(dtype)


def _index_tuples(rng, idx_shape, data_shape, distinct):
    """ScatterND index tuples (the last dim of ``idx_shape``) into ``data_shape``, some negative."""
    dims = tuple(data_shape[:idx_shape[-1]])
    count, size = int(np.prod(idx_shape[:-1])), int(np.prod(dims))
    flat = rng.permutation(size)[:count] if distinct else rng.integers(0, size, count)
    tuples = np.stack(np.unravel_index(flat, dims), axis=-1).reshape(idx_shape)
    return np.where(rng.random(idx_shape) < 0.5, tuples - np.array(dims, np.int64), tuples).astype(np.int64)


def _opset(reduction):
    return 18 if reduction in ("max", "min") else 16


def _reference(registry, op_type, feeds, attrs, opset):
    graph = import_model(single_node_model(op_type, feeds, attrs, opset=opset), registry=registry)
    return graph, ReferenceExecutor(graph, registry).run(feeds)[graph.outputs[0]]


def _onnx_reference(op_type, feeds, attrs, opset=18):
    """ONNX's own reference implementation of the one-node model."""
    return ReferenceEvaluator(single_node_model(op_type, feeds, attrs, opset=opset)).run(None, feeds)[0]


# ---------------------------------------------------------------------- ScatterElements

#: (data shape, indices shape, axis): 1-D to 3-D, odd sizes, indices smaller than the data.
ELEMENT_CASES = [
    ((7,), (5,), 0),
    ((3, 5), (2, 3), 1),
    ((4, 3), (5, 3), 0),     # more updates than the axis: duplicates certain
    ((2, 3, 5), (2, 2, 3), -2),
    ((3, 1, 4), (2, 1, 3), 0),
]


def _elements_feeds(rng, data_shape, idx_shape, axis, reduction, dtype=np.float32, index_dtype=np.int64):
    distinct = reduction == "none"
    if distinct and idx_shape[axis] > data_shape[axis]:
        idx_shape = idx_shape[:axis % len(idx_shape)] + (data_shape[axis],) + idx_shape[axis % len(idx_shape) + 1:]
    return {"data": _values(rng, data_shape, dtype),
            "indices": _element_indices(rng, idx_shape, axis, data_shape[axis], distinct, index_dtype),
            "updates": _values(rng, idx_shape, dtype)}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape, idx_shape, axis", ELEMENT_CASES)
def test_scatter_elements_reference_is_onnx(registry, rng, data_shape, idx_shape, axis, reduction):
    feeds = _elements_feeds(rng, data_shape, idx_shape, axis, reduction, np.float64)
    _, got = _reference(registry, "ScatterElements", feeds, {"axis": axis, "reduction": reduction}, 18)
    want = _onnx_reference("ScatterElements", feeds, {"axis": axis, "reduction": reduction})
    np.testing.assert_array_equal(got, want)


def test_scatter_elements_last_duplicate_wins(registry):
    feeds = {"data": np.zeros((2, 3), np.float32), "indices": np.array([[1, 1, -2]], np.int64),
             "updates": np.array([[1, 2, 3]], np.float32)}
    _, got = _reference(registry, "ScatterElements", feeds, {"axis": 1}, 18)
    np.testing.assert_array_equal(got, [[0, 3, 0], [0, 0, 0]])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape, idx_shape, axis", ELEMENT_CASES)
def test_scatter_elements_tactics(registry, rng, data_shape, idx_shape, axis, reduction):
    feeds = _elements_feeds(rng, data_shape, idx_shape, axis, reduction)
    check_node("ScatterElements", feeds, {"axis": axis, "reduction": reduction}, opset=_opset(reduction),
               registry=registry)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.uint32,
                                   np.int64, np.uint64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements_dtypes(registry, rng, dtype, reduction):
    feeds = _elements_feeds(rng, (3, 4), (5, 3), 0, reduction, dtype, np.int32)
    check_node("ScatterElements", feeds, {"reduction": reduction}, opset=_opset(reduction), registry=registry,
               **TOL.get(dtype, {}))


def test_scatter_elements_bool(registry, rng):
    feeds = _elements_feeds(rng, (4, 5), (3, 4), 1, "none", np.bool_)
    check_node("ScatterElements", feeds, {"axis": 1}, registry=registry)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_elements_max_min_propagate_nan(registry, dtype, reduction):
    feeds = {"data": np.array([np.nan, 1, 2, 3], dtype), "indices": np.array([0, 1, 1, 3, 2], np.int64),
             "updates": np.array([5, np.nan, 4, 0, 1], dtype)}
    want = check_node("ScatterElements", feeds, {"reduction": reduction}, opset=18, registry=registry)[0]
    assert np.isnan(want[0]) and np.isnan(want[1])


def test_scatter_elements_tactic_kinds(registry, rng):
    """Atomics where Numba has them; the in-order kernel for mul and the other dtypes."""
    def tactic_names(reduction, dtype):
        feeds = _elements_feeds(rng, (3, 4), (2, 4), 0, reduction, dtype)
        graph = import_model(single_node_model("ScatterElements", feeds, {"reduction": reduction}, opset=18),
                             registry=registry)
        return [t.name for t in node_tactics(graph, registry)]

    assert tactic_names("none", np.float16) == ["scatter_elements"]
    assert tactic_names("add", np.float32) == ["scatter_elements"]
    assert tactic_names("max", np.int64) == ["scatter_elements"]
    assert tactic_names("mul", np.float32) == ["scatter_elements_lines"]
    assert tactic_names("add", np.float16) == ["scatter_elements_lines"]
    assert tactic_names("min", np.int8) == ["scatter_elements_lines"]


def test_scatter_elements_opset_11_and_13(registry, rng):
    feeds = _elements_feeds(rng, (3, 5), (2, 3), 1, "none")
    for opset in (11, 13):
        check_node("ScatterElements", feeds, {"axis": 1}, opset=opset, registry=registry)


def test_scatter_opset_10(registry, rng):
    feeds = _elements_feeds(rng, (3, 5), (2, 3), 1, "none")
    check_node("Scatter", feeds, {"axis": 1}, opset=10, registry=registry)
    _, got = _reference(registry, "Scatter", feeds, {"axis": -1}, 9)
    np.testing.assert_array_equal(got, _onnx_reference("ScatterElements", feeds, {"axis": -1}))  # ONNX has no Scatter


# ---------------------------------------------------------------------- ScatterND

#: (data shape, indices shape): slices and single elements, 1-D to 3-D, odd sizes.
ND_CASES = [
    ((7,), (4, 1)),
    ((5, 3), (3, 1)),          # rows
    ((3, 5), (2, 3, 2)),       # elements, 3-D indices
    ((4, 3, 5), (2, 1)),       # 3-D slices
    ((2, 3, 5), (3, 2)),       # rows of a 3-D tensor
    ((2, 3, 4), (5, 3)),       # elements of a 3-D tensor
    ((3, 4), (2,)),            # one index tuple (indices of rank 1)
]


def _nd_feeds(rng, data_shape, idx_shape, reduction, dtype=np.float32):
    indices = _index_tuples(rng, idx_shape, data_shape, distinct=reduction == "none")
    updates_shape = tuple(idx_shape[:-1]) + tuple(data_shape[idx_shape[-1]:])
    return {"data": _values(rng, data_shape, dtype), "indices": indices,
            "updates": _values(rng, updates_shape, dtype)}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape, idx_shape", ND_CASES)
def test_scatter_nd_reference_is_onnx(registry, rng, data_shape, idx_shape, reduction):
    feeds = _nd_feeds(rng, data_shape, idx_shape, reduction, np.float64)
    _, got = _reference(registry, "ScatterND", feeds, {"reduction": reduction}, 18)
    want = _onnx_reference("ScatterND", feeds, {"reduction": reduction})
    np.testing.assert_array_equal(got, want)


def test_scatter_nd_last_duplicate_wins(registry):
    feeds = {"data": np.zeros((3, 2), np.float32), "indices": np.array([[1], [-2], [0]], np.int64),
             "updates": np.array([[1, 2], [3, 4], [5, 6]], np.float32)}
    _, got = _reference(registry, "ScatterND", feeds, {}, 18)
    np.testing.assert_array_equal(got, [[5, 6], [3, 4], [0, 0]])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape, idx_shape", ND_CASES)
def test_scatter_nd_tactics(registry, rng, data_shape, idx_shape, reduction):
    feeds = _nd_feeds(rng, data_shape, idx_shape, reduction)
    check_node("ScatterND", feeds, {"reduction": reduction}, opset=_opset(reduction), registry=registry)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.uint32,
                                   np.int64, np.uint64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_nd_dtypes(registry, rng, dtype, reduction):
    feeds = _nd_feeds(rng, (4, 3), (3, 1), reduction, dtype)
    check_node("ScatterND", feeds, {"reduction": reduction}, opset=_opset(reduction), registry=registry,
               **TOL.get(dtype, {}))


def test_scatter_nd_bool(registry, rng):
    feeds = _nd_feeds(rng, (3, 4), (2, 2), "none", np.bool_)
    check_node("ScatterND", feeds, registry=registry, opset=11)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_nd_max_min_propagate_nan(registry, dtype, reduction):
    feeds = {"data": np.array([[np.nan, 1], [2, 3]], dtype), "indices": np.array([[0], [1], [1]], np.int64),
             "updates": np.array([[5, np.nan], [4, 0], [1, 7]], dtype)}
    want = check_node("ScatterND", feeds, {"reduction": reduction}, opset=18, registry=registry)[0]
    assert np.isnan(want[0, 0]) and np.isnan(want[0, 1])


# ---------------------------------------------------------------------- errors and edges


def test_out_of_range_indices_raise_in_the_reference_and_are_skipped_by_the_kernels(registry):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    cases = [("ScatterElements", {"axis": 1}, np.array([[0, 3]], np.int64), np.array([[10, 11]], np.float32)),
             ("ScatterElements", {"axis": 1}, np.array([[-4, 2]], np.int32), np.array([[10, 11]], np.float32)),
             ("ScatterND", {}, np.array([[0, 1], [2, 0]], np.int64), np.array([10, 11], np.float32))]
    for op_type, attrs, indices, updates in cases:
        feeds = {"data": data, "indices": indices, "updates": updates}
        with pytest.raises(ModelError, match="out of range"):
            _reference(registry, op_type, feeds, attrs, 18)
        graph = import_model(single_node_model(op_type, feeds, attrs, opset=18), registry=registry)
        for tactic in node_tactics(graph, registry):
            (got,) = run_tactic(graph, tactic, feeds)
            assert np.count_nonzero(got != data) == 1, f"{op_type} {tactic.name}: {got}"


def test_reductions_refused_where_onnx_refuses_them(registry, rng):
    feeds = _elements_feeds(rng, (3, 5), (2, 3), 1, "add")
    with pytest.raises(ModelError, match="opset 16"):
        _reference(registry, "ScatterElements", feeds, {"axis": 1, "reduction": "max"}, 17)
    with pytest.raises(ModelError, match="'sum'"):
        _reference(registry, "ScatterElements", feeds, {"axis": 1, "reduction": "sum"}, 18)
    for opset in (11, 13):
        with pytest.raises(ModelError, match="reduction"):
            _reference(registry, "ScatterElements", feeds, {"axis": 1, "reduction": "add"}, opset)
        with pytest.raises(ModelError, match="reduction"):
            _reference(registry, "ScatterND", _nd_feeds(rng, (4, 3), (3, 1), "add"), {"reduction": "mul"}, opset)
    feeds = _elements_feeds(rng, (3, 5), (2, 3), 1, "add", np.bool_)
    with pytest.raises(UnsupportedError, match="bool"):
        _reference(registry, "ScatterElements", feeds, {"axis": 1, "reduction": "add"}, 18)


def test_shape_errors(registry, rng):
    def refused(op_type, feeds, attrs=None, error=ShapeError):
        with pytest.raises(error):
            _reference(registry, op_type, feeds, attrs or {}, 18)

    f32, i64 = np.float32, np.int64
    refused("ScatterElements", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 4), i64),
                                "updates": np.zeros((2, 3), f32)})                       # indices != updates
    refused("ScatterElements", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 5), i64),
                                "updates": np.zeros((2, 5), f32)})                       # beyond the data
    refused("ScatterElements", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2,), i64),
                                "updates": np.zeros((2,), f32)})                         # ranks differ
    refused("ScatterElements", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 4), i64),
                                "updates": np.zeros((2, 4), f32)}, {"axis": 2})          # no such axis
    refused("ScatterElements", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 4), i64),
                                "updates": np.zeros((2, 4), np.float64)}, error=ModelError)
    refused("ScatterND", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 3), i64),
                          "updates": np.zeros((2,), f32)})                                # k > rank
    refused("ScatterND", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 1), i64),
                          "updates": np.zeros((2, 3), f32)})                              # wrong slice
    refused("ScatterND", {"data": np.zeros((3, 4), f32), "indices": np.zeros((2, 1), np.int32),
                          "updates": np.zeros((2, 4), f32)}, error=UnsupportedError)      # int64 only


def test_empty_updates_copy_the_data(registry, rng):
    feeds = {"data": _values(rng, (3, 4), np.float32), "indices": np.zeros((0, 4), np.int64),
             "updates": np.zeros((0, 4), np.float32)}
    (want,) = check_node("ScatterElements", feeds, {"reduction": "mul"}, opset=18, registry=registry)
    np.testing.assert_array_equal(want, feeds["data"])
    feeds = {"data": feeds["data"], "indices": np.zeros((0, 1), np.int64), "updates": np.zeros((0, 4), np.float32)}
    (want,) = check_node("ScatterND", feeds, {"reduction": "add"}, opset=18, registry=registry)
    np.testing.assert_array_equal(want, feeds["data"])


def test_scatter_nd_with_constant_indices_and_updates(registry, rng):
    """Indices and updates known at build time (initializers) scatter into a runtime ``data``."""
    feeds = _nd_feeds(rng, (5, 3), (2, 1), "none")
    check_node("ScatterND", feeds, constants={"indices", "updates"}, opset=18, registry=registry)


# ---------------------------------------------------------------------- the conformance kit


@pytest.mark.parametrize("op_type", ["ScatterND", "ScatterElements", "Scatter"])
def test_scatter_ops_pass_the_conformance_kit(registry, op_type):
    report = check_plugin("builtin-shape", registry=registry, ops=[op_type])
    assert report.ops() == [op_type]
    assert len(report.results) >= 1 + 6  # claims, then the six checks of every example


# ---------------------------------------------------------------------- GPU typing


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.shape import scatter as sk
        G = arr(np.int64)
        for reduction in ("add", "mul", "max", "min"):
            for dt in ("float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                       "int64", "uint64"):
                f32 = dt in ("float16", "float32")
                if sk.per_update(reduction, dt):
                    elements, nd = sk.elements_kernel(reduction), sk.nd_kernel(reduction)
                    extra = []
                else:
                    elements = sk.elements_lines_kernel(reduction, np.dtype(dt).str)
                    nd = sk.nd_slices_kernel(reduction, np.dtype(dt).str)
                    extra = [I64, I64]
                for index in ("int32", "int64"):
                    check(f"ScatterElements {reduction} {dt} {index}", elements,
                          [arr(dt), arr(dt), arr(index), I64] + extra + [I64, G, G, I64, I64], f32)
                check(f"ScatterND {reduction} {dt}", nd, [arr(dt), arr(dt), arr("int64"), I64, I64, I64, G, G], f32)
        for bits in ("uint8", "uint16", "uint32", "uint64"):  # reduction "none" stores bits views
            for index in ("int32", "int64"):
                check(f"ScatterElements none {bits} {index}", sk.elements_kernel("none"),
                      [arr(bits), arr(bits), arr(index), I64, I64, G, G, I64, I64])
            check(f"ScatterND none {bits}", sk.nd_kernel("none"), [arr(bits), arr(bits), arr("int64"), I64, I64, I64, G, G])
    """)
    assert not failures, "\n".join(failures)
