"""The builtin-quant references (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
ConvInteger) against independent NumPy math and onnxruntime on fresh random inputs, and
the errors bad nodes get."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

from plugrt import ModelError, ShapeError, UnsupportedError
from plugrt.onnx import import_model
from plugrt.onnx.backend import prepare
from plugrt.plugin import POINTWISE

QUANT = [np.int8, np.uint8, np.int16, np.uint16]


def _model(op, feeds, attrs=None, opset=21, constants=(), n_outputs=1):
    inputs = [helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(np.asarray(v).dtype), np.shape(v))
              for n, v in feeds.items() if v is not None and n not in constants]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in feeds.items() if n in constants]
    outputs = ["y", "y_scale", "y_zero_point"][:n_outputs]
    node = helper.make_node(op, [n if v is not None else "" for n, v in feeds.items()], outputs, name=f"my_{op}",
                            **dict(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _runtime(feeds, constants=()):
    return {n: np.asarray(v) for n, v in feeds.items() if v is not None and n not in constants}


def _ours(model, feeds, constants=()):
    return prepare(model, "CPU").run(_runtime(feeds, constants))


def _ort(model, feeds, constants=()):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, _runtime(feeds, constants))


def _onnx_reference(model, feeds, constants=()):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, _runtime(feeds, constants))


def _both(op, feeds, attrs=None, opset=21, constants=(), n_outputs=1, against=_ort):
    """Our reference's outputs and onnxruntime's (or ONNX's reference's), checked for equal
    dtypes and shapes."""
    model = _model(op, feeds, attrs, opset, constants, n_outputs)
    got, want = _ours(model, feeds, constants), against(model, feeds, constants)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
    return got, want


def _quantized(x, scale, zero, dtype):
    """QuantizeLinear in float64: the quotient as ONNX divides (in the scale's float type),
    rounded half to even, shifted, clamped."""
    info = np.iinfo(dtype)
    q = np.rint((x.astype(np.float32) / scale.astype(np.float32)).astype(np.float64)) + zero
    return np.clip(q, info.min, info.max).astype(dtype)


# ----------------------------------------------------------------------------- QuantizeLinear


@pytest.mark.parametrize("dtype", QUANT)
def test_quantize_per_tensor(rng, dtype):
    x = (rng.standard_normal((3, 4, 5)) * 40).astype(np.float32)
    scale, zero = np.float32(rng.uniform(0.05, 0.5)), dtype(rng.integers(0, 20))
    got, want = _both("QuantizeLinear", {"x": x, "s": scale, "z": zero})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[0], _quantized(x, scale, zero, dtype))


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e9, -1e9, 126.5, 127.5, 3.4999], np.float32)
    for zero, want in ((np.int8(0), [0, 2, 2, 0, -2, -2, 127, -128, 126, 127, 3]),
                       (np.uint8(10), [10, 12, 12, 10, 8, 8, 255, 0, 136, 138, 13])):
        got, ort = _both("QuantizeLinear", {"x": x, "s": np.float32(1), "z": zero})
        np.testing.assert_array_equal(got[0], want)
        np.testing.assert_array_equal(got[0], ort[0])


def test_one_element_scale_and_zero_point_of_different_ranks(rng):
    x = (rng.standard_normal((3, 4)) * 20).astype(np.float32)
    got, want = _both("QuantizeLinear", {"x": x, "s": np.array([0.2], np.float32), "z": np.int8(-1)},
                      constants=("s", "z"))
    np.testing.assert_array_equal(got[0], want[0])


def test_quantize_without_zero_point_is_uint8(rng):
    x = (rng.standard_normal((4, 6)) * 20).astype(np.float32)
    got, want = _both("QuantizeLinear", {"x": x, "s": np.float32(0.25)}, opset=13)
    assert got[0].dtype == np.uint8
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_per_axis(rng, axis, dtype):
    x = (rng.standard_normal((3, 4, 5)) * 30).astype(np.float32)
    n = x.shape[axis]
    scale = rng.uniform(0.05, 0.5, n).astype(np.float32)
    zero = rng.integers(0, 10, n).astype(dtype)
    got, want = _both("QuantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis}, opset=13)
    np.testing.assert_array_equal(got[0], want[0])
    shape = [1, 1, 1]
    shape[axis] = n
    np.testing.assert_array_equal(got[0], _quantized(x, scale.reshape(shape), zero.reshape(shape), dtype))


@pytest.mark.parametrize("axis, block", [(1, 2), (0, 3), (2, 4)])
def test_quantize_blocked(rng, axis, block):
    x = (rng.standard_normal((5, 6, 7)) * 30).astype(np.float32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    scale = rng.uniform(0.05, 0.5, shape).astype(np.float32)
    zero = rng.integers(-10, 10, shape).astype(np.int8)
    got, want = _both("QuantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis, "block_size": block},
                      constants=("s", "z"))
    np.testing.assert_array_equal(got[0], want[0])
    full = np.repeat(scale, block, axis).take(range(x.shape[axis]), axis)
    zfull = np.repeat(zero, block, axis).take(range(x.shape[axis]), axis)
    np.testing.assert_array_equal(got[0], _quantized(x, full, zfull.astype(np.float64), np.int8))


def test_quantize_float16_and_precision(rng):
    """float16 by float16 divides in float16 (ONNX's spec and reference; onnxruntime divides
    in float32, so it differs where the float16 quotient rounds across a half)."""
    x = (rng.standard_normal((4, 8)) * 30).astype(np.float16)
    feeds = {"x": x, "s": np.float16(0.3), "z": np.int8(2)}
    got = _ours(_model("QuantizeLinear", feeds, opset=19), feeds)
    q = np.rint((x / np.float16(0.3)).astype(np.float64)) + 2
    np.testing.assert_array_equal(got[0], np.clip(q, -128, 127).astype(np.int8))
    got, want = _both("QuantizeLinear", {"x": x, "s": np.float32(0.3), "z": np.int8(2)}, against=_onnx_reference)
    np.testing.assert_array_equal(got[0], want[0])  # a float32 scale: float32 division
    x32 = (rng.standard_normal((4, 8)) * 30).astype(np.float32)
    model = _model("QuantizeLinear", {"x": x32, "s": np.float32(0.3)}, {"precision": 10, "output_dtype": 3}, opset=25,
                   constants=("s",))
    q = np.rint((x32.astype(np.float16) / np.float16(0.3)).astype(np.float64))
    np.testing.assert_array_equal(_ours(model, {"x": x32})[0], np.clip(q, -128, 127).astype(np.int8))


def test_quantize_output_dtype(rng):
    x = (rng.standard_normal((2, 9)) * 300).astype(np.float32)
    got, want = _both("QuantizeLinear", {"x": x, "s": np.float32(0.5)}, {"output_dtype": 5})
    assert got[0].dtype == np.int16
    np.testing.assert_array_equal(got[0], want[0])


# ----------------------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("dtype", QUANT + [np.int32])
def test_dequantize_per_tensor(rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (3, 7), endpoint=True).astype(dtype)
    zero = None if dtype == np.int32 else dtype(rng.integers(0, 20))
    got, want = _both("DequantizeLinear", {"x": x, "s": np.float32(0.37), "z": zero})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    exact = (x.astype(np.float64) - (0 if zero is None else int(zero))) * np.float64(np.float32(0.37))
    np.testing.assert_allclose(got[0], exact, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 2])
def test_dequantize_per_axis_and_blocked(rng, axis):
    x = rng.integers(-128, 128, (4, 3, 6)).astype(np.int8)
    n = x.shape[axis]
    scale, zero = rng.uniform(0.1, 1, n).astype(np.float32), rng.integers(-5, 5, n).astype(np.int8)
    got, want = _both("DequantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis}, opset=13)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // 2)
    scale, zero = rng.uniform(0.1, 1, shape).astype(np.float32), rng.integers(-5, 5, shape).astype(np.int8)
    got, want = _both("DequantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis, "block_size": 2},
                      constants=("s", "z"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_dequantize_float16_and_output_dtype(rng):
    x = rng.integers(0, 256, (5, 5)).astype(np.uint8)
    got, want = _both("DequantizeLinear", {"x": x, "s": np.float16(0.01), "z": np.uint8(100)}, opset=19)
    assert got[0].dtype == np.float16
    np.testing.assert_array_equal(got[0], want[0])
    model = _model("DequantizeLinear", {"x": x, "s": np.float32(0.01)}, {"output_dtype": 10}, opset=23,
                   constants=("s",))
    got = _ours(model, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (x.astype(np.float32) * np.float32(0.01)).astype(np.float16))


def test_quantize_dequantize_roundtrip_within_half_a_step(rng):
    x = rng.uniform(-10, 10, 200).astype(np.float32)
    feeds = {"x": x, "s": np.float32(0.1), "z": np.int8(0)}
    q = _ours(_model("QuantizeLinear", feeds, constants=("s", "z")), feeds, ("s", "z"))[0]
    feeds = {"x": q, "s": np.float32(0.1), "z": np.int8(0)}
    y = _ours(_model("DequantizeLinear", feeds, constants=("s", "z")), feeds, ("s", "z"))[0]
    assert np.max(np.abs(y - x)) <= 0.05 + 1e-6


# ----------------------------------------------------------------------------- DynamicQuantizeLinear


@pytest.mark.parametrize("low, high", [(-3.0, 5.0), (0.5, 4.0), (-6.0, -1.0), (0.0, 0.0)])
def test_dynamic_quantize(rng, low, high):
    x = rng.uniform(low, high, (3, 17)).astype(np.float32)
    got, want = _both("DynamicQuantizeLinear", {"x": x}, opset=11, n_outputs=3)
    if low != high:  # all zeros: ONNX's reference says scale 1/255, onnxruntime 1 (y and zero point agree)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-7)
    np.testing.assert_array_equal(got[2], want[2])
    np.testing.assert_array_equal(got[0], want[0])
    lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
    assert got[1] == np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)


# ----------------------------------------------------------------------------- ConvInteger


def _conv_integer_loops(x, w, x_zp, w_zp, pads, strides, dilations, group):
    """ConvInteger of 2-D inputs by plain loops over int64 values (independent of the
    reference's im2col)."""
    n, c, h, width = x.shape
    m, cg, kh, kw = w.shape
    xs = np.pad(x.astype(np.int64) - int(x_zp), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ws = w.astype(np.int64) - np.asarray(w_zp, np.int64).reshape(-1, 1, 1, 1)
    oh = (xs.shape[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (xs.shape[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    y = np.zeros((n, m, oh, ow), np.int64)
    mg = m // group
    for o in range(m):
        g = o // mg
        for i in range(oh):
            for j in range(ow):
                window = xs[:, g * cg:(g + 1) * cg, i * strides[0]:i * strides[0] + (kh - 1) * dilations[0] + 1:dilations[0],
                            j * strides[1]:j * strides[1] + (kw - 1) * dilations[1] + 1:dilations[1]]
                y[:, o, i, j] = np.sum(window * ws[o], axis=(1, 2, 3))
    return y.astype(np.int32)


#: onnxruntime's int8 x uint8 ConvInteger differs from ONNX's reference and from plain loops
#: (its products saturate), so that pair is checked against ONNX's reference.
PAIRS = [(np.uint8, np.int8, _ort), (np.uint8, np.uint8, _ort), (np.int8, np.int8, _ort),
         (np.int8, np.uint8, _onnx_reference)]


@pytest.mark.parametrize("x_dtype, w_dtype, against", PAIRS, ids=["u8s8", "u8u8", "s8s8", "s8u8"])
@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 2, 0, 1], "strides": [2, 1]}, {"dilations": [2, 1], "group": 2},
                                   {"auto_pad": "SAME_LOWER", "strides": [2, 2]}])
def test_conv_integer_against_onnxruntime(rng, x_dtype, w_dtype, against, attrs):
    xi, wi = np.iinfo(x_dtype), np.iinfo(w_dtype)
    x = rng.integers(xi.min, xi.max, (2, 4, 7, 6), endpoint=True).astype(x_dtype)
    w = rng.integers(wi.min, wi.max, (6, 4 // attrs.get("group", 1), 3, 2), endpoint=True).astype(w_dtype)
    feeds = {"x": x, "w": w, "xz": x_dtype(rng.integers(0, 50)), "wz": w_dtype(rng.integers(0, 50))}
    got, want = _both("ConvInteger", feeds, attrs, opset=10, against=against)
    np.testing.assert_array_equal(got[0], want[0])
    if "auto_pad" not in attrs:
        loops = _conv_integer_loops(x, w, feeds["xz"], np.full(6, feeds["wz"]), attrs.get("pads", [0] * 4),
                                    attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), attrs.get("group", 1))
        np.testing.assert_array_equal(got[0], loops)


def test_conv_integer_per_channel_weight_zero_point_and_1d(rng):
    x = rng.integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (4, 3, 2, 2)).astype(np.int8)
    feeds = {"x": x, "w": w, "xz": np.uint8(120), "wz": np.array([0, 3, -7, 100], np.int8)}
    model = _model("ConvInteger", feeds, {"pads": [1, 1, 1, 1]}, opset=10, constants=("w", "wz"))
    got = _ours(model, feeds, ("w", "wz"))[0]
    np.testing.assert_array_equal(got, _conv_integer_loops(x, w, 120, feeds["wz"], [1, 1, 1, 1], [1, 1], [1, 1], 1))
    x1 = rng.integers(-128, 128, (2, 4, 9)).astype(np.int8)
    w1 = rng.integers(0, 256, (2, 4, 3)).astype(np.uint8)
    got, want = _both("ConvInteger", {"x": x1, "w": w1, "xz": np.int8(-3)}, {"strides": [2], "pads": [2, 0]}, opset=10,
                      against=_onnx_reference)
    np.testing.assert_array_equal(got[0], want[0])


# ----------------------------------------------------------------------------- QLinearConv, QLinearMatMul


@pytest.mark.parametrize("x_dtype, w_dtype", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_against_onnxruntime(rng, x_dtype, w_dtype, per_channel):
    x, w = rng.integers(0, 120, (2, 4, 6, 5)).astype(x_dtype), rng.integers(0, 100, (6, 2, 3, 3)).astype(w_dtype)
    w_scale = rng.uniform(0.005, 0.02, 6 if per_channel else ()).astype(np.float32)
    feeds = {"x": x, "xs": np.float32(0.03), "xz": x_dtype(rng.integers(0, 20)), "w": w, "ws": w_scale,
             "wz": w_dtype(0), "ys": np.float32(0.4), "yz": x_dtype(rng.integers(0, 20)),
             "b": rng.integers(-2000, 2000, 6).astype(np.int32)}
    attrs = {"group": 2, "pads": [1, 0, 1, 1], "strides": [1, 2]}
    got, want = _both("QLinearConv", feeds, attrs, opset=10, constants=("w", "ws", "wz", "b"))
    np.testing.assert_array_equal(got[0], want[0])
    reference = _onnx_reference(_model("QLinearConv", feeds, attrs, opset=10), feeds)[0]
    np.testing.assert_array_equal(got[0], reference)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("a_shape, b_shape", [((3, 5), (5, 4)), ((2, 3, 6), (6, 2)), ((2, 1, 3, 4), (3, 4, 5))])
def test_qlinear_matmul_against_onnxruntime(rng, dtype, a_shape, b_shape):
    info = np.iinfo(dtype)
    a, b = rng.integers(info.min, info.max, a_shape).astype(dtype), rng.integers(info.min, info.max, b_shape).astype(dtype)
    feeds = {"a": a, "as": np.float32(0.02), "az": dtype(3), "b": b, "bs": np.float32(0.03), "bz": dtype(5),
             "ys": np.float32(0.5), "yz": dtype(10)}
    got, want = _both("QLinearMatMul", feeds, opset=10)
    np.testing.assert_array_equal(got[0], want[0])
    half = {k: (v.astype(np.float16) if k in ("as", "bs", "ys") else v) for k, v in feeds.items()}
    half["bs"] = rng.uniform(0.01, 0.05, b_shape[-1]).astype(np.float16)  # per column
    half["bz"] = rng.integers(0, 10, b_shape[-1]).astype(dtype)
    got, want = _both("QLinearMatMul", half, opset=21, against=_onnx_reference)
    np.testing.assert_array_equal(got[0], want[0])


# ----------------------------------------------------------------------------- errors and contract


def _import_error(op, feeds, attrs=None, opset=21, constants=()):
    with pytest.raises((UnsupportedError, ModelError, ShapeError)) as info:
        import_model(_model(op, feeds, attrs, opset, constants))
    return info


def test_bad_nodes_are_refused_with_what_to_fix():
    x = np.zeros((2, 3), np.float32)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.float32(1)}, {"output_dtype": 17})
    assert info.type is UnsupportedError and "FLOAT8E4M3FN" in str(info.value) and "INT8" in str(info.value)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.float32(1), "z": np.int8(0)}, {"output_dtype": 2})
    assert info.type is ModelError and "output_dtype=UINT8" in str(info.value)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.ones(2, np.float32)}, {"axis": 1})
    assert info.type is ShapeError and "needs 3" in str(info.value)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.ones((2, 2), np.float32)}, {"axis": 1, "block_size": 1})
    assert info.type is ShapeError and "blocks of 1" in str(info.value)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.ones((2, 3), np.float32)})
    assert info.type is ShapeError and "block_size" in str(info.value)
    info = _import_error("QuantizeLinear", {"x": x, "s": np.float32(1)}, {"precision": 16})
    assert info.type is UnsupportedError and "BFLOAT16" in str(info.value)
    info = _import_error("DequantizeLinear", {"x": x, "s": np.float32(1)})
    assert info.type is UnsupportedError and "dequantize int8" in str(info.value)
    info = _import_error("DequantizeLinear", {"x": x.astype(np.int8), "s": np.float32(1), "z": np.uint8(0)})
    assert info.type is ModelError and "zero point" in str(info.value)
    w = np.zeros((4, 3, 1, 1), np.int8)
    xq = np.zeros((1, 3, 2, 2), np.uint8)
    info = _import_error("ConvInteger", {"x": xq, "w": w, "xz": np.zeros(3, np.uint8)}, opset=10)
    assert info.type is UnsupportedError and "scalar" in str(info.value)
    info = _import_error("ConvInteger", {"x": xq, "w": w, "xz": np.uint8(0), "wz": np.zeros(3, np.int8)}, opset=10)
    assert info.type is ShapeError and "output channels" in str(info.value)
    info = _import_error("ConvInteger", {"x": xq.astype(np.float32), "w": w}, opset=10)
    assert info.type is UnsupportedError
    f32 = np.float32
    qa = np.zeros((2, 3), np.uint8)
    info = _import_error("QLinearMatMul", {"a": qa, "as": np.ones(2, f32), "az": np.uint8(0), "b": qa.T.copy(),
                                           "bs": f32(1), "bz": np.uint8(0), "ys": f32(1), "yz": np.uint8(0)}, opset=21)
    assert info.type is UnsupportedError and "a_scale" in str(info.value) and "per-tensor" in str(info.value)
    info = _import_error("QLinearMatMul", {"a": qa, "as": f32(1), "az": np.uint8(0), "b": qa.T.copy(),
                                           "bs": np.float16(1), "bz": np.uint8(0), "ys": f32(1), "yz": np.uint8(0)},
                         opset=21)
    assert info.type is UnsupportedError and "one dtype" in str(info.value)
    info = _import_error("QLinearConv", {"x": xq, "xs": f32(1), "xz": np.uint8(0), "w": w, "ws": np.ones(3, f32),
                                         "wz": np.int8(0), "ys": f32(1), "yz": np.uint8(0)}, opset=10)
    assert info.type is ShapeError and "w_scale" in str(info.value)


def test_plugin_contract(registry):
    quantize = registry.find_op("", "QuantizeLinear", 21)
    dequantize = registry.find_op("", "DequantizeLinear", 21)
    assert POINTWISE in quantize.groups and POINTWISE in dequantize.groups
    assert dequantize.foldable is False and quantize.foldable is True
    graph = import_model(_model("QuantizeLinear", {"x": np.zeros((2, 3), np.float32), "s": np.ones(3, np.float32)},
                                {"axis": 1}, constants=("s",)))
    node = graph.nodes[0]
    assert quantize.pointwise(node, [graph.info(n) for n in node.inputs]) is None  # per-axis: its own kernel


def test_dequantize_of_a_constant_weight_is_not_folded():
    """Constant folding keeps DequantizeLinear(int8 weight): the Q/DQ fusion must see it. An
    int32 constant (a quantized bias) stays a node too, but inference knows its value."""
    w = np.arange(6, dtype=np.int8).reshape(2, 3)
    graph = import_model(_model("DequantizeLinear", {"w": w, "s": np.float32(0.5)}, constants=("w", "s")))
    assert [n.op_type for n in graph.nodes] == ["DequantizeLinear"]
    assert graph.info(graph.nodes[0].outputs[0]).value is None
    b = np.arange(-3, 3, dtype=np.int32)
    graph = import_model(_model("DequantizeLinear", {"b": b, "s": np.float32(0.5)}, constants=("b", "s")))
    assert [n.op_type for n in graph.nodes] == ["DequantizeLinear"]
    np.testing.assert_array_equal(graph.info(graph.nodes[0].outputs[0]).value, b * np.float32(0.5))
