"""The vector row kernel (:mod:`plugrt_builtin_ops.normalization.row_norm_vector`): offered
first exactly where it applies, and against the ops' references on rows with a large mean
(simulator without a GPU: two-lane warps, two rows a block, two blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import cuda
from plugrt.testing import check_node
from plugrt_builtin_ops.normalization import row_norm_vector as rv
from plugrt_builtin_ops.normalization.row_norm import PER_COL, RowNorm, RowView, param_index
from test_kernels_normalization import F16, F32, F64, TOL, rand, tactic_names

OFFSET = 5.0


def vector_name(op, feeds, attrs=None, n_outputs=1, opset=17):
    """The vector tactic's name, asserting it is offered first and followed by the generic ones."""
    names = tactic_names(op, feeds, attrs, n_outputs=n_outputs, opset=opset)
    assert names[0].startswith("rows_vec8_"), names
    assert all(n.startswith("rows") and not n.startswith("rows_vec") for n in names[1:]) and names[1:], names
    return names[0]


def check_vector(op, feeds, attrs=None, n_outputs=1, opset=17, **tol):
    name = vector_name(op, feeds, attrs, n_outputs, opset)
    check_node(op, feeds, attrs, n_outputs=n_outputs, opset=opset, tactics=[name], **tol)


# --------------------------------------------------------------------------- where it is offered


@pytest.mark.parametrize("rows, cols, expected", [(4096, 768, (1, 8)), (64, 768, (1, 1)), (4096, 1024, (1, 8)),
                                                  (4096, 1032, (2, 4)), (4096, 4096, (4, 2)), (512, 8192, (8, 1))])
def test_geometry(rows, cols, expected):
    """One warp a row up to 1024 columns (4 vectors a lane), more warps past it; rows stacked
    to 256 threads while the grid keeps its blocks."""
    assert rv.vector_geometry(rows, cols) == expected


def test_offered_first_for_transformer_norms(rng):
    x, s = rand(rng, (4, 32), F16), rand(rng, (32,), F16)
    assert vector_name("LayerNormalization", {"x": x, "s": s, "b": s}, n_outputs=3) == "rows_vec8_32x1"
    assert vector_name("RMSNormalization", {"x": x, "s": rand(rng, (32,), F32)}, opset=23)
    assert vector_name("InstanceNormalization", {"x": rand(rng, (2, 3, 8)), "s": rand(rng, (3,)), "b": rand(rng, (3,))})
    assert vector_name("MeanVarianceNormalization", {"x": rand(rng, (2, 3, 8))}, {"axes": [2]}, opset=13)


@pytest.mark.parametrize("shape, axis, dtype, s_shape", [
    ((4, 12), -1, F32, (12,)),            # not a multiple of 8 columns
    ((4, 8200), -1, F32, (8200,)),        # wider than 8192
    ((4, 16), -1, F64, (16,)),            # float64
    ((2, 3, 8), 1, F32, (3, 1)),          # scale broadcast over columns of a two-axis row: a table
])
def test_not_offered(rng, shape, axis, dtype, s_shape):
    names = tactic_names("LayerNormalization", {"x": rand(rng, shape, dtype), "s": rand(rng, s_shape, dtype)},
                         {"axis": axis})
    assert not any(n.startswith("rows_vec") for n in names), names


def test_not_offered_off_trailing_axes_or_for_float64_y(rng):
    names = tactic_names("MeanVarianceNormalization", {"x": rand(rng, (8, 2, 8))}, {"axes": [0]}, opset=13)
    assert not any(n.startswith("rows_vec") for n in names), names
    names = tactic_names("RMSNormalization", {"x": rand(rng, (2, 8), F32), "s": rand(rng, (8,), F64)}, opset=23)
    assert not any(n.startswith("rows_vec") for n in names), names


# --------------------------------------------------------------------------- against the references


@pytest.mark.parametrize("shape", [(5, 40), (3, 8), (7, 24), (2, 3, 16), (1, 8)])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_layernorm(rng, shape, dtype):
    cols = shape[-1]
    feeds = {"x": rand(rng, shape, dtype, OFFSET), "s": rand(rng, (cols,), dtype), "b": rand(rng, (cols,), dtype)}
    check_vector("LayerNormalization", feeds, {"epsilon": 1e-3}, n_outputs=3, **TOL[dtype])


@pytest.mark.parametrize("n_outputs", [1, 2, 3])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_layernorm_no_bias_some_outputs(rng, dtype, n_outputs):
    feeds = {"x": rand(rng, (3, 2, 8), dtype, OFFSET), "s": rand(rng, (2, 8), dtype)}
    check_vector("LayerNormalization", feeds, {"axis": 1}, n_outputs=n_outputs, **TOL[dtype])


@pytest.mark.parametrize("s_shape, b_shape", [((16,), (1,)), ((1,), (16,)), ((1,), (1,))])
def test_layernorm_scalar_params(rng, s_shape, b_shape):
    """A one-element scale or bias is per row (period 1) beside the other's per-column values."""
    feeds = {"x": rand(rng, (3, 16), F32, OFFSET), "s": rand(rng, s_shape), "b": rand(rng, b_shape)}
    check_vector("LayerNormalization", feeds, n_outputs=3, **TOL[F32])


def test_layernorm_two_warps_a_row(rng):
    """Past 1024 columns a row takes two warps on the GPU (two emulated ones here)."""
    feeds = {"x": rand(rng, (3, 1040), F16, OFFSET), "s": rand(rng, (1040,), F16), "b": rand(rng, (1040,), F16)}
    assert vector_name("LayerNormalization", feeds) == "rows_vec8_64x1"
    check_vector("LayerNormalization", feeds, n_outputs=3, **TOL[F16])


def test_layernorm_large_mean_two_pass(rng):
    """Mean 1000, spread 1: the variance from the registers' deviations keeps float32 accuracy."""
    feeds = {"x": rand(rng, (3, 16), F32, 1000.0), "s": rand(rng, (16,)), "b": rand(rng, (16,))}
    check_vector("LayerNormalization", feeds, n_outputs=3, rtol=5e-4, atol=5e-4)


@pytest.mark.parametrize("x_dtype, s_dtype", [(F16, F16), (F16, F32), (F32, F16), (F32, F32)])
def test_rmsnorm(rng, x_dtype, s_dtype):
    """Y takes the scale's dtype (float16 X, float32 Y included)."""
    feeds = {"x": rand(rng, (5, 24), x_dtype, OFFSET), "s": rand(rng, (24,), s_dtype)}
    tol = TOL[F16] if F16 in (x_dtype, s_dtype) else TOL[F32]
    check_vector("RMSNormalization", feeds, {"epsilon": 1e-3}, opset=23, **tol)


@pytest.mark.parametrize("dtype", [F16, F32])
def test_per_row_params_and_eps_out(rng, dtype):
    """Scale and bias per row (InstanceNorm, GroupNorm by groups); MVN's epsilon outside the root."""
    c = 3
    feeds = {"x": rand(rng, (2, c, 2, 4), dtype, OFFSET), "s": rand(rng, (c,), dtype), "b": rand(rng, (c,), dtype)}
    check_vector("InstanceNormalization", feeds, {"epsilon": 1e-4}, **TOL[dtype])
    feeds = {"x": rand(rng, (2, 4, 8), dtype, OFFSET), "s": rand(rng, (2,), dtype), "b": rand(rng, (2,), dtype)}
    check_vector("GroupNormalization", feeds, {"num_groups": 2}, opset=18, **TOL[dtype])
    check_vector("MeanVarianceNormalization", {"x": rand(rng, (3, 2, 8), dtype, OFFSET)}, {"axes": [1, 2]}, opset=13,
                 **TOL[dtype])


def test_unaligned_arrays_fall_back(rng):
    """X one element past a 16-byte boundary: the launch is the generic kernel's, still right."""
    rows, cols = 3, 16
    view = RowView((rows, cols), (1,))
    norm = RowNorm(view, np.dtype(F32), 1e-5, scale=1, scale_index=param_index(view, np.array([0, 1])))
    assert norm.scale_index.mode == PER_COL
    vector, fallback = rv.row_tactics(norm)[:2]
    x = rand(rng, (rows, cols), F32, OFFSET)
    s = rand(rng, (cols,), F32)
    padded = cuda.to_device(np.concatenate([np.zeros(1, F32), x.ravel()]))
    ins = [padded[1:].reshape(rows, cols), cuda.to_device(s)]
    outs = [cuda.device_array((rows, cols), F32)]
    launches = vector.launches(ins, outs, None)
    assert [l.kernel for l in launches] == [l.kernel for l in fallback.launches(ins, outs, None)]
    for launch in launches:
        launch.kernel[launch.grid, launch.block](*launch.args)
    x64 = x.astype(F64)
    centered = x64 - x64.mean(axis=1, keepdims=True)
    want = centered / np.sqrt((centered ** 2).mean(axis=1, keepdims=True) + 1e-5) * s
    np.testing.assert_allclose(outs[0].copy_to_host(), want, **TOL[F32])


# --------------------------------------------------------------------------- real GPU geometries


@pytest.mark.gpu
@pytest.mark.skipif(simulated(), reason="GPU only: the simulator launches a few threads")
@pytest.mark.parametrize("shape", [(4096, 768), (1001, 40), (2001, 1032), (300, 8192)])
@pytest.mark.parametrize("dtype", [F16, F32])
def test_gpu_full_geometries(rng, shape, dtype):
    """BERT-base's LayerNorm (eight one-warp rows a block), two stacked rows, two-warp rows
    four a block, one eight-warp row a block; row counts not multiples of the stacking."""
    cols = shape[-1]
    feeds = {"x": rand(rng, shape, dtype, OFFSET), "s": rand(rng, (cols,), dtype), "b": rand(rng, (cols,), dtype)}
    check_vector("LayerNormalization", feeds, n_outputs=3, **TOL[dtype])
    check_vector("RMSNormalization", {"x": feeds["x"], "s": feeds["s"]}, opset=23, **TOL[dtype])


# --------------------------------------------------------------------------- GPU typing


def test_vector_kernels_compile_for_the_gpu():
    """Every lane count the GPU launches (one to eight warps, one to four vectors a lane),
    LayerNorm's and RMSNorm's forms, float16 and float32, typed for sm_90 with real warp
    shuffles, free of float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.normalization import row_norm as rn, row_norm_vector as rv

        F32 = arr(np.float32)
        for warps, rows, vectors in ((1, 8, 3), (1, 8, 4), (2, 4, 4), (8, 1, 4), (1, 1, 1)):
            for x_dt, y_dt, centered, mode in (("float16", "float16", True, rn.PER_COL),
                                               ("float32", "float32", True, rn.PER_ROW),
                                               ("float16", "float32", False, rn.ABSENT)):
                kernel = rv.vector_row_kernel(32, warps, rows, vectors, rn.PER_COL, mode, centered,
                                              rn.INV_STD if centered else rn.NO_STAT, centered)
                args = [arr(x_dt), arr(y_dt), I64, I64, scalar(np.float32), scalar(np.float32), arr(y_dt), I64,
                        arr(y_dt), I64, F32, F32]
                check(f"vector rows {warps}x{rows}x{vectors} {x_dt}->{y_dt} centered={centered}", kernel, args, True)
    """)
    assert not failures, "\n".join(failures)
