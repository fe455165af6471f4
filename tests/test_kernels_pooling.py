"""CUDA tactics of the pooling ops against their NumPy references (simulator without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.testing import check_node

TOL = {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: dict(rtol=2e-5, atol=1e-6),
       np.float64: dict(rtol=1e-12, atol=1e-12)}

WINDOWS = [
    ((1, 2, 7), dict(kernel_shape=[3], strides=[2], pads=[1, 2])),
    ((1, 2, 5, 4), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((2, 1, 6, 5), dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    ((1, 1, 5, 7), dict(kernel_shape=[3, 3], strides=[2, 3], pads=[2, 1, 1, 2], ceil_mode=1)),
    ((1, 2, 5, 6), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[1, 2], auto_pad="SAME_LOWER")),
    ((1, 1, 6, 5), dict(kernel_shape=[2, 2], auto_pad="VALID", strides=[3, 2])),
    ((1, 1, 3, 4, 3), dict(kernel_shape=[2, 2, 2], strides=[1, 2, 1], pads=[1, 0, 0, 0, 1, 1])),
]


def _x(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.2).astype(dtype)


@pytest.mark.parametrize("shape, attrs", WINDOWS)
def test_maxpool_with_indices(rng, shape, attrs):
    for order in (0, 1):
        check_node("MaxPool", {"x": _x(rng, shape)}, dict(attrs, storage_order=order), n_outputs=2)


def test_maxpool_values_only_and_opset8(rng):
    shape, attrs = WINDOWS[3]
    check_node("MaxPool", {"x": _x(rng, shape)}, attrs)
    check_node("MaxPool", {"x": _x(rng, (1, 2, 5, 5))}, dict(kernel_shape=[2, 2], strides=[2, 2]), opset=8)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_maxpool_dtypes_and_ties(rng, dtype):
    shape, attrs = WINDOWS[1]
    if np.dtype(dtype).kind == "f":
        x = _x(rng, shape, dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.min + 3, shape).astype(dtype)  # ties and the minimum itself
    check_node("MaxPool", {"x": x}, dict(attrs, storage_order=1), n_outputs=2)


def test_maxpool_nan_and_infinities(rng):
    x = _x(rng, (1, 1, 4, 5))
    x[0, 0, 1, 2] = np.nan
    x[0, 0, 3, :] = -np.inf
    check_node("MaxPool", {"x": x}, dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1]), n_outputs=2)


@pytest.mark.parametrize("shape, attrs", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool(rng, shape, attrs, count_include_pad):
    check_node("AveragePool", {"x": _x(rng, shape)}, dict(attrs, count_include_pad=count_include_pad), opset=19)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_averagepool_dtypes(rng, dtype):
    shape, attrs = WINDOWS[3]
    check_node("AveragePool", {"x": _x(rng, shape, dtype)}, dict(attrs, count_include_pad=1), **TOL[dtype])


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lppool(rng, p, dtype):
    shape, attrs = WINDOWS[2 if p != 2 else 1]
    check_node("LpPool", {"x": _x(rng, shape, dtype)}, dict(attrs, p=p), opset=18, **TOL[dtype])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 3, 7), (1, 1, 2, 3, 3), (1, 2, 1, 1)])
def test_global_pools(rng, op, shape):
    check_node(op, {"x": _x(rng, shape)})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_global_pools_dtypes(rng, op, dtype):
    attrs = {"p": 3} if op == "GlobalLpPool" else {}
    check_node(op, {"x": _x(rng, (2, 2, 3, 5), dtype)}, attrs, **TOL[dtype])


def test_global_maxpool_nan(rng):
    x = _x(rng, (1, 2, 3, 4))
    x[0, 1, 2, 0] = np.nan
    check_node("GlobalMaxPool", {"x": x})


def test_empty_batch(rng):
    x = np.zeros((0, 2, 4, 4), np.float32)
    check_node("MaxPool", {"x": x}, dict(kernel_shape=[2, 2]), n_outputs=2)
    check_node("AveragePool", {"x": x}, dict(kernel_shape=[2, 2]))
    check_node("GlobalAveragePool", {"x": x})


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.common.scalars import compute_type
        from plugrt_builtin_ops.pooling import global_pool as gp, window_pool as pk
        G = arr(np.int64, 2)
        for dt in ("float16", "float32", "float64", "int8", "uint8"):
            c = scalar(compute_type(dt)[1])
            check(f"MaxPool {dt}", pk.max_pool_kernel(np.dtype(dt).str),
                  [arr(dt), arr(np.int64), arr(dt), I64, I64, I64, I64, I64, G, c, I64], dt != "float64")
        for dt in ("float16", "float32", "float64"):
            c = scalar(compute_type(dt)[1])
            for lp in (False, True):
                check(f"sum pool {dt} lp={lp}", pk.sum_pool_kernel(np.dtype(dt).str, lp),
                      [arr(dt), arr(dt), I64, I64, I64, I64, I64, G, I64, c, c], dt != "float64")
            for kind in ("avg", "max", "lp"):
                check(f"global {kind} {dt}", gp.global_pool_kernel(np.dtype(dt).str, kind),
                      [arr(dt), arr(dt), I64, I64, c, c], dt != "float64")
    """)
    assert not failures, "\n".join(failures)
