"""Matmul and normalization references against onnxruntime, on attribute spaces the ONNX
node cases cover thinly: odd sizes, 1-D and broadcast operands, negative axes, optional
inputs and outputs, float16/float64/integer dtypes, symbolic graph-input dims."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

import plugrt
from plugrt.onnx import backend

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {np.dtype(F16): (1e-2, 1e-2), np.dtype(F32): (1e-4, 1e-5), np.dtype(F64): (1e-10, 1e-12)}


def _vi(name, dtype, shape):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(op, inputs, outputs, opset=17, inits=(), **attrs):
    """A one-node model. ``inputs``: (name, dtype, shape) or "" (omitted optional);
    ``outputs``: (name, dtype) or "" (omitted); ``inits``: name -> array (constants)."""
    inits = dict(inits)
    node = helper.make_node(op, [i if isinstance(i, str) else i[0] for i in inputs],
                            [o if isinstance(o, str) else o[0] for o in outputs], name=f"{op.lower()}_node", **attrs)
    graph_inputs = [_vi(*i) for i in inputs if not isinstance(i, str) and i[0] not in inits]
    graph_outputs = [_vi(o[0], o[1], None) for o in outputs if not isinstance(o, str)]
    initializers = [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_both(model, feeds):
    ours = backend.prepare(model, "CPU").run(dict(feeds))
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, dict(feeds))
    return list(ours), theirs


def check_against_ort(model, feeds, tol=None):
    ours, theirs = run_both(model, feeds)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a = np.asarray(a)
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs onnxruntime {b.dtype}"
        assert a.shape == b.shape, f"output {i}: shape {a.shape} vs onnxruntime {b.shape}"
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
        else:
            rtol, atol = tol or TOL[a.dtype]
            np.testing.assert_allclose(a.astype(F64), b.astype(F64), rtol=rtol, atol=atol, err_msg=f"output {i}")
    return ours


def rand(rng, shape, dtype=F32, low=None):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -8), min(info.max, 8) + 1, size=shape, dtype=dtype)
    x = rng.standard_normal(shape) if low is None else rng.uniform(low, 1.5, size=shape)
    return x.astype(dtype)


# ----------------------------------------------------------------------------- MatMul

@pytest.mark.parametrize("a_shape,b_shape", [
    ((7,), (7,)), ((7,), (7, 3)), ((5, 7), (7,)), ((2, 1, 5, 7), (7,)), ((7,), (4, 7, 3)),
    ((3, 5, 7), (7, 2)), ((1, 5, 7), (4, 7, 3)), ((2, 1, 5, 7), (3, 7, 6)), ((1, 1), (1, 9)),
])
def test_matmul_shapes(rng, a_shape, b_shape):
    model = make_model("MatMul", [("a", F32, a_shape), ("b", F32, b_shape)], [("y", F32)])
    check_against_ort(model, {"a": rand(rng, a_shape), "b": rand(rng, b_shape)})


@pytest.mark.parametrize("dtype", [F16, F64, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(rng, dtype):
    model = make_model("MatMul", [("a", dtype, (2, 3, 5)), ("b", dtype, (5, 4))], [("y", dtype)])
    a, b = rand(rng, (2, 3, 5), dtype), rand(rng, (5, 4), dtype)
    check_against_ort(model, {"a": a, "b": b})


def test_matmul_symbolic_dims(rng):
    model = make_model("MatMul", [("a", F32, ("B", "S", 6)), ("b", F32, (6, "D"))], [("y", F32)])
    rep = backend.prepare(model, "CPU")
    assert rep.graph.values["y"].info.shape == ("B", "S", "D")
    check_against_ort(model, {"a": rand(rng, (3, 5, 6)), "b": rand(rng, (6, 2))})


def test_matmul_constant_folds(rng):
    w = rand(rng, (6, 3))
    model = make_model("MatMul", [("a", F32, (2, 6)), ("w", F32, (6, 3))], [("y", F32)], inits={"w": w})
    check_against_ort(model, {"a": rand(rng, (2, 6))})


def test_matmul_shape_mismatch_names_node():
    model = make_model("MatMul", [("a", F32, (2, 5)), ("b", F32, (4, 3))], [("y", F32)])
    with pytest.raises(plugrt.PlugrtError, match="matmul_node"):
        backend.prepare(model, "CPU")


# ----------------------------------------------------------------------------- Gemm

@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (3, 1), (3, 5)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm(rng, c_shape, trans):
    ta, tb = trans
    m, k, n = 3, 7, 5
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    inputs = [("a", F32, a_shape), ("b", F32, b_shape)]
    feeds = {"a": rand(rng, a_shape), "b": rand(rng, b_shape)}
    if c_shape is not None:
        inputs.append(("c", F32, c_shape))
        feeds["c"] = rand(rng, c_shape)
    model = make_model("Gemm", inputs, [("y", F32)], alpha=0.75, beta=-1.5, transA=ta, transB=tb)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", [F16, F64])
def test_gemm_dtypes(rng, dtype):
    model = make_model("Gemm", [("a", dtype, (4, 3)), ("b", dtype, (3, 6)), ("c", dtype, (6,))], [("y", dtype)])
    feeds = {"a": rand(rng, (4, 3), dtype), "b": rand(rng, (3, 6), dtype), "c": rand(rng, (6,), dtype)}
    check_against_ort(model, feeds)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_gemm_integer(rng, dtype):  # onnxruntime has no integer Gemm kernel
    model = make_model("Gemm", [("a", dtype, (3, 4)), ("b", dtype, (6, 3)), ("c", dtype, (4, 1))], [("y", dtype)],
                       transA=1, transB=1)
    a, b, c = rand(rng, (3, 4), dtype), rand(rng, (6, 3), dtype), rand(rng, (4, 1), dtype)
    (y,) = backend.prepare(model, "CPU").run({"a": a, "b": b, "c": c})
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, a.T @ b.T + c)


def test_gemm_symbolic_batch_and_omitted_c(rng):
    w = rand(rng, (8, 5))
    model = make_model("Gemm", [("a", F32, ("N", 5)), ("w", F32, (8, 5)), ""], [("y", F32)],
                       inits={"w": w}, transB=1, alpha=2.0)
    rep = backend.prepare(model, "CPU")
    assert rep.graph.values["y"].info.shape == ("N", 8)
    check_against_ort(model, {"a": rand(rng, (11, 5))})


# ----------------------------------------------------------------------------- MatMulInteger

@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer(rng, a_dtype, b_dtype):
    a = rng.integers(np.iinfo(a_dtype).min, np.iinfo(a_dtype).max + 1, size=(2, 3, 9), dtype=a_dtype)
    b = rng.integers(np.iinfo(b_dtype).min, np.iinfo(b_dtype).max + 1, size=(9, 4), dtype=b_dtype)
    a_zp = np.array(rng.integers(0, 100), dtype=a_dtype)
    b_zp = rng.integers(0, 100, size=(4,), dtype=b_dtype)
    model = make_model("MatMulInteger", [("a", a_dtype, a.shape), ("b", b_dtype, b.shape),
                                         ("azp", a_dtype, ()), ("bzp", b_dtype, (4,))],
                       [("y", np.int32)], opset=10)
    feeds = {"a": a, "b": b, "azp": a_zp, "bzp": b_zp}
    exact = (a.astype(np.int64) - a_zp.astype(np.int64)) @ (b.astype(np.int64) - b_zp.astype(np.int64))
    if (a_dtype, b_dtype) == (np.uint8, np.int8):
        # onnxruntime's u8 x s8 kernel saturates its pair sums on AVX2 CPUs without VNNI
        # (pmaddubsw): exact integer math is the oracle here.
        (y,) = backend.prepare(model, "CPU").run(feeds)
        np.testing.assert_array_equal(y, exact.astype(np.int32))
        return
    (y,) = check_against_ort(model, feeds)
    np.testing.assert_array_equal(y, exact.astype(np.int32))


def test_matmul_integer_per_row_zero_point():
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.uint8)
    b = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.uint8)
    model = make_model("MatMulInteger", [("a", np.uint8, (2, 3)), ("b", np.uint8, (3, 2)), ("azp", np.uint8, (2,))],
                       [("y", np.int32)], opset=10)
    (y,) = backend.prepare(model, "CPU").run({"a": a, "b": b, "azp": np.array([1, 4], dtype=np.uint8)})
    expected = (a.astype(np.int32) - np.array([[1], [4]])) @ b.astype(np.int32)
    np.testing.assert_array_equal(y, expected)
    assert y.dtype == np.int32


# ----------------------------------------------------------------------------- BatchNormalization

@pytest.mark.parametrize("shape", [(3, 5), (2, 5, 7), (2, 5, 3, 1, 4)])
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_batchnorm_inference(rng, shape, dtype):
    c = shape[1]
    names = ("x", "s", "b", "mean", "var")
    inputs = [("x", dtype, shape)] + [(n, dtype, (c,)) for n in names[1:]]
    feeds = {"x": rand(rng, shape, dtype), "s": rand(rng, (c,), dtype), "b": rand(rng, (c,), dtype),
             "mean": rand(rng, (c,), dtype), "var": rand(rng, (c,), dtype, low=0.2)}
    model = make_model("BatchNormalization", inputs, [("y", dtype)], opset=15, epsilon=1e-3)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("opset", [7, 9, 14])
def test_batchnorm_older_opsets_symbolic(rng, opset):
    inputs = [("x", F32, ("N", 4, "H", "W"))] + [(n, F32, (4,)) for n in ("s", "b", "mean", "var")]
    feeds = {"x": rand(rng, (3, 4, 5, 6)), "s": rand(rng, (4,)), "b": rand(rng, (4,)),
             "mean": rand(rng, (4,)), "var": rand(rng, (4,), low=0.2)}
    check_against_ort(make_model("BatchNormalization", inputs, [("y", F32)], opset=opset), feeds)


def test_batchnorm_spatial0_opset7(rng):
    x = rand(rng, (2, 3, 4))
    params = {n: rand(rng, (3, 4), low=0.2 if n == "var" else None) for n in ("s", "b", "mean", "var")}
    inputs = [("x", F32, x.shape)] + [(n, F32, (3, 4)) for n in params]
    model = make_model("BatchNormalization", inputs, [("y", F32)], opset=7, spatial=0, epsilon=1e-2)
    (y,) = backend.prepare(model, "CPU").run({"x": x, **params})
    p = {k: v.astype(F64) for k, v in params.items()}
    expected = (x - p["mean"]) / np.sqrt(p["var"] + 1e-2) * p["s"] + p["b"]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_batchnorm_training_mode(rng):
    x = rand(rng, (3, 4, 5))
    params = {"s": rand(rng, (4,)), "b": rand(rng, (4,)), "mean": rand(rng, (4,)), "var": rand(rng, (4,), low=0.2)}
    inputs = [("x", F32, x.shape)] + [(n, F32, (4,)) for n in params]
    model = make_model("BatchNormalization", inputs, [("y", F32), ("rm", F32), ("rv", F32)],
                       opset=15, training_mode=1, momentum=0.8, epsilon=1e-3)
    y, rm, rv = backend.prepare(model, "CPU").run({"x": x, **params})
    xd = x.astype(F64)
    mu, var = xd.mean(axis=(0, 2)), xd.var(axis=(0, 2))
    expected = (xd - mu[:, None]) / np.sqrt(var[:, None] + 1e-3) * params["s"][:, None] + params["b"][:, None]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm, params["mean"] * 0.8 + mu * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, params["var"] * 0.8 + var * 0.2, rtol=1e-5, atol=1e-6)


def test_batchnorm_training_outputs_before_opset14_unsupported():
    inputs = [("x", F32, (2, 3, 4))] + [(n, F32, (3,)) for n in ("s", "b", "mean", "var")]
    outputs = [("y", F32), ("m", F32), ("v", F32), ("sm", F32), ("sv", F32)]
    model = make_model("BatchNormalization", inputs, outputs, opset=9)
    with pytest.raises(plugrt.UnsupportedError, match="batchnormalization_node"):
        backend.prepare(model, "CPU")


# ----------------------------------------------------------------------------- InstanceNormalization

@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 4, 3, 5), (2, 2, 3, 1, 4)])
def test_instancenorm(rng, shape):
    c = shape[1]
    model = make_model("InstanceNormalization", [("x", F32, shape), ("s", F32, (c,)), ("b", F32, (c,))],
                       [("y", F32)], epsilon=1e-2)
    check_against_ort(model, {"x": rand(rng, shape), "s": rand(rng, (c,)), "b": rand(rng, (c,))})


def test_instancenorm_float16_symbolic(rng):
    model = make_model("InstanceNormalization", [("x", F16, ("N", 3, "L")), ("s", F16, (3,)), ("b", F16, (3,))],
                       [("y", F16)])
    check_against_ort(model, {"x": rand(rng, (2, 3, 9), F16), "s": rand(rng, (3,), F16), "b": rand(rng, (3,), F16)})


# ----------------------------------------------------------------------------- LayerNormalization

@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), -1), ((2, 3, 5), 1), ((2, 3, 5), -2),
                                        ((2, 3, 1, 5), -1), ((2, 3, 4, 5), 0)])
def test_layernorm_axes(rng, shape, axis):
    norm = shape[axis % len(shape):]
    model = make_model("LayerNormalization", [("x", F32, shape), ("s", F32, norm), ("b", F32, norm)],
                       [("y", F32), ("mean", F32), ("inv", F32)], axis=axis, epsilon=1e-3)
    check_against_ort(model, {"x": rand(rng, shape), "s": rand(rng, norm), "b": rand(rng, norm)})


@pytest.mark.parametrize("dtype", [F16, F64])
def test_layernorm_stats_are_float32(rng, dtype):
    model = make_model("LayerNormalization", [("x", dtype, (4, 6)), ("s", dtype, (6,)), ("b", dtype, (6,))],
                       [("y", dtype), ("mean", F32), ("inv", F32)])
    y, mean, inv = check_against_ort(model, {"x": rand(rng, (4, 6), dtype), "s": rand(rng, (6,), dtype),
                                            "b": rand(rng, (6,), dtype)})
    assert y.dtype == dtype and mean.dtype == F32 and inv.dtype == F32


def test_layernorm_optional_outputs_no_bias_symbolic(rng):
    model = make_model("LayerNormalization", [("x", F32, ("B", "S", 8)), ("s", F32, (8,))],
                       [("y", F32), "", ("inv", F32)])
    rep = backend.prepare(model, "CPU")
    assert rep.graph.values["inv"].info.shape == ("B", "S", 1)
    check_against_ort(model, {"x": rand(rng, (2, 3, 8)), "s": rand(rng, (8,))})


def test_layernorm_broadcast_scale(rng):
    model = make_model("LayerNormalization", [("x", F32, (2, 3, 4)), ("s", F32, (1, 4)), ("b", F32, (4,))],
                       [("y", F32), ("mean", F32)], axis=-2)
    check_against_ort(model, {"x": rand(rng, (2, 3, 4)), "s": rand(rng, (1, 4)), "b": rand(rng, (4,))})


def test_layernorm_stash_type_unsupported():
    model = make_model("LayerNormalization", [("x", F32, (2, 3)), ("s", F32, (3,))], [("y", F32)], stash_type=16)
    with pytest.raises(plugrt.UnsupportedError, match="layernormalization_node.*stash_type"):
        backend.prepare(model, "CPU")


# ----------------------------------------------------------------------------- GroupNormalization

@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((1, 6, 2, 3), 1), ((2, 4, 3, 3), 4), ((3, 6), 2)])
def test_groupnorm_opset21(rng, shape, groups):
    c = shape[1]
    model = make_model("GroupNormalization", [("x", F32, shape), ("s", F32, (c,)), ("b", F32, (c,))],
                       [("y", F32)], opset=21, num_groups=groups, epsilon=1e-3)
    check_against_ort(model, {"x": rand(rng, shape), "s": rand(rng, (c,)), "b": rand(rng, (c,))})


def test_groupnorm_opset18_per_group_params(rng):
    x, s, b = rand(rng, (2, 6, 4)), rand(rng, (3,)), rand(rng, (3,))
    model = make_model("GroupNormalization", [("x", F32, x.shape), ("s", F32, (3,)), ("b", F32, (3,))],
                       [("y", F32)], opset=18, num_groups=3)
    (y,) = backend.prepare(model, "CPU").run({"x": x, "s": s, "b": b})
    g = x.astype(F64).reshape(2, 3, 8)
    norm = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    expected = (norm * s[None, :, None] + b[None, :, None]).reshape(x.shape)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- MVN, LRN

@pytest.mark.parametrize("shape,axes", [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]), ((3, 7), [-1]),
                                        ((2, 3, 5), [0, 1]), ((2, 3, 4, 5), [2, 3])])
def test_mvn(rng, shape, axes):
    attrs = {} if axes is None else {"axes": axes}
    model = make_model("MeanVarianceNormalization", [("x", F32, shape)], [("y", F32)], **attrs)
    check_against_ort(model, {"x": rand(rng, shape)})


@pytest.mark.parametrize("size", [1, 3, 5, 9])
def test_lrn(rng, size):
    model = make_model("LRN", [("x", F32, ("N", 7, 3, 4))], [("y", F32)],
                       size=size, alpha=0.3, beta=0.6, bias=1.5)
    check_against_ort(model, {"x": rand(rng, (2, 7, 3, 4))})


def test_lrn_float16(rng):
    model = make_model("LRN", [("x", F16, (1, 5, 2, 3))], [("y", F16)], size=3)
    check_against_ort(model, {"x": rand(rng, (1, 5, 2, 3), F16)})


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size(rng, size):  # onnxruntime refuses even sizes; the spec's window is asymmetric
    x = rand(rng, (2, 5, 3))
    model = make_model("LRN", [("x", F32, x.shape)], [("y", F32)], size=size, alpha=0.3, beta=0.6, bias=1.5)
    (y,) = backend.prepare(model, "CPU").run({"x": x})
    xd = x.astype(F64)
    expected = np.empty_like(xd)
    for c in range(5):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + int(np.ceil((size - 1) / 2)) + 1)
        square_sum = (xd[:, lo:hi] ** 2).sum(axis=1)
        expected[:, c] = xd[:, c] / (1.5 + 0.3 / size * square_sum) ** 0.6
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
