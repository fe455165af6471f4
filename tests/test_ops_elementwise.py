"""Elementwise op references (arithmetic, variadic, Where, comparison, logic, BitShift,
Cast, CastLike, IsNaN, IsInf) against onnxruntime: broadcasting, odd sizes, signed
integer edge cases, symbolic dims."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper
from onnx.helper import np_dtype_to_tensor_dtype

import plugrt
from plugrt.onnx.backend import prepare
from plugrt.onnx.importer import import_model


def _model(op, feeds, attrs=None, opset=17, shapes=None, n_outputs=1):
    shapes = shapes or {}
    inputs = [helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(a.dtype), shapes.get(n, a.shape))
              for n, a in feeds.items()]
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, list(feeds), outputs, name=f"my_{op.lower()}", **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented as exc:
        pytest.skip(f"this onnxruntime has no kernel for the oracle: {exc}")  # e.g. BitShift uint16 in 1.30
    return session.run(None, feeds)[0]


def _compare(op, feeds, attrs=None, opset=17, shapes=None, rtol=1e-6, atol=0.0):
    model = _model(op, feeds, attrs, opset, shapes)
    expected = _ort(model, feeds)
    got = prepare(model, "CPU").run(feeds)[0]
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)
    return got


def _ints(rng, shape, dtype, low=-20, high=20, nonzero=False):
    info = np.iinfo(dtype)
    x = rng.integers(max(low, info.min), min(high, info.max), size=shape, endpoint=True).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


def _floats(rng, shape, dtype=np.float32, scale=3.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


BCAST = [((3, 1, 5), (4, 1)), ((2, 3, 4, 5), (5,)), ((1,), (3, 7)), ((), (2, 3)), ((6, 1), (1, 6))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("shapes", BCAST[:3])
def test_arithmetic_broadcast(rng, op, dtype, shapes):
    if np.dtype(dtype).kind == "f":
        a, b = _floats(rng, shapes[0], dtype), _floats(rng, shapes[1], dtype)
        if op == "Div":
            b[np.abs(b) < 0.1] = 0.5
    else:
        low = 0 if np.dtype(dtype).kind == "u" else -100
        a, b = _ints(rng, shapes[0], dtype, low, 100), _ints(rng, shapes[1], dtype, low, 100, nonzero=True)
    rtol = 1e-3 if dtype == np.float16 else 1e-6
    _compare(op, {"a": a, "b": b}, rtol=rtol)


def test_integer_div_truncates_toward_zero(rng):
    a = np.array([-7, 7, -7, 7, -1, 0, 5, -6], np.int32)
    b = np.array([2, 2, -2, -2, 3, -3, 5, 4], np.int32)
    got = _compare("Div", {"a": a, "b": b})
    np.testing.assert_array_equal(got, [-3, 3, 3, -3, 0, 0, 1, -1])
    _compare("Div", {"a": _ints(rng, (5, 9), np.int64, -1000, 1000), "b": _ints(rng, (9,), np.int64, nonzero=True)})


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.int64, np.uint16])
def test_mod_integers(rng, fmod, dtype):
    low = 0 if np.dtype(dtype).kind == "u" else -50
    feeds = {"a": _ints(rng, (4, 7), dtype, low, 50), "b": _ints(rng, (7,), dtype, low, 50, nonzero=True)}
    _compare("Mod", feeds, {"fmod": fmod})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_mod_float_fmod(rng, dtype):
    feeds = {"a": _floats(rng, (3, 5, 2), dtype), "b": _floats(rng, (5, 1), dtype) + dtype(0.25)}
    _compare("Mod", feeds, {"fmod": 1}, rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "xt, yt", [(np.float32, np.float32), (np.float32, np.int64), (np.int32, np.float32),
               (np.int64, np.int64), (np.int32, np.int32), (np.float64, np.int32), (np.float16, np.float16)])
def test_pow(rng, xt, yt):
    if np.dtype(xt).kind == "f":
        x = np.abs(_floats(rng, (3, 4), xt)) + xt(0.1)
    else:
        x = _ints(rng, (3, 4), xt, -6, 6)
    y = _floats(rng, (4,), yt, 1.5) if np.dtype(yt).kind == "f" else _ints(rng, (4,), yt, 0, 5)
    if np.dtype(xt).kind == "i" and np.dtype(yt).kind == "f":
        x, y = np.abs(x), np.abs(y)  # a negative int to a fractional power is undefined
    _compare("Pow", {"x": x, "y": y}, rtol=1e-3 if xt == np.float16 else 1e-5)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_pow_integer_negative_exponent(dtype):
    x = np.array([1, -1, -1, 2, -3, 5, 0], dtype)
    y = np.array([-3, -2, -3, -1, -2, 0, 2], dtype)
    got = _compare("Pow", {"x": x, "y": y})
    np.testing.assert_array_equal(got, [1, 1, -1, 0, 0, 1, 0])


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_variadic_broadcast(rng, op, count):
    shapes = [(2, 1, 5), (3, 1), (5,), (1, 3, 5)][:count]
    feeds = {f"d{i}": _floats(rng, s) for i, s in enumerate(shapes)}
    _compare(op, feeds, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.int64, np.float16])
def test_max_min_dtypes(rng, op, dtype):
    make = (lambda s: _floats(rng, s, dtype)) if dtype == np.float16 else (lambda s: _ints(rng, s, dtype, -90, 90))
    _compare(op, {"a": make((4, 3)), "b": make((3,)), "c": make((4, 1))})


def test_sum_mean_float16(rng):
    feeds = {f"d{i}": _floats(rng, (3, 7), np.float16) for i in range(3)}
    _compare("Sum", feeds, rtol=2e-3, atol=2e-3)
    _compare("Mean", feeds, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_where_three_way_broadcast(rng, dtype):
    cond = rng.random((3, 1, 6)) > 0.5
    make = (lambda s: _floats(rng, s)) if dtype == np.float32 else (lambda s: _ints(rng, s, dtype, 0, 99))
    _compare("Where", {"c": cond, "x": make((4, 1)), "y": make((6,))})


def test_where_bool(rng):
    """onnxruntime has no bool Where kernel: checked against np.where."""
    feeds = {"c": rng.random((2, 1, 3)) > 0.5, "x": rng.random((4, 1)) > 0.5, "y": rng.random((3,)) > 0.5}
    got = prepare(_model("Where", feeds), "CPU").run(feeds)[0]
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.where(feeds["c"], feeds["x"], feeds["y"]))


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.float16])
def test_comparisons(rng, op, dtype):
    if np.dtype(dtype).kind == "f":
        a = np.round(_floats(rng, (3, 5), dtype))  # rounded so that Equal hits
        b = np.round(_floats(rng, (5,), dtype))
        a[0, 0], b[1] = np.nan, np.nan
    else:
        a, b = _ints(rng, (3, 5), dtype, 0, 3), _ints(rng, (5,), dtype, 0, 3)
    _compare(op, {"a": a, "b": b})


def test_equal_bool(rng):
    _compare("Equal", {"a": rng.random((2, 3)) > 0.5, "b": rng.random((3,)) > 0.5})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(rng, op):
    _compare(op, {"a": rng.random((2, 1, 4)) > 0.5, "b": rng.random((3, 1)) > 0.5})


def test_not(rng):
    _compare("Not", {"x": rng.random((3, 5, 2)) > 0.5})


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned(rng, direction, dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = rng.integers(1, 200, size=(3, 4)).astype(dtype)
    y = rng.integers(0, bits - 1, size=(4,)).astype(dtype)
    _compare("BitShift", {"x": x, "y": y}, {"direction": direction})


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_bitshift_signed_opset28(rng, dtype):
    """Signed BitShift is opset 28, newer than onnxruntime: checked against Python ints."""
    bits = np.dtype(dtype).itemsize * 8
    x = _ints(rng, (5, 6), dtype, -120, 120)
    y = rng.integers(-2, bits + 3, size=(6,)).astype(dtype)
    feeds = {"x": x, "y": y}
    for direction in ("LEFT", "RIGHT"):
        got = prepare(_model("BitShift", feeds, {"direction": direction}, opset=28), "CPU").run(feeds)[0]
        assert got.dtype == dtype
        for (i, j), v in np.ndenumerate(got):
            xv, s = int(x[i, j]), int(y[j])
            if not 0 <= s < bits:
                want = -1 if direction == "RIGHT" and xv < 0 else 0
            elif direction == "RIGHT":
                want = xv >> s
            else:
                want = (xv << s) & ((1 << bits) - 1)
                want -= (1 << bits) if want >= 1 << (bits - 1) else 0
            assert int(v) == want, (direction, xv, s, int(v), want)


CAST_SOURCES = [np.float32, np.float64, np.float16, np.int64, np.int8, np.uint16, np.bool_]
CAST_TARGETS = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT8,
                TensorProto.UINT8, TensorProto.UINT64, TensorProto.BOOL, TensorProto.INT64]


def _cast_input(rng, dtype, shape=(4, 7)):
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind == "f":
        x = _floats(rng, shape, dtype, 40.0)
        x.flat[:3] = [0.0, -0.0, 0.5]
        return x
    return _ints(rng, shape, dtype, -300, 300)


@pytest.mark.parametrize("src", CAST_SOURCES)
@pytest.mark.parametrize("to", CAST_TARGETS)
def test_cast(rng, src, to):
    x = _cast_input(rng, src)
    target = helper.tensor_dtype_to_np_dtype(to)
    if np.dtype(src).kind == "f" and target.kind in "iu":
        x = np.clip(x, 0 if target.kind == "u" else -100, 100).astype(src)  # in range: defined
    _compare("Cast", {"x": x}, {"to": to}, rtol=1e-3)
    _compare("CastLike", {"x": x, "like": np.zeros((1,), target)}, rtol=1e-3)


def test_cast_float64_to_float16_rounds_once():
    x = np.array([1.0 + 2.0**-11 + 2.0**-40, 65519.9, 70000.0, -1e-8, np.inf, np.nan], np.float64)
    got = prepare(_model("Cast", {"x": x}, {"to": TensorProto.FLOAT16}), "CPU").run({"x": x})[0]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16))


def test_cast_saturate_and_round_mode_accepted(rng):
    """Both only change float8 targets; onnxruntime refuses them elsewhere, plugrt ignores them."""
    x = _floats(rng, (2, 3))
    model = _model("Cast", {"x": x}, {"to": TensorProto.FLOAT16, "saturate": 0}, opset=19)
    np.testing.assert_array_equal(prepare(model, "CPU").run({"x": x})[0], x.astype(np.float16))
    model = _model("Cast", {"x": x}, {"to": TensorProto.INT32, "saturate": 0, "round_mode": "nearest"}, opset=25)
    np.testing.assert_array_equal(prepare(model, "CPU").run({"x": x})[0], x.astype(np.int32))


def test_isnan_isinf(rng):
    x = _floats(rng, (4, 5))
    x.flat[[1, 4, 7, 11]] = [np.inf, -np.inf, np.nan, -np.inf]
    _compare("IsNaN", {"x": x})
    for neg in (0, 1):
        for pos in (0, 1):
            _compare("IsInf", {"x": x}, {"detect_negative": neg, "detect_positive": pos})
    _compare("IsInf", {"x": x.astype(np.float16)}, opset=20)


def test_symbolic_dims(rng):
    a, b = _floats(rng, (2, 5, 3)), _floats(rng, (5, 1))
    shapes = {"a": ("N", "S", 3), "b": ("S", 1)}
    graph = import_model(_model("Add", {"a": a, "b": b}, shapes=shapes))
    assert graph.values["out0"].info.shape == ("N", "S", 3)
    _compare("Add", {"a": a, "b": b}, shapes=shapes)
    cond = rng.random((5, 3)) > 0.5
    graph = import_model(_model("Where", {"c": cond, "x": a, "y": b}, shapes={"c": ("S", 3), "x": ("N", "S", 3),
                                                                           "y": (1, 1)}))
    assert graph.values["out0"].info.shape == ("N", "S", 3)
    _compare("Sum", {"a": a, "b": b, "c": a}, shapes={"a": ("N", 5, "C"), "c": ("N", 5, "C")}, atol=1e-6)


def test_broadcast_mismatch_is_a_shape_error(rng):
    with pytest.raises(plugrt.ShapeError, match="my_add"):
        import_model(_model("Add", {"a": _floats(rng, (3, 4)), "b": _floats(rng, (5,))}))


def test_cast_to_bfloat16_is_declared_unsupported(rng):
    model = _model("Cast", {"x": _floats(rng, (2, 3))}, {"to": TensorProto.BFLOAT16})
    with pytest.raises(plugrt.UnsupportedError, match="my_cast.*BFLOAT16"):
        prepare(model, "CPU")


def test_cast_bad_round_mode_and_bitshift_direction_are_unsupported(rng):
    model = _model("Cast", {"x": _floats(rng, (2,))}, {"to": TensorProto.FLOAT16, "round_mode": "sideways"}, opset=25)
    with pytest.raises(plugrt.UnsupportedError, match="my_cast.*round_mode"):
        prepare(model, "CPU")
    x = np.array([1, 2], np.uint8)
    model = _model("BitShift", {"x": x, "y": x}, {"direction": "UP"})
    with pytest.raises(plugrt.UnsupportedError, match="my_bitshift"):
        prepare(model, "CPU")


def test_single_input_max_does_not_alias(rng):
    x = _floats(rng, (3,))
    rep = prepare(_model("Max", {"x": x}), "CPU")
    out = rep.run({"x": x})[0]
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)


def test_wrong_input_count_is_a_model_error(rng):
    x = _floats(rng, (2,))
    with pytest.raises(plugrt.ModelError, match="my_add.*takes 2"):
        import_model(_model("Add", {"a": x, "b": x, "c": x}))
