"""Block-size variants of the pooling and reduction tactics: which are offered in what
order, each against the reference (the simulator shrinks every block, so these check the
launch code and the kernels' typing more than the block sizes), and the block kernels at
every offered shape typed for sm_90."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, single_node_model
from plugrt_builtin_ops.pooling import global_pool, window_pool
from plugrt_builtin_ops.reduction import reduce

F16, F32 = np.float16, np.float32


def _names(op, feeds, attrs=None, opset=17, n_outputs=1):
    registry = default_registry()
    graph = import_model(single_node_model(op, feeds, attrs, (), "", opset, n_outputs), registry=registry)
    return [t.name for t in node_tactics(graph, registry) if t.provider is None]  # the built-in plugin's own


def _x(rng, shape, dtype=F32):
    return (rng.standard_normal(shape) + 0.3).astype(dtype)


# ----------------------------------------------------------------------------- pooling


def test_window_block_order_follows_the_output_size():
    assert window_pool.window_block_order(32 * 64 * 112 * 112) == (256, 128, 64)
    assert window_pool.window_block_order(64 * 56 * 56 // 4) == (128, 256, 64)
    assert window_pool.window_block_order(1000) == (64, 128, 256)


def test_global_block_order_follows_the_plane():
    assert global_pool.global_block_order(7 * 7)[0] == 32       # ResNet's last plane
    assert global_pool.global_block_order(14 * 14)[0] == 64
    assert global_pool.global_block_order(56 * 56)[:2] == (256, 128)
    assert sorted(global_pool.global_block_order(1)) == [32, 64, 128, 256]


@pytest.mark.parametrize("op, attrs, n_outputs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), 2),
    ("MaxPool", dict(kernel_shape=[2, 2]), 1),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[1, 2], pads=[1, 0, 1, 1], count_include_pad=1), 1),
    ("LpPool", dict(kernel_shape=[2, 2], p=3), 1),
])
def test_window_pool_variants(rng, op, attrs, n_outputs):
    x = _x(rng, (2, 6, 12, 12))  # at least 432 outputs: every block size is offered
    names = _names(op, {"x": x}, attrs, opset=18, n_outputs=n_outputs)
    assert names == ["direct_t64", "direct_t128", "direct_t256"]
    check_node(op, {"x": x}, attrs, opset=18, n_outputs=n_outputs)


def test_window_pool_small_output_drops_oversized_blocks(rng):
    assert _names("MaxPool", {"x": _x(rng, (1, 2, 4, 4))}, dict(kernel_shape=[2, 2], strides=[2, 2])) == ["direct_t64"]


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_global_pool_variants(rng, op, dtype):
    x = _x(rng, (2, 3, 9, 11), dtype)  # plane 99: 32 first, then 64 and 128 (256 would idle)
    assert _names(op, {"x": x}) == ["block_per_row_t32", "block_per_row_t64", "block_per_row_t128"]
    tol = dict(rtol=3e-3, atol=3e-3) if dtype == F16 else dict(rtol=2e-5, atol=1e-6)
    check_node(op, {"x": x}, **tol)


def test_global_pool_tiny_plane(rng):
    assert _names("GlobalAveragePool", {"x": _x(rng, (1, 4, 2, 2))}) == ["block_per_row_t32"]


# ----------------------------------------------------------------------------- reductions


def test_block_shapes():
    assert reduce.block_shapes(3, 300) == [(128, 2), (256, 1), (32, 4)]
    assert reduce.block_shapes(100, 3000) == [(256, 1), (32, 8), (128, 2)]
    assert reduce.block_shapes(1, 1000) == [(256, 1), (32, 1), (128, 1)]
    assert reduce.block_shapes(4096, 7) == [(32, 8)]  # a row never gets more threads than a warp


LONG = (3, 300)  # three rows of 300: three block shapes and the thread form


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
def test_reduce_variants(rng, op):
    x = _x(rng, LONG)
    attrs = {"axes": [1], "keepdims": 0}
    assert _names(op, {"x": x}, attrs, opset=12) == ["block128x2", "block256x1", "block32x4", "thread"]
    check_node(op, {"x": x}, attrs, opset=12, rtol=2e-5, atol=1e-5)


def test_reduce_short_rows_thread_first(rng):
    x = _x(rng, (40, 3))
    assert _names("ReduceSum", {"x": x}, {"axes": [1]}, opset=12) == ["thread", "block32x8"]
    check_node("ReduceSum", {"x": x}, {"axes": [1]}, opset=12, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "ReduceLogSumExp", "ArgMax"])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_exp_and_arg_variants(rng, op, dtype):
    x = _x(rng, LONG, dtype)
    attrs = {"axes": [1]} if op == "ReduceLogSumExp" else {"axis": 1}
    opset = 13
    names = _names(op, {"x": x}, attrs, opset=opset)
    assert names == ["block128x2", "block256x1", "block32x4", "thread"]
    tol = dict(rtol=3e-3, atol=3e-3) if dtype == F16 else dict(rtol=2e-5, atol=1e-6)
    check_node(op, {"x": x}, attrs, opset=opset, **tol)


# ----------------------------------------------------------------------------- GPU typing


def test_block_kernels_compile_for_the_gpu():
    """The reduction, exponential and arg block kernels at every shape the tactics offer,
    and the global pool at every block size, typed for sm_90 (float32 ones f64-free)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.common.scalars import compute_type
        from plugrt_builtin_ops.pooling import global_pool as gp
        from plugrt_builtin_ops.reduction import argmax as ak, reduce as rk, softmax as sk

        shapes = sorted({s for n_out, n_red in ((3, 300), (100, 3000), (1, 1000), (4096, 7), (2, 64))
                         for s in rk.block_shapes(n_out, n_red)})
        T = arr(np.int64)
        for dt in ("float16", "float32"):
            view = [I64, I64, T, T, I64, T, T, I64]
            for index, (bx, by) in enumerate(shapes):  # every block shape; every op on one (it is constants)
                for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2") if index == 0 else ("ReduceSum",):
                    check(f"{op} {dt} {bx}x{by}", rk.reduce_block_kernel(op, dt, bx, by),
                          [arr(dt), arr(dt)] + view, True)
                for mode in (sk.SOFTMAX, sk.LOG_SOFTMAX, sk.LOG_SUM_EXP) if index == 0 else (sk.SOFTMAX,):
                    check(f"exp mode {mode} {dt} {bx}x{by}", sk.exp_block_kernel(dt, mode, bx, by),
                          [arr(dt), arr(dt)] + view, True)
                check(f"argmax {dt} {bx}x{by}", ak.arg_block_kernel(dt, True, False, False, bx, by),
                      [arr(dt), arr(np.int64)] + view, True)
            c = scalar(compute_type(dt)[1])
            for kind in ("avg", "max", "lp"):
                check(f"global {kind} {dt}", gp.global_pool_kernel(np.dtype(dt).str, kind),
                      [arr(dt), arr(dt), I64, I64, c, c], True)
    """)
    assert not failures, "\n".join(failures)
