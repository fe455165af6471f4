"""Pooling, reduction and softmax-family references against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

import plugrt
from plugrt.onnx.backend import prepare


def _model(op, feeds, attrs, opset=17, outputs=("y",), shapes=None, consts=None):
    """One-node model; ``feeds`` are graph inputs, ``consts`` initializers (in input order
    after the feeds unless an input name is ``""``)."""
    shapes = shapes or {}
    consts = consts or {}
    inputs = [
        helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(a.dtype), shapes.get(n, a.shape))
        for n, a in feeds.items()
    ]
    names = list(feeds) + list(consts)
    node = helper.make_node(op, names, list(outputs), name=f"my_{op.lower()}", **attrs)
    x_type = np_dtype_to_tensor_dtype(feeds["x"].dtype)
    int64 = np_dtype_to_tensor_dtype(np.dtype(np.int64))
    outs = [helper.make_tensor_value_info(o, int64 if o == "i" or op.startswith("Arg") else x_type, None)
            for o in outputs]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    graph = helper.make_graph([node], "g", inputs, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _compare(model, feeds, rtol=1e-5, atol=1e-6):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    rep = prepare(model, "CPU")
    got = rep.run(feeds)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
    return rep, got


def _info(rep, name="y"):
    return rep.graph.values[name].info


# ----------------------------------------------------------------------------- pooling


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 3, 11, 9), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1])),
        ((1, 2, 10, 7), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
        ((1, 2, 9, 8), dict(kernel_shape=[2, 3], strides=[3, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
        ((1, 3, 13), dict(kernel_shape=[4], strides=[3], pads=[2, 1], dilations=[2])),
        ((1, 2, 7, 6, 5), dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 0])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 3], auto_pad="SAME_LOWER")),
        ((1, 2, 8, 7), dict(kernel_shape=[4, 3], strides=[3, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 9, 7), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID")),
    ],
)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_with_indices(rng, shape, attrs, storage_order):
    feeds = {"x": rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) - 7.5}
    model = _model("MaxPool", feeds, dict(attrs, storage_order=storage_order), outputs=("y", "i"))
    rep, (y, i) = _compare(model, feeds)
    assert _info(rep, "i").dtype == np.int64
    if storage_order == 0:
        np.testing.assert_array_equal(feeds["x"].reshape(-1)[i], y)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64])
def test_maxpool_dtypes(rng, dtype):
    x = rng.integers(-100 if dtype == np.int8 else 0, 100, (2, 3, 8, 7)).astype(dtype)
    feeds = {"x": x}
    _compare(_model("MaxPool", feeds, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), opset=12), feeds)


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 3, 11, 9), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1])),
        ((1, 2, 9, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
        ((1, 2, 10, 10), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[2, 2, 1, 1], ceil_mode=1)),
        ((1, 3, 13), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),
        ((1, 2, 7, 6, 5), dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 0])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 3], auto_pad="SAME_LOWER")),
        ((1, 2, 8, 7), dict(kernel_shape=[4, 3], strides=[3, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 9, 7), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="VALID")),
    ],
)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_averagepool(rng, shape, attrs, count_include_pad):
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    _compare(_model("AveragePool", feeds, dict(attrs, count_include_pad=count_include_pad)), feeds)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_averagepool_dilations_opset19(rng, count_include_pad, ceil_mode):
    feeds = {"x": rng.standard_normal((1, 2, 12, 11)).astype(np.float32)}
    attrs = dict(kernel_shape=[3, 2], strides=[2, 3], dilations=[2, 3], pads=[1, 1, 2, 0],
                 count_include_pad=count_include_pad, ceil_mode=ceil_mode)
    _compare(_model("AveragePool", feeds, attrs, opset=19), feeds)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lppool(rng, p):
    feeds = {"x": rng.standard_normal((2, 3, 9, 8)).astype(np.float32)}
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=p)
    _compare(_model("LpPool", feeds, attrs), feeds, rtol=1e-4)
    _compare(_model("GlobalLpPool", feeds, dict(p=p)), feeds, rtol=1e-4)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools_symbolic(rng, op):
    feeds = {"x": rng.standard_normal((3, 4, 5, 6, 2)).astype(np.float32)}
    model = _model(op, feeds, {}, shapes={"x": ["N", "C", "D", 6, "W"]})
    rep, _ = _compare(model, feeds)
    assert _info(rep).shape == ("N", "C", 1, 1, 1)


def test_pool_symbolic_spatial_shape(rng):
    feeds = {"x": rng.standard_normal((2, 3, 10, 9)).astype(np.float32)}
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    rep, _ = _compare(_model("MaxPool", feeds, attrs, shapes={"x": ["N", 3, "H", 9]}), feeds)
    shape = _info(rep).shape
    assert shape[:2] == ("N", 3) and isinstance(shape[2], str) and shape[3] == 5


# ----------------------------------------------------------------------------- reductions

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _reduce_input(rng, op, shape, dtype=np.float32):
    if op == "ReduceLogSum":
        return rng.uniform(0.5, 2.0, shape).astype(dtype)
    if op == "ReduceProd":
        return rng.uniform(0.5, 1.5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes, keepdims", [([-1, 1], 0), ([0, -2], 1), ([2], 0), (None, 1), (None, 0)])
def test_reduce_attribute_and_input_forms(rng, op, axes, keepdims):
    feeds = {"x": _reduce_input(rng, op, (3, 5, 4, 2))}
    attr_opset = 12 if op == "ReduceSum" else 17
    attrs = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    _compare(_model(op, feeds, attrs, opset=attr_opset), feeds, rtol=1e-5)
    consts = {"axes": np.array(axes, np.int64)} if axes is not None else None
    _compare(_model(op, feeds, {"keepdims": keepdims}, opset=18, consts=consts), feeds, rtol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(rng, op):
    feeds = {"x": _reduce_input(rng, op, (3, 4)), "axes": np.zeros(0, np.int64)}
    rep, _ = _compare(_model(op, feeds, {"noop_with_empty_axes": 1, "keepdims": 0}, opset=18), feeds)
    assert _info(rep).shape == (3, 4)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integers(rng, op, dtype):
    high = 3 if op == "ReduceProd" else 10  # no overflow: wrapping is not what ORT does
    feeds = {"x": rng.integers(-high + 1, high, (4, 3, 5)).astype(dtype)}
    consts = {"axes": np.array([0, 2], np.int64)}
    _compare(_model(op, feeds, {"keepdims": 0}, opset=18, consts=consts), feeds, rtol=0, atol=0)


def test_reduce_max_int8_bool(rng):
    feeds = {"x": rng.integers(-100, 100, (4, 7)).astype(np.int8)}
    _compare(_model("ReduceMax", feeds, {}, opset=18, consts={"axes": np.array([1], np.int64)}), feeds)
    feeds = {"x": rng.integers(0, 2, (4, 7)).astype(bool)}
    rep = prepare(_model("ReduceMin", feeds, {"keepdims": 0}, opset=20, consts={"axes": np.array([0], np.int64)}))
    np.testing.assert_array_equal(rep.run(feeds)[0], feeds["x"].all(axis=0))


def test_reduce_empty_set():
    x = np.zeros((2, 0, 3), np.float32)
    expected = {"ReduceSum": 0, "ReduceProd": 1, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceL2": 0,
                "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf, "ReduceSumSquare": 0, "ReduceL1": 0}
    for op, value in expected.items():
        model = _model(op, {"x": x}, {"keepdims": 0}, opset=18, consts={"axes": np.array([1], np.int64)})
        got = prepare(model).run({"x": x})[0]
        np.testing.assert_array_equal(got, np.full((2, 3), value, np.float32))


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_non_constant_axes_symbolic(rng, keepdims):
    feeds = {"x": rng.standard_normal((3, 1, 5, 2)).astype(np.float32), "axes": np.array([-2, 0], np.int64)}
    model = _model("ReduceMean", feeds, {"keepdims": keepdims}, opset=18, shapes={"x": ["N", 1, "L", 2]})
    rep, _ = _compare(model, feeds)
    shape = _info(rep).shape
    assert len(shape) == (4 if keepdims else 2)
    if keepdims:
        assert shape[1] == 1


def test_reduce_non_constant_axes_unknown_length_unsupported(rng):
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32), "axes": np.array([1], np.int64)}
    model = _model("ReduceSum", feeds, {"keepdims": 0}, opset=13, shapes={"axes": ["K"]})
    with pytest.raises(plugrt.UnsupportedError, match="my_reducesum"):
        prepare(model)
    # keepdims=1 keeps the rank known, so the same graph is fine
    model = _model("ReduceSum", feeds, {"keepdims": 1}, opset=13, shapes={"axes": ["K"]})
    _compare(model, feeds)


def test_reduce_axes_attribute_in_input_opset_unsupported(rng):
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    model = _model("ReduceMean", feeds, {"axes": [1]}, opset=18)
    with pytest.raises(plugrt.UnsupportedError, match="my_reducemean"):
        prepare(model)


# ----------------------------------------------------------------------------- ArgMax / ArgMin


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(0, 1, 0), (-1, 0, 1), (1, 1, 1), (-2, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_arg_ties(rng, op, axis, keepdims, last, dtype):
    feeds = {"x": rng.integers(0, 4, (3, 5, 4)).astype(dtype)}  # many ties
    attrs = dict(axis=axis, keepdims=keepdims, select_last_index=last)
    rep, _ = _compare(_model(op, feeds, attrs, opset=13), feeds, rtol=0, atol=0)
    assert _info(rep).dtype == np.int64


# ----------------------------------------------------------------------------- softmax family


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 2, -1, -3])
def test_softmax_family(rng, op, opset, axis):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    if op == "Hardmax":
        x = np.round(x)  # ties: the first maximum wins
    feeds = {"x": x}
    attrs = {} if axis is None else {"axis": axis}
    _compare(_model(op, feeds, attrs, opset=opset, shapes={"x": ["N", 3, "H", 5]}), feeds, rtol=1e-5, atol=1e-6)


def test_softmax_float16(rng):
    feeds = {"x": rng.standard_normal((3, 7)).astype(np.float16)}
    _compare(_model("Softmax", feeds, {"axis": 0}, opset=13), feeds, rtol=2e-3, atol=1e-3)


def test_pool_unsupported_rank(rng):
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    with pytest.raises(plugrt.UnsupportedError, match="my_maxpool"):
        prepare(_model("MaxPool", feeds, dict(kernel_shape=[2])))
