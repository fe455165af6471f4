"""CUDA tactics of the activation and unary ops (run in the CUDA simulator without a GPU)
against their NumPy references: every op and float dtype, attributes, integer types,
special values (NaN, infinities, halves for Round), Clip's optional bounds, PRelu's
broadcast slope, empty and rank-0 tensors."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.testing import check_node

# The simulator computes on NumPy scalars, which warn where the GPU silently wraps or overflows.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FLOATS = [np.float32, np.float16, np.float64]
TOLERANCE = {np.float16: (2e-3, 2e-3), np.float32: (1e-5, 1e-6), np.float64: (1e-12, 1e-14)}

# op -> (opset, attribute sets to try)
UNARY = {
    "Relu": (17, [{}]),
    "LeakyRelu": (17, [{}, {"alpha": 0.3}]),
    "Sigmoid": (17, [{}]),
    "HardSigmoid": (17, [{}, {"alpha": 0.4, "beta": 0.3}]),
    "HardSwish": (17, [{}]),
    "Tanh": (17, [{}]),
    "Elu": (17, [{}, {"alpha": 0.5}]),
    "Selu": (17, [{}, {"alpha": 2.0, "gamma": 3.0}]),
    "Celu": (17, [{}, {"alpha": 2.5}]),
    "ThresholdedRelu": (17, [{}, {"alpha": -0.5}]),
    "Gelu": (20, [{}, {"approximate": "tanh"}]),
    "Erf": (17, [{}]),
    "Softplus": (17, [{}]),
    "Softsign": (17, [{}]),
    "Mish": (18, [{}]),
    "Exp": (17, [{}]),
    "Reciprocal": (17, [{}]),
    "Neg": (17, [{}]),
    "Abs": (17, [{}]),
    "Sign": (17, [{}]),
    "Floor": (17, [{}]),
    "Ceil": (17, [{}]),
    "Round": (17, [{}]),
    "Sin": (17, [{}]),
    "Cos": (17, [{}]),
    "Clip": (17, [{}]),
}


def _floats(rng, shape, dtype, scale=3.0):
    x = np.asarray(rng.standard_normal(shape) * scale)
    x[np.abs(x) < 1e-3] = 0.25
    return x.astype(dtype)


def _check(op, feeds, attrs=None, opset=17, dtype=np.float32, **kw):
    rtol, atol = TOLERANCE.get(np.dtype(dtype).type, (0, 0))
    return check_node(op, feeds, attrs, opset=opset, rtol=rtol, atol=atol, **kw)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(rng, op, dtype):
    opset, attr_sets = UNARY[op]
    for attrs in attr_sets:
        _check(op, {"x": _floats(rng, (3, 7), dtype)}, attrs, opset, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_and_sqrt(rng, dtype):
    x = _floats(rng, (2, 9), dtype)
    _check("Log", {"x": np.abs(x)}, dtype=dtype)
    _check("Sqrt", {"x": np.abs(x)}, dtype=dtype)
    edges = np.array([-2.0, -0.0, 0.0, 1e-3, 4.0, np.inf, np.nan], dtype)
    _check("Log", {"x": edges}, dtype=dtype)  # NaN below zero, -inf at zero
    _check("Sqrt", {"x": edges}, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -3.5, 1e30, -1e30], dtype)
    for op in ["Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Softsign",
               "Abs", "Neg", "Sign", "Floor", "Ceil", "Round", "Erf", "Softplus", "ThresholdedRelu"]:
        _check(op, {"x": x}, dtype=dtype)
    _check("Clip", {"x": x, "low": np.array(-1.0, dtype), "high": np.array(2.0, dtype)}, dtype=dtype)


def test_thresholded_relu_compares_in_input_dtype():
    x = np.array([0.3, 0.2998, 0.31, -1.0], np.float16)  # float16(0.3) is above 0.3
    got = _check("ThresholdedRelu", {"x": x}, {"alpha": 0.3}, dtype=np.float16)[0]
    assert got[0] == 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_round_half_to_even(dtype):
    x = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49, -0.51, 1.5000001, 1023.5, 1024.5], dtype)
    expected = _check("Round", {"x": x}, dtype=dtype)[0]
    np.testing.assert_array_equal(expected[:8], np.array([-4, -2, -2, -0, 0, 2, 2, 4], dtype))
    if dtype != np.float16:
        big = np.array([2.0**23 - 0.5, 2.0**23 + 1, -(2.0**23) + 0.5, 2.0**52 + 1, 2.0**60], dtype)
        _check("Round", {"x": big}, dtype=dtype)
        _check("Floor", {"x": big}, dtype=dtype)
        _check("Ceil", {"x": big}, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_signed_integer_ops(rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(-100, 100, size=(4, 5), endpoint=True).astype(dtype)
    x.flat[:3] = [info.min, info.max, 0]  # Abs and Neg wrap at the minimum, as NumPy
    for op in ["Relu", "Neg", "Abs", "Sign"]:
        _check(op, {"x": x}, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_unsigned_integer_ops(rng, dtype):
    x = rng.integers(0, 200, size=(3, 4), endpoint=True).astype(dtype)
    x.flat[0] = np.iinfo(dtype).max
    x.flat[1] = 0
    for op in ["Abs", "Sign"]:
        _check(op, {"x": x}, dtype=dtype)
    _check("Clip", {"x": x, "low": np.array(5, dtype), "high": np.array(100, dtype)}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS + [np.int8, np.int32, np.int64, np.uint8])
def test_clip_optional_bounds(rng, dtype):
    if np.dtype(dtype).kind == "f":
        x = _floats(rng, (2, 3, 4), dtype)
        low, high = np.array(-1.5, dtype), np.array(2.0, dtype)
    else:
        x = rng.integers(0, 100, size=(2, 3, 4)).astype(dtype)
        low, high = np.array(20, dtype), np.array(70, dtype)
    _check("Clip", {"x": x, "low": low, "high": high}, dtype=dtype)
    _check("Clip", {"x": x, "low": low}, dtype=dtype)
    _check("Clip", {"x": x, "low": None, "high": high}, dtype=dtype)
    _check("Clip", {"x": x}, dtype=dtype)
    _check("Clip", {"x": x, "low": high, "high": low}, dtype=dtype)  # min > max: everything is max
    _check("Clip", {"x": x, "low": low, "high": high}, dtype=dtype, constants={"low", "high"})


@pytest.mark.parametrize("dtype", FLOATS)
def test_clip_attributes_before_opset_11(rng, dtype):
    x = _floats(rng, (3, 5), dtype)
    _check("Clip", {"x": x}, {"min": -1.0, "max": 0.5}, opset=6, dtype=dtype)
    _check("Clip", {"x": x}, {"min": 0.0}, opset=6, dtype=dtype)
    _check("Clip", {"x": x}, {}, opset=6, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS + [np.int32, np.int64, np.uint32])
@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (), (2, 3, 2, 4)])
def test_prelu_broadcast_slope(rng, dtype, slope_shape):
    if np.dtype(dtype).kind == "f":
        x, slope = _floats(rng, (2, 3, 2, 4), dtype), _floats(rng, slope_shape, dtype, 0.5)
    else:
        low = 0 if np.dtype(dtype).kind == "u" else -50
        x = rng.integers(low, 50, size=(2, 3, 2, 4)).astype(dtype)
        slope = rng.integers(1, 5, size=slope_shape).astype(dtype)
    _check("PRelu", {"x": x, "slope": slope}, dtype=dtype)


@pytest.mark.parametrize("op", ["Relu", "Gelu", "Erf", "Sigmoid", "Round", "Abs"])
def test_empty_and_rank0(rng, op):
    opset = UNARY[op][0]
    _check(op, {"x": np.zeros((0, 3), np.float32)}, opset=opset)
    _check(op, {"x": np.array(-1.25, np.float32)}, opset=opset)


def test_tactic_shared_by_equal_nodes(registry):
    """Equal attributes give the same cached device function (one compiled kernel)."""
    from plugrt.onnx.importer import import_model
    from plugrt.testing import single_node_model

    x = np.ones((2, 2), np.float32)
    fns = []
    for alpha in (0.2, 0.2, 0.3):
        graph = import_model(single_node_model("LeakyRelu", {"x": x}, {"alpha": alpha}), registry=registry)
        node = graph.nodes[0]
        fns.append(registry.op(node).pointwise(node, [graph.info("x")]))
    assert fns[0] is fns[1] and fns[0] is not fns[2]
