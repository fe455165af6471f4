"""CUDA tactics of the normalization ops against their NumPy references (simulator without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import broadcast_strides
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, single_node_model
from plugrt_builtin_ops.normalization.row_norm import PER_COL, PER_ROW, TABLE, RowView, param_index

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: dict(rtol=3e-3, atol=3e-3), F32: dict(rtol=2e-4, atol=2e-5), F64: dict(rtol=1e-10, atol=1e-12)}


def rand(rng, shape, dtype=F32, offset=0.0):
    return (rng.standard_normal(shape) + offset).astype(dtype)


def positive(rng, shape, dtype=F32):
    return rng.uniform(0.5, 2.0, shape).astype(dtype)


def tactic_names(op, feeds, attrs=None, constants=(), n_outputs=1, opset=17):
    registry = default_registry()
    graph = import_model(single_node_model(op, feeds, attrs, constants, "", opset, n_outputs), registry=registry)
    return [t.name for t in node_tactics(graph, registry)]


# --------------------------------------------------------------------------- row view


def test_row_view_offsets_follow_any_axes():
    view = RowView((2, 3, 4), (0, 2))
    rows, cols = view.x_tables()
    index = np.arange(24).reshape(2, 3, 4).transpose(1, 0, 2).reshape(3, 8)
    np.testing.assert_array_equal(rows[:, None] + cols[None, :], index)
    assert not view.contiguous and RowView((2, 3, 4), (1, 2)).contiguous


def test_param_index_modes():
    shape = (2, 3, 5)
    trailing = RowView(shape, (2,))
    assert param_index(trailing, broadcast_strides((5,), shape)).mode == PER_COL
    per_channel = param_index(RowView(shape, (2,)), np.array([0, 1, 0]))
    assert (per_channel.mode, per_channel.period) == (PER_ROW, 3)
    assert param_index(trailing, broadcast_strides((1,), shape)).period == 1
    assert param_index(RowView(shape, (1, 2)), broadcast_strides((3, 1), shape)).mode == TABLE


# --------------------------------------------------------------------------- LayerNormalization


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((2, 3, 5), -1), ((2, 3, 5), 1), ((2, 3, 5), -3),
                                         ((3, 37), -1), ((1, 1), 0)])
def test_layernorm_axes(rng, shape, axis):
    axis_n = axis % len(shape)
    feeds = {"x": rand(rng, shape), "s": rand(rng, shape[axis_n:]), "b": rand(rng, shape[axis_n:])}
    check_node("LayerNormalization", feeds, {"axis": axis, "epsilon": 1e-3}, n_outputs=3, **TOL[F32])


@pytest.mark.parametrize("n_outputs", [1, 2, 3])
def test_layernorm_no_bias_optional_outputs(rng, n_outputs):
    feeds = {"x": rand(rng, (3, 2, 4)), "s": rand(rng, (2, 4))}
    check_node("LayerNormalization", feeds, {"axis": 1}, n_outputs=n_outputs, **TOL[F32])


@pytest.mark.parametrize("s_shape, b_shape", [((1,), (5,)), ((1, 5), (1,)), ((3, 1), (3, 5)), ((2, 3, 1), (1, 5))])
def test_layernorm_broadcast_params(rng, s_shape, b_shape):
    feeds = {"x": rand(rng, (2, 3, 5)), "s": rand(rng, s_shape), "b": rand(rng, b_shape)}
    axis = 0 if len(s_shape) == 3 else 1
    check_node("LayerNormalization", feeds, {"axis": axis}, n_outputs=3, **TOL[F32])


@pytest.mark.parametrize("dtype", [F16, F64])
def test_layernorm_dtypes(rng, dtype):
    feeds = {"x": rand(rng, (3, 9), dtype), "s": rand(rng, (9,), dtype), "b": rand(rng, (9,), dtype)}
    check_node("LayerNormalization", feeds, {"axis": -1}, n_outputs=3, **TOL[dtype])


def test_layernorm_constant_params_and_large_mean(rng):
    """A large offset: the shifted one-pass variance must not cancel catastrophically."""
    feeds = {"x": rand(rng, (4, 6), offset=1000.0), "s": rand(rng, (6,)), "b": rand(rng, (6,))}
    check_node("LayerNormalization", feeds, {"axis": -1}, constants={"s", "b"}, n_outputs=3, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's mean of an empty row
def test_layernorm_empty(rng, shape):
    """No rows: nothing to launch; empty rows: Y is empty, Mean and InvStdDev are NaN."""
    feeds = {"x": rand(rng, shape), "s": rand(rng, shape[1:]), "b": rand(rng, shape[1:])}
    check_node("LayerNormalization", feeds, {"axis": -1}, n_outputs=3)


def test_layernorm_offers_the_vector_kernel_then_two_geometries(rng):
    feeds = {"x": rand(rng, (4, 32)), "s": rand(rng, (32,))}
    assert tactic_names("LayerNormalization", feeds) == ["rows_vec8_32x1", "rows32x4", "rows256x1"]
    feeds = {"x": rand(rng, (4, 36)), "s": rand(rng, (36,))}
    assert tactic_names("LayerNormalization", feeds) == ["rows32x4", "rows256x1"]


# --------------------------------------------------------------------------- RMSNormalization


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((2, 3, 5), -1), ((2, 3, 5), 1), ((3, 37), -1)])
def test_rmsnorm_axes(rng, shape, axis):
    feeds = {"x": rand(rng, shape, offset=0.5), "s": rand(rng, shape[axis % len(shape):])}
    check_node("RMSNormalization", feeds, {"axis": axis, "epsilon": 1e-3}, opset=23, **TOL[F32])


@pytest.mark.parametrize("x_dtype, s_dtype", [(F16, F16), (F16, F32), (F32, F16), (F64, F64)])
def test_rmsnorm_dtypes(rng, x_dtype, s_dtype):
    """Y takes the scale's dtype; float16 X accumulates in float32."""
    feeds = {"x": rand(rng, (3, 16), x_dtype), "s": rand(rng, (16,), s_dtype)}
    tol = TOL[F16] if F16 in (x_dtype, s_dtype) else TOL[x_dtype]
    check_node("RMSNormalization", feeds, opset=23, **tol)


@pytest.mark.parametrize("s_shape", [(1,), (1, 5), (3, 1)])
def test_rmsnorm_broadcast_and_constant_scale(rng, s_shape):
    feeds = {"x": rand(rng, (2, 3, 5)), "s": rand(rng, s_shape)}
    check_node("RMSNormalization", feeds, {"axis": 1}, constants={"s"}, opset=23, **TOL[F32])


def test_rmsnorm_large_values_in_float16(rng):
    """Squares of float16 values past 256 overflow float16: the sums are float32."""
    feeds = {"x": rand(rng, (2, 24), F16, offset=300.0), "s": positive(rng, (24,), F16)}
    check_node("RMSNormalization", feeds, opset=23, **TOL[F16])


@pytest.mark.parametrize("shape", [(0, 4), (3, 0)])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's mean of an empty row
def test_rmsnorm_empty(rng, shape):
    check_node("RMSNormalization", {"x": rand(rng, shape), "s": rand(rng, shape[1:])}, opset=23)


# --------------------------------------------------------------------------- InstanceNormalization


@pytest.mark.parametrize("shape, dtype", [((2, 3, 5), F32), ((1, 2, 3, 3), F32), ((2, 2, 7), F16), ((2, 3, 1, 2), F64)])
def test_instancenorm(rng, shape, dtype):
    c = shape[1]
    feeds = {"x": rand(rng, shape, dtype), "s": rand(rng, (c,), dtype), "b": rand(rng, (c,), dtype)}
    check_node("InstanceNormalization", feeds, {"epsilon": 1e-4}, **TOL[dtype])


def test_instancenorm_constant_params(rng):
    feeds = {"x": rand(rng, (2, 3, 4)), "s": rand(rng, (3,)), "b": rand(rng, (3,))}
    check_node("InstanceNormalization", feeds, constants={"s", "b"}, **TOL[F32])


# --------------------------------------------------------------------------- GroupNormalization


@pytest.mark.parametrize("shape, groups", [((2, 4, 3), 2), ((1, 6, 2, 2), 3), ((2, 3, 5), 1), ((1, 4, 3), 4)])
def test_groupnorm_opset21_per_channel(rng, shape, groups):
    c = shape[1]
    feeds = {"x": rand(rng, shape), "s": rand(rng, (c,)), "b": rand(rng, (c,))}
    check_node("GroupNormalization", feeds, {"num_groups": groups, "epsilon": 1e-3}, opset=21, **TOL[F32])


@pytest.mark.parametrize("dtype", [F32, F16, F64])
def test_groupnorm_opset18_per_group(rng, dtype):
    feeds = {"x": rand(rng, (2, 6, 3), dtype), "s": rand(rng, (3,), dtype), "b": rand(rng, (3,), dtype)}
    check_node("GroupNormalization", feeds, {"num_groups": 3}, opset=18, **TOL[dtype])


# --------------------------------------------------------------------------- MeanVarianceNormalization


@pytest.mark.parametrize("shape, axes", [((2, 3, 2, 2), None), ((2, 3, 4), [1]), ((2, 3, 4), [-1]),
                                         ((3, 2, 5), [0, 1]), ((3, 4), [0]), ((2, 3, 2, 2), [0, -1]),
                                         ((2, 3), [0, 1]), ((5,), [0])])
def test_mvn_axes(rng, shape, axes):
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", {"x": rand(rng, shape, offset=3.0)}, attrs, opset=13, **TOL[F32])


@pytest.mark.parametrize("dtype", [F16, F64])
def test_mvn_dtypes(rng, dtype):
    check_node("MeanVarianceNormalization", {"x": rand(rng, (2, 3, 2, 3), dtype)}, {"axes": [0, 2]}, opset=13,
               **TOL[dtype])


# --------------------------------------------------------------------------- BatchNormalization


def _bn_feeds(rng, shape, dtype=F32, pdtype=None, p_shape=None):
    pdtype = pdtype or dtype
    p_shape = p_shape or (shape[1],)
    return {"x": rand(rng, shape, dtype), "s": rand(rng, p_shape, pdtype), "b": rand(rng, p_shape, pdtype),
            "m": rand(rng, p_shape, pdtype), "v": positive(rng, p_shape, pdtype)}


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 4, 2, 3)])
@pytest.mark.parametrize("constants", [(), ("s", "b", "m", "v"), ("s", "v")])
def test_batchnorm_inference(rng, shape, constants):
    names = tactic_names("BatchNormalization", _bn_feeds(rng, shape), constants=constants, opset=15)
    expected = ["channel_affine_const", "channel_affine"] if len(constants) == 4 else ["channel_affine"]
    assert names == expected
    check_node("BatchNormalization", _bn_feeds(rng, shape), {"epsilon": 1e-3}, constants=constants, opset=15,
               **TOL[F32])


@pytest.mark.parametrize("dtype", [F16, F64])
def test_batchnorm_dtypes(rng, dtype):
    check_node("BatchNormalization", _bn_feeds(rng, (2, 3, 4), dtype), opset=15, **TOL[dtype])
    check_node("BatchNormalization", _bn_feeds(rng, (2, 3, 4), dtype), constants={"s", "b", "m", "v"}, opset=15,
               **TOL[dtype])


def test_batchnorm_float16_data_float32_params(rng):
    check_node("BatchNormalization", _bn_feeds(rng, (2, 3, 4), F16, F32), opset=15, **TOL[F16])


def test_batchnorm_spatial0_opset7(rng):
    feeds = _bn_feeds(rng, (2, 3, 2, 2), p_shape=(3, 2, 2))
    check_node("BatchNormalization", feeds, {"spatial": 0}, opset=7, **TOL[F32])
    check_node("BatchNormalization", feeds, {"spatial": 0}, constants=set(feeds) - {"x"}, opset=7, **TOL[F32])


def test_batchnorm_inference_running_outputs(rng):
    check_node("BatchNormalization", _bn_feeds(rng, (2, 3, 4)), opset=15, n_outputs=3, **TOL[F32])


@pytest.mark.parametrize("shape, n_outputs", [((4, 3, 5), 3), ((5, 2), 3), ((2, 3, 2, 2), 1)])
def test_batchnorm_training_mode(rng, shape, n_outputs):
    check_node("BatchNormalization", _bn_feeds(rng, shape), {"training_mode": 1, "momentum": 0.8}, opset=15,
               n_outputs=n_outputs, **TOL[F32])


def test_batchnorm_empty_batch(rng):
    check_node("BatchNormalization", _bn_feeds(rng, (0, 3, 2)), opset=15)


# --------------------------------------------------------------------------- LRN


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_lrn_sizes(rng, size):
    check_node("LRN", {"x": rand(rng, (2, 5, 2, 3))}, {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5},
               **TOL[F32])


@pytest.mark.parametrize("shape, dtype", [((3, 4), F32), ((1, 6, 5), F16), ((2, 3, 3), F64), ((0, 3), F32)])
def test_lrn_shapes_dtypes(rng, shape, dtype):
    check_node("LRN", {"x": rand(rng, shape, dtype)}, {"size": 3, "alpha": 0.1}, **TOL[dtype])


# --------------------------------------------------------------------------- real GPU geometries

@pytest.mark.gpu
@pytest.mark.skipif(simulated(), reason="GPU only: the simulator launches a few threads")
@pytest.mark.parametrize("shape", [(512, 32), (64, 768), (4, 5000), (3, 100003)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_gpu_layernorm_full_blocks(rng, shape, dtype):
    """Every block shape the heuristic picks, at transformer sizes (bx 32 to 256, stacked rows)."""
    feeds = {"x": rand(rng, shape, dtype, offset=2.0), "s": rand(rng, shape[-1:], dtype), "b": rand(rng, shape[-1:], dtype)}
    check_node("LayerNormalization", feeds, {"axis": -1}, n_outputs=3, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(simulated(), reason="GPU only: the simulator launches a few threads")
@pytest.mark.parametrize("shape", [(512, 32), (64, 4096), (3, 100003)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_gpu_rmsnorm_full_blocks(rng, shape, dtype):
    feeds = {"x": rand(rng, shape, dtype), "s": rand(rng, shape[-1:], dtype)}
    check_node("RMSNormalization", feeds, opset=23, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(simulated(), reason="GPU only: the simulator launches a few threads")
def test_gpu_other_ops_full_size(rng):
    check_node("InstanceNormalization", {"x": rand(rng, (2, 8, 1000)), "s": rand(rng, (8,)), "b": rand(rng, (8,))},
               **TOL[F32])
    check_node("GroupNormalization", {"x": rand(rng, (2, 32, 7, 7)), "s": rand(rng, (32,)), "b": rand(rng, (32,))},
               {"num_groups": 8}, opset=21, **TOL[F32])
    check_node("MeanVarianceNormalization", {"x": rand(rng, (4, 8, 16, 16))}, opset=13, **TOL[F32])
    check_node("BatchNormalization", _bn_feeds(rng, (8, 64, 14, 14)), opset=15, constants={"s", "b", "m", "v"},
               **TOL[F32])
    check_node("BatchNormalization", _bn_feeds(rng, (16, 8, 9, 9)), {"training_mode": 1}, opset=15, n_outputs=3,
               **TOL[F32])
    check_node("LRN", {"x": rand(rng, (2, 16, 8, 8))}, {"size": 5}, **TOL[F32])


# --------------------------------------------------------------------------- GPU typing


def test_row_norm_kernels_compile_for_the_gpu():
    """The row kernel centered (LayerNorm) and not (RMSNorm), float16 and float32 X, Y of
    another dtype, every block shape the heuristic offers, typed for sm_90; float32 data
    stays free of float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.normalization import row_norm as rn

        T = arr(np.int64)
        sizes = ((512, 32), (64, 4096), (3, 100003))
        shapes = sorted({g for rows, cols in sizes for g in rn.row_geometries(rows, cols)})
        for x_dt, y_dt in (("float32", "float32"), ("float16", "float16"), ("float16", "float32")):
            acc = scalar(np.float32)
            for centered in (True, False):
                for bx, by in shapes:
                    kernel = rn.row_norm_kernel("float32", False, rn.PER_COL, rn.ABSENT if not centered else rn.PER_COL,
                                                centered, rn.INV_STD if centered else rn.NO_STAT, bx, by, centered)
                    args = [arr(x_dt), arr(y_dt), I64, I64, acc, acc, T, T, arr(y_dt), I64, T, T,
                            arr(y_dt) if centered else arr(np.float32), I64, T, T, arr(np.float32), arr(np.float32)]
                    check(f"row norm {x_dt}->{y_dt} centered={centered} {bx}x{by}", kernel, args, True)
    """)
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- LpNormalization


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape, axis", [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 5), 1), ((2, 1, 3), -2)])
def test_lp_normalization(rng, p, shape, axis):
    for dtype in (F32, F16, F64):
        check_node("LpNormalization", {"x": rand(rng, shape, dtype)}, {"axis": axis, "p": p}, **TOL[dtype])


def test_lp_normalization_zero_lines_give_zeros(rng):
    x = rand(rng, (3, 4))
    x[1] = 0
    for p in (1, 2):
        want = check_node("LpNormalization", {"x": x}, {"p": p}, opset=22)[0]
        assert (want[1] == 0).all() and np.isfinite(want).all()


def test_lp_normalization_matches_onnxruntime(rng):
    import onnxruntime

    x = rand(rng, (2, 3, 4))
    for attrs in ({}, {"p": 1, "axis": 0}, {"p": 2, "axis": -2}):
        model = single_node_model("LpNormalization", {"x": x}, attrs, opset=1)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = session.run(None, {"x": x})[0]
        got = check_node("LpNormalization", {"x": x}, attrs, opset=1)[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("x, attrs, error, message", [
    (np.ones((2, 3), F32), {"p": 3}, "UnsupportedError", "p=3.*p=1 or p=2"),
    (np.ones((2, 3), F32), {"axis": 2}, "ShapeError", "axis 2 is out of range.*\\[-2, 1\\]"),
    (np.ones((2, 3), np.int32), {}, "UnsupportedError", "dtype int32"),
])
def test_lp_normalization_refuses_bad_nodes(x, attrs, error, message):
    import plugrt

    with pytest.raises(getattr(plugrt, error), match=f"test_lpnormalization.*{message}"):
        check_node("LpNormalization", {"x": x}, attrs)


def test_lp_norm_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile LpNormalization's kernel for sm_90."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.normalization import lp_norm
        for dt in ("float16", "float32", "float64"):
            for p in (1, 2):
                check(f"lp_norm {dt} p={p}", lp_norm.lp_norm_kernel(dt, p), [arr(dt), arr(dt), I64, I64, I64],
                      dt != "float64")
    """)
    assert not failures, "\n".join(failures)
