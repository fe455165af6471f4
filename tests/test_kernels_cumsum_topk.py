"""CumSum, CumProd and TopK (builtin-reduction): every CUDA tactic against the NumPy reference
(simulator without a GPU), the references against ONNX's own, what the plugins refuse,
their conformance examples, and their kernels compiled for a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from plugrt.errors import UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_node, check_plugin, node_tactics, single_node_model

F16, F32, F64 = np.float16, np.float32, np.float64
#: float16 CumSum: the reference rounds every partial sum to float16, the kernel adds in float32
F16_TOL = dict(rtol=1e-2, atol=1e-2)

#: (shape, axis): odd sizes, negative axes, the axis first, last, in the middle and of size 1.
SHAPES = [
    ((7,), 0),
    ((3, 5), 1),
    ((3, 5), -2),
    ((2, 3, 5), 1),
    ((2, 3, 5), -1),
    ((3, 1, 4, 2), 0),
    ((2, 4, 3, 1), -2),
    ((2, 1, 3), 1),
]


def _normal(rng, shape, dtype=F32):
    return (rng.standard_normal(shape) * 2).astype(dtype)


def _integers(rng, shape, dtype, low=-9, high=10):
    if np.dtype(dtype).kind == "u":
        low = 0
    return rng.integers(low, high, shape).astype(dtype)


def _references(registry, op_type, feeds, attrs, opset, n_outputs=1):
    """``(plugrt's reference, ONNX's reference)`` outputs of a one-node model, every input a
    runtime input (the references take any axis and K)."""
    model = single_node_model(op_type, feeds, attrs, opset=opset, n_outputs=n_outputs)
    graph = import_model(model, registry=registry)
    ours = ReferenceExecutor(graph, registry).run(dict(feeds))
    theirs = ReferenceEvaluator(model).run(None, dict(feeds))
    return [ours[name] for name in graph.outputs], theirs


def _tactics(registry, op_type, feeds, attrs, constants, opset=17, n_outputs=1):
    graph = import_model(single_node_model(op_type, feeds, attrs, constants, opset=opset, n_outputs=n_outputs),
                         registry=registry)
    return node_tactics(graph, registry)


# ---------------------------------------------------------------------- CumSum


def cumsum_case(x, axis, exclusive=0, reverse=0, opset=14, axis_dtype=np.int64, **tol):
    """check_node for CumSum, ``axis`` (an int, or a list for a 1-element axis) a constant."""
    return check_node("CumSum", {"x": x, "axis": np.array(axis, axis_dtype)},
                      {"exclusive": exclusive, "reverse": reverse}, constants={"axis"}, opset=opset, **tol)


@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_float32(rng, shape, axis, exclusive, reverse):
    cumsum_case(_normal(rng, shape), axis, exclusive, reverse)


@pytest.mark.parametrize("dtype", [F64, np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_other_dtypes(rng, dtype, exclusive, reverse):
    shape = (2, 5, 3)
    x = _normal(rng, shape, dtype) if np.dtype(dtype).kind == "f" else _integers(rng, shape, dtype)
    cumsum_case(x, 1, exclusive, reverse)
    cumsum_case(x, -1, exclusive, reverse)


@pytest.mark.parametrize("shape, axis", [((2, 3, 5), -1), ((5, 3), 0), ((2, 19), 1)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_float16(rng, shape, axis, exclusive, reverse):
    cumsum_case(_normal(rng, shape, F16), axis, exclusive, reverse, **F16_TOL)


@pytest.mark.parametrize("axis, axis_dtype, opset", [
    (1, np.int32, 11), (-1, np.int64, 11), ([1], np.int64, 14), ([-1], np.int32, 14),
])
def test_cumsum_axis_forms(rng, axis, axis_dtype, opset):
    """axis as a 0-D or 1-element int32/int64 tensor, at both opsets."""
    want = cumsum_case(_normal(rng, (3, 4)), axis, opset=opset, axis_dtype=axis_dtype)[0]
    assert want.shape == (3, 4)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_cumsum_integers_wrap(dtype):
    high = np.iinfo(dtype).max
    x = np.array([[high, 1, 5], [high - 1, high, 2]], dtype)
    want = cumsum_case(x, 1)[0]
    assert want[0, 1] == np.iinfo(dtype).min  # the sum wrapped, as np.cumsum in the dtype
    cumsum_case(x, 1, exclusive=1, reverse=1)


def test_cumsum_of_an_empty_axis(rng):
    assert cumsum_case(_normal(rng, (2, 0, 3)), 1, exclusive=1)[0].shape == (2, 0, 3)
    assert cumsum_case(_normal(rng, (0, 3)), 1)[0].shape == (0, 3)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype, axis", [(F32, 1), (F16, -1), (np.int32, 0), (F64, -3)])
def test_cumsum_reference_matches_onnx(registry, rng, dtype, axis, exclusive, reverse):
    """Bit for bit, float16 rounding at every step included (axis a runtime input)."""
    shape = (3, 6, 5)
    x = _normal(rng, shape, dtype) if np.dtype(dtype).kind == "f" else _integers(rng, shape, dtype)
    feeds = {"x": x, "axis": np.array(axis, np.int64)}
    (ours,), (theirs,) = _references(registry, "CumSum", feeds, {"exclusive": exclusive, "reverse": reverse}, 14)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


def test_cumsum_refuses_an_axis_known_only_at_run_time(registry, rng):
    feeds = {"x": _normal(rng, (2, 3)), "axis": np.array(1, np.int64)}
    with pytest.raises(UnsupportedError, match="axis input computed at run time"):
        _tactics(registry, "CumSum", feeds, {}, constants=())


@pytest.mark.parametrize("x_shape, axis, message", [
    ((), 0, "0-D input"),
    ((2, 3), 2, "axis=2"),
    ((2, 3), -3, "axis=-3"),
    ((2, 3), [0, 1], "axis input of shape"),
])
def test_cumsum_refuses_invalid_nodes(registry, rng, x_shape, axis, message):
    feeds = {"x": _normal(rng, x_shape), "axis": np.array(axis, np.int64)}
    with pytest.raises(UnsupportedError, match=message):
        _tactics(registry, "CumSum", feeds, {}, constants={"axis"})



# ---------------------------------------------------------------------- CumProd


def _near_one(rng, shape, dtype=F32):
    """Factors in [0.5, 1.5) with random signs: products that neither vanish nor overflow."""
    return (rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)).astype(dtype)


def cumprod_case(x, axis, exclusive=0, reverse=0, axis_dtype=np.int64, **tol):
    """check_node for CumProd, ``axis`` a constant."""
    return check_node("CumProd", {"x": x, "axis": np.array(axis, axis_dtype)},
                      {"exclusive": exclusive, "reverse": reverse}, constants={"axis"}, opset=26, **tol)


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((3, 5), -2), ((2, 3, 5), 1), ((2, 4, 3, 1), -2)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_float32(rng, shape, axis, exclusive, reverse):
    cumprod_case(_near_one(rng, shape), axis, exclusive, reverse, rtol=1e-5)


@pytest.mark.parametrize("dtype", [F64, F16, np.int32, np.int64, np.uint32, np.uint64])
def test_cumprod_other_dtypes(rng, dtype):
    shape = (2, 5, 3)
    x = _near_one(rng, shape, dtype) if np.dtype(dtype).kind == "f" else _integers(rng, shape, dtype, -3, 4)
    tol = F16_TOL if dtype == F16 else {}
    cumprod_case(x, 1, exclusive=1, **tol)
    cumprod_case(x, [-1], reverse=1, axis_dtype=np.int32, **tol)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's int64 products
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64])
def test_cumprod_integers_wrap(dtype):
    big = np.iinfo(dtype).max // 3
    x = np.array([[big, 7, 5, 3], [3, big, 2, 9]], dtype)
    want = cumprod_case(x, 1)[0]
    bits = 8 * np.dtype(dtype).itemsize
    wrapped = (int(big) * 7) % 2**bits
    assert int(want[0, 1]) % 2**bits == wrapped and int(want[0, 1]) != int(big) * 7  # as np.cumprod in the dtype
    cumprod_case(x, 1, exclusive=1, reverse=1)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype, axis", [(F32, 1), (F16, -1), (np.int32, 0), (F64, -3)])
def test_cumprod_reference_matches_onnx(registry, rng, dtype, axis, exclusive, reverse):
    """Bit for bit, float16 rounding at every step included (axis a runtime input)."""
    shape = (3, 6, 5)
    x = _near_one(rng, shape, dtype) if np.dtype(dtype).kind == "f" else _integers(rng, shape, dtype, -3, 4)
    feeds = {"x": x, "axis": np.array(axis, np.int64)}
    (ours,), (theirs,) = _references(registry, "CumProd", feeds, {"exclusive": exclusive, "reverse": reverse}, 26)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("x, axis, message", [
    (np.ones((2, 3), np.float32), 2, "axis=2"),
    (np.ones((), np.float32), 0, "0-D input"),
    (np.ones((2, 3), np.int8), 0, "dtype int8"),
])
def test_cumprod_refuses_invalid_nodes(registry, x, axis, message):
    feeds = {"x": x, "axis": np.array(axis, np.int64)}
    with pytest.raises(UnsupportedError, match=f"test_cumprod.*{message}.*CumProd"):
        _tactics(registry, "CumProd", feeds, {}, constants={"axis"}, opset=26)
    with pytest.raises(UnsupportedError, match="axis input computed at run time"):
        _tactics(registry, "CumProd", {"x": np.ones((2, 3), np.float32), "axis": np.array(1)}, {}, (), opset=26)

# ---------------------------------------------------------------------- TopK


def topk_case(x, k, opset=17, **attrs):
    """check_node for TopK, K a constant; returns the reference (values, indices)."""
    return check_node("TopK", {"x": x, "k": np.array([k], np.int64)}, attrs, constants={"k"}, opset=opset,
                      n_outputs=2)


def _ks(size: int) -> list[int]:
    return sorted({1, (size + 1) // 2, size})


@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_float32(rng, shape, axis, largest):
    x = _normal(rng, shape)
    for k in _ks(shape[axis]):
        values, indices = topk_case(x, k, axis=axis, largest=largest)
        assert values.shape[axis] == k and indices.dtype == np.int64


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_unsorted_is_sorted_too(rng, largest):
    x = _normal(rng, (3, 7))
    want = topk_case(x, 7, axis=1, largest=largest, sorted=1)
    got = topk_case(x, 7, axis=1, largest=largest, sorted=0)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int32, np.int64, np.uint32, np.uint64, np.int8, np.uint8])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_ties_come_in_index_order(rng, dtype, largest):
    """Few distinct values, so most of them tie: best first, ties the lower index first."""
    x = _integers(rng, (3, 9, 2), dtype, low=-2, high=3)
    for k in (1, 4, 9):
        values, indices = topk_case(x, k, axis=1, largest=largest)
        steps = np.diff(values.astype(np.float64), axis=1)
        assert np.all(steps <= 0) if largest else np.all(steps >= 0)
        tied = steps == 0
        assert np.all(np.diff(indices, axis=1)[tied] > 0)


def test_topk_all_equal():
    _, indices = topk_case(np.zeros((2, 5), np.int64), 3, axis=1)
    np.testing.assert_array_equal(indices, [[0, 1, 2], [0, 1, 2]])


@pytest.mark.parametrize("dtype", [F16, F64])
@pytest.mark.parametrize("shape, axis", [((2, 3, 5), -1), ((4, 5, 3), 1)])
def test_topk_float16_float64(rng, dtype, shape, axis):
    x = _normal(rng, shape, dtype)
    for largest in (0, 1):
        topk_case(x, 3, axis=axis, largest=largest)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_nan_and_infinities(rng, largest):
    """NaN ranks above every number (+inf included), NaNs in index order."""
    x = _normal(rng, (2, 8)).astype(F32)
    x[0, [1, 5]] = np.nan
    x[0, 3] = np.inf
    x[0, 6] = -np.inf
    x[1, :] = np.nan
    for k in (1, 3, 8):
        _, indices = topk_case(x, k, axis=1, largest=largest)
    if largest:
        np.testing.assert_array_equal(indices[0, :3], [1, 5, 3])
    else:
        np.testing.assert_array_equal(indices[0, -3:], [3, 1, 5])
    np.testing.assert_array_equal(indices[1], np.arange(8))


def test_topk_k_zero(rng):
    values, indices = topk_case(_normal(rng, (3, 4)), 0, axis=1)
    assert values.shape == indices.shape == (3, 0)


def test_topk_at_opset_10(rng):
    """Opset 10: K an input, ``axis`` the only attribute (largest and sorted come at 11)."""
    values, _ = topk_case(_normal(rng, (3, 6)), 2, opset=10, axis=0)
    assert values.shape == (2, 6)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1, 1])
@pytest.mark.parametrize("dtype", [F32, F16, np.int64, np.uint64])
def test_topk_reference_matches_onnx(registry, rng, dtype, axis, largest):
    """Bit for bit, ties and NaN included (K a runtime input)."""
    x = _integers(rng, (4, 7, 3), dtype, low=-3, high=4)
    if np.dtype(dtype).kind == "f":
        x[1, 2, :] = np.nan
        x[2, :, 1] = np.nan
        x[0, 3, 0] = -np.inf
    for k in (1, 3, x.shape[axis]):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        ours, theirs = _references(registry, "TopK", feeds, {"axis": axis, "largest": largest}, 11, n_outputs=2)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_topk_refuses_a_k_known_only_at_run_time(registry, rng):
    feeds = {"x": _normal(rng, (2, 5)), "k": np.array([2], np.int64)}
    with pytest.raises(UnsupportedError, match="K input computed at run time"):
        _tactics(registry, "TopK", feeds, {}, constants=(), n_outputs=2)


@pytest.mark.parametrize("x_shape, k, attrs, opset, message", [
    ((2, 5), [6], {}, 17, "K=6 along an axis of 5"),
    ((2, 5), [-1], {}, 17, "K=-1"),
    ((2, 5), [1, 2], {}, 17, "K input of shape"),
    ((2, 5), [1], {"axis": 2}, 17, "axis=2"),
    ((), [1], {"axis": 0}, 17, "0-D input"),
    ((2, 5), [1], {"largest": 0}, 10, "largest attribute at opset 10"),
    ((2, 5), [1], {"sorted": 0}, 10, "sorted attribute at opset 10"),
])
def test_topk_refuses_invalid_nodes(registry, rng, x_shape, k, attrs, opset, message):
    feeds = {"x": _normal(rng, x_shape), "k": np.array(k, np.int64)}
    with pytest.raises(UnsupportedError, match=message):
        _tactics(registry, "TopK", feeds, attrs, constants={"k"}, opset=opset, n_outputs=2)


# ---------------------------------------------------------------------- the conformance kit


def test_cumsum_and_topk_pass_the_conformance_kit(registry):
    report = check_plugin("builtin-reduction", registry=registry, ops=["CumSum", "TopK"])
    assert report.ops() == ["CumSum", "TopK"]
    assert report.counts()["passed"] > 2 + 2 * 5  # claims, then every check of every example


# ---------------------------------------------------------------------- GPU typing


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.reduction import scan, topk
        for dt in ("float16", "float32", "float64", "int32", "int64", "uint32", "uint64"):
            for product in (False, True):
                for exclusive in (False, True):
                    for reverse in (False, True):
                        check(f"scan {dt} product={product} exclusive={exclusive} reverse={reverse}",
                              scan.scan_kernel(dt, product, exclusive, reverse), [arr(dt), arr(dt), I64, I64, I64],
                              dt != "float64")
        for dt in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                   "uint8", "uint16", "uint32", "uint64"):
            for largest in (False, True):
                check(f"TopK {dt} largest={largest}", topk.topk_kernel(dt, largest),
                      [arr(dt), arr(dt), arr(np.int64), I64, I64, I64, I64], dt != "float64")
    """)
    assert not failures, "\n".join(failures)
