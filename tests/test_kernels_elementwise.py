"""CUDA tactics of the elementwise ops (run in the CUDA simulator without a GPU) against
their NumPy references: broadcasting, every numeric dtype, integer wrap-around, Div's
truncation, Mod's sign rules, integer Pow, BitShift ranges, variadic arities, NaN
propagation, predicates, Cast between all supported dtypes, empty and rank-0 tensors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from plugrt.testing import check_node

# The simulator computes on NumPy scalars, which warn where the GPU silently wraps or divides by zero.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLOATS = [np.float32, np.float16, np.float64]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
TOLERANCE = {np.float16: (2e-3, 2e-3), np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-14)}
BCAST = [((3, 1, 5), (4, 1)), ((2, 3), (3,)), ((), (2, 3)), ((4, 1), (1, 4)), ((2, 5), (2, 5))]


def _check(op, feeds, attrs=None, dtype=np.float32, opset=17, **kw):
    rtol, atol = TOLERANCE.get(np.dtype(dtype).type, (0, 0))
    return check_node(op, feeds, attrs, opset=opset, rtol=rtol, atol=atol, **kw)


def _floats(rng, shape, dtype, scale=3.0):
    x = np.asarray(rng.standard_normal(shape) * scale)
    x[np.abs(x) < 0.1] = 0.5
    return x.astype(dtype)


def _ints(rng, shape, dtype, low=-100, high=100, nonzero=False):
    info = np.iinfo(dtype)
    x = np.asarray(rng.integers(max(low, info.min), min(high, info.max), size=shape, endpoint=True)).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


def _values(rng, shape, dtype, nonzero=False):
    if np.dtype(dtype).kind == "f":
        return _floats(rng, shape, dtype)
    return _ints(rng, shape, dtype, nonzero=nonzero)


# ---------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic(rng, op, dtype):
    for shape_a, shape_b in BCAST[:3]:
        a = _values(rng, shape_a, dtype)
        b = _values(rng, shape_b, dtype, nonzero=True)
        _check(op, {"a": a, "b": b}, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_integer_arithmetic_wraps(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, 7], dtype)
    b = np.array([1, info.max, 3, info.max], dtype)
    for op in ["Add", "Sub", "Mul"]:
        _check(op, {"a": a, "b": b}, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_div_truncates_and_div_by_zero(dtype):
    signed = np.dtype(dtype).kind == "i"
    a = np.array([-7, 7, -7, 7, -1, 0, 5, -6, 9, -9] if signed else [7, 8, 0, 5, 9, 100, 3, 4, 9, 1], dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 5, 4, 0, 0] if signed else [2, 3, 5, 5, 0, 7, 4, 4, 9, 0], dtype)
    got = _check("Div", {"a": a, "b": b}, dtype=dtype)[0]
    if signed:
        np.testing.assert_array_equal(got[:8], [-3, 3, 3, -3, 0, 0, 1, -1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_div_by_zero(dtype):
    a = np.array([1.0, -1.0, 0.0, np.nan, np.inf], dtype)
    b = np.array([0.0, 0.0, 0.0, 2.0, -0.0], dtype)
    _check("Div", {"a": a, "b": b}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS + [np.int8, np.int32, np.int64, np.uint8, np.uint64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_sign_rules(rng, dtype, fmod):
    if np.dtype(dtype).kind == "i":
        a = np.array([-7, 7, -7, 7, 6, -6, 0, 5, 5], dtype)
        b = np.array([3, 3, -3, -3, 3, -3, 4, 0, -1], dtype)
    elif np.dtype(dtype).kind == "u":
        a = np.array([7, 8, 0, 5, 9, 100, 3, 255, 6], dtype)
        b = np.array([3, 3, 4, 0, 9, 7, 5, 16, 4], dtype)
    else:
        a = np.array([-7.5, 7.5, -7.5, 7.5, 6.0, -6.0, 0.0, 5.0, 1.25], dtype)
        b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, -3.0, 4.0, 0.0, 0.5], dtype)
    _check("Mod", {"a": a, "b": b}, {"fmod": fmod}, dtype=dtype)
    x, y = _values(rng, (3, 1, 4), dtype), _values(rng, (5, 1), dtype, nonzero=True)
    _check("Mod", {"a": x, "b": y}, {"fmod": fmod}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fmod", [0, 1])
def test_float_mod_edge_cases(dtype, fmod):
    a = np.array([np.inf, -np.inf, np.nan, 5.0, -5.0, 0.0, -0.0, 3.0], dtype)
    b = np.array([2.0, 3.0, 2.0, np.inf, np.inf, 0.0, 2.0, -np.inf], dtype)
    _check("Mod", {"a": a, "b": b}, {"fmod": fmod}, dtype=dtype)


# ---------------------------------------------------------------------- Pow


@pytest.mark.parametrize("base", FLOATS)
@pytest.mark.parametrize("exponent", [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8])
def test_pow_float_base(rng, base, exponent):
    x = np.abs(_floats(rng, (3, 4), base)) + np.array(0.25, base)
    if np.dtype(exponent).kind == "f":
        y = _floats(rng, (4,), exponent, 1.5)
    else:
        y = _ints(rng, (4,), exponent, -4, 4)
    _check("Pow", {"x": x, "y": y}, dtype=base)
    # negative bases: integral exponents are exact, fractional ones NaN
    x = np.array([-2.0, -2.0, -0.5, -3.0, 2.0, 0.0], base)
    y = np.array([3, 2, 4 if np.dtype(exponent).kind == "u" else -2, 1, 0, 2], exponent)
    _check("Pow", {"x": x, "y": y}, dtype=base)
    if np.dtype(exponent).kind == "f":
        _check("Pow", {"x": x, "y": np.array(0.5, exponent)}, dtype=base)


@pytest.mark.parametrize("base", [np.int32, np.int64])
@pytest.mark.parametrize("exponent", [np.int32, np.int64, np.int8, np.uint8, np.uint64])
def test_pow_integer(rng, base, exponent):
    x = np.array([2, -2, 3, -1, -1, 1, 0, 5, 7, -3], base)
    signed = np.dtype(exponent).kind == "i"
    y = np.array([3, 5, 40, 7, 8, -5 if signed else 9, 0, -1 if signed else 1, 25, -2 if signed else 2], exponent)
    _check("Pow", {"x": x, "y": y}, dtype=base)  # 3**40 and 7**25 wrap, as NumPy's int64 arithmetic
    _check("Pow", {"x": _ints(rng, (2, 5), base, -4, 4), "y": _ints(rng, (5,), exponent, 0, 6)}, dtype=base)


def test_pow_huge_unsigned_exponent_keeps_parity():
    x = np.array([-1, -1, 1, 0, 2], np.int64)
    y = np.array([2**63 + 1, 2**64 - 2, 2**63, 2**62 + 3, 2**64 - 1], np.uint64)
    _check("Pow", {"x": x, "y": y}, dtype=np.int64)


@pytest.mark.parametrize("exponent", [np.float32, np.float64])
def test_pow_integer_base_float_exponent_truncates(exponent):
    x = np.array([2, 3, 10, 4, 9, 1], np.int32)
    y = np.array([0.5, 1.5, 2.0, -1.0, 0.5, 7.3], exponent)
    _check("Pow", {"x": x, "y": y}, dtype=np.int32)


# ---------------------------------------------------------------------- BitShift


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift(rng, dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    signed = np.dtype(dtype).kind == "i"
    x = _ints(rng, (2, 6), dtype, -100, 100)
    counts = [0, 1, 3, bits - 1, bits, bits + 5] if not signed else [0, 1, -1, bits - 1, bits, 3]
    y = np.array(counts, dtype)
    _check("BitShift", {"x": x, "y": y}, {"direction": direction}, dtype=dtype)
    if signed:
        x = np.array([-1, -128 % (2 ** (bits - 1)) - 1, np.iinfo(dtype).min, 5], dtype)
        _check("BitShift", {"x": x, "y": np.array(2, dtype)}, {"direction": direction}, dtype=dtype)


# ---------------------------------------------------------------------- variadic


@pytest.mark.parametrize("dtype", FLOATS + [np.int8, np.int64, np.uint16, np.uint64])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min(rng, op, dtype):
    shapes = [(2, 1, 3), (4, 1), (3,), ()]
    for n in (1, 2, 4):
        _check(op, {f"x{k}": _values(rng, shapes[k], dtype) for k in range(n)}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_propagate_nan(dtype):
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0], dtype)
    b = np.array([1.0, np.nan, np.nan, 3.0, np.inf], dtype)
    for op in ["Max", "Min"]:
        _check(op, {"a": a, "b": b}, dtype=dtype)
        _check(op, {"a": a, "b": b, "c": np.array(0.0, dtype)}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_sum_mean(rng, op, dtype):
    shapes = [(3, 4), (4,), (3, 1)]
    for n in (1, 2, 3):
        _check(op, {f"x{k}": _floats(rng, shapes[k], dtype) for k in range(n)}, dtype=dtype)


# ---------------------------------------------------------------------- Where, predicates, logic


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_where_broadcast(rng, dtype):
    condition = rng.random((3, 1)) < 0.5
    if dtype == np.bool_:
        x, y = rng.random((1, 4)) < 0.5, np.array(True)
    else:
        x, y = _values(rng, (1, 4), dtype), _values(rng, (), dtype)
    _check("Where", {"c": condition, "x": x, "y": y}, dtype=dtype)
    _check("Where", {"c": rng.random((2, 3)) < 0.5, "x": _values(rng, (2, 3), np.float32),
                     "y": _values(rng, (2, 3), np.float32)})


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_comparisons(rng, dtype):
    a = _ints(rng, (3, 4), np.int8, 0, 5).astype(dtype)  # small values: equalities happen
    b = _ints(rng, (4,), np.int8, 0, 5).astype(dtype)
    for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
        _check(op, {"a": a, "b": b})


def test_comparisons_with_nan():
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 0.0], np.float32)
    b = np.array([1.0, np.nan, np.nan, -np.inf, -0.0], np.float32)
    for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]:
        _check(op, {"a": a, "b": b})


def test_logic(rng):
    a, b = rng.random((3, 4)) < 0.5, rng.random((4,)) < 0.5
    for op in ["And", "Or", "Xor", "Equal"]:
        _check(op, {"a": a, "b": b})
    _check("Not", {"x": a})


@pytest.mark.parametrize("dtype", FLOATS)
def test_is_nan_is_inf(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 3.0e4], dtype)
    _check("IsNaN", {"x": x})
    for negative in (0, 1):
        for positive in (0, 1):
            _check("IsInf", {"x": x}, {"detect_negative": negative, "detect_positive": positive})


# ---------------------------------------------------------------------- Cast

TARGETS = {
    np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE,
    np.int8: TensorProto.INT8, np.int16: TensorProto.INT16, np.int32: TensorProto.INT32,
    np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8, np.uint16: TensorProto.UINT16,
    np.uint32: TensorProto.UINT32, np.uint64: TensorProto.UINT64, np.bool_: TensorProto.BOOL,
}


def _cast_source(rng, dtype, target):
    """Values every target represents or wraps in a defined way (float to int in range)."""
    if dtype == np.bool_:
        return rng.random((3, 4)) < 0.5
    if np.dtype(dtype).kind == "f":
        unsigned = np.dtype(target).kind == "u"
        x = rng.uniform(0 if unsigned else -100, 120, size=(3, 4))
        x[0, :3] = [0.0, 2.7, 0.5] if unsigned else [0.0, -2.7, 2.7]
        return x.astype(dtype)
    x = _ints(rng, (3, 4), dtype, -1000, 1000)  # int to int wraps
    x.flat[0] = 0
    return x


@pytest.mark.parametrize("source", FLOATS + INTS + [np.bool_])
def test_cast_all_pairs(rng, source):
    for target, to in TARGETS.items():
        x = _cast_source(rng, source, target)
        _check("Cast", {"x": x}, {"to": to}, dtype=target)


def test_cast_special_values():
    x = np.array([np.nan, np.inf, -0.0, 1e-8, 65519.0, 65520.0, 1e10], np.float64)
    _check("Cast", {"x": x}, {"to": TensorProto.BOOL})
    _check("Cast", {"x": x}, {"to": TensorProto.FLOAT16}, dtype=np.float16)
    _check("Cast", {"x": x}, {"to": TensorProto.FLOAT}, dtype=np.float32)
    big = np.array([2**64 - 1, 2**63, 2**53 + 1, 1], np.uint64)
    _check("Cast", {"x": big}, {"to": TensorProto.FLOAT}, dtype=np.float32)
    _check("Cast", {"x": big}, {"to": TensorProto.INT64}, dtype=np.int64)


@pytest.mark.parametrize("source, like", [(np.float32, np.int32), (np.int64, np.float16), (np.float16, np.bool_)])
def test_cast_like(rng, source, like):
    x = _cast_source(rng, source, like)
    target = np.ones((7,), like)  # an unrelated shape: only its dtype matters
    _check("CastLike", {"x": x, "like": target}, dtype=like, opset=15)
    _check("CastLike", {"x": x, "like": np.ones((0,), like)}, dtype=like, opset=15)


# ---------------------------------------------------------------------- shapes


@pytest.mark.parametrize("op", ["Add", "Max", "Where", "Cast", "Less"])
def test_empty_and_rank0(rng, op):
    for shape in [(0, 3), ()]:
        a, b = _floats(rng, shape, np.float32), _floats(rng, shape, np.float32)
        if op == "Where":
            feeds = {"c": np.asarray(rng.random(shape) < 0.5), "a": a, "b": b}
        elif op == "Cast":
            feeds = {"a": a}
        else:
            feeds = {"a": a, "b": b}
        _check(op, feeds, {"to": TensorProto.INT32} if op == "Cast" else None)
    _check("Add", {"a": np.zeros((0, 3), np.float32), "b": np.ones((1,), np.float32)})


def test_equal_nodes_share_device_function(registry):
    from plugrt_builtin_ops.elementwise import device_functions

    f16 = np.dtype(np.float16)
    assert device_functions.device_function("Max", (f16,) * 3) is device_functions.device_function(
        "Max", (f16,) * 3)
    assert device_functions.device_function("Max", (f16,) * 3) is not device_functions.device_function(
        "Max", (f16,) * 2)
