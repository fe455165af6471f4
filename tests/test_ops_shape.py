"""Shape/data-movement op references (Reshape, Slice, Split, Gather, Expand, Constant, ...)
against onnxruntime, and the shape inference they drive: value propagation through shape
computations, symbolic batch dims, attribute forms of old opsets, declared-unsupported cases."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype
from onnx.reference import ReferenceEvaluator

import plugrt
from plugrt.onnx.backend import prepare
from plugrt.onnx.importer import import_model

I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min


def _model(nodes, feeds, consts=None, outputs=("y",), opset=17, shapes=None):
    """A model of ``nodes``; ``feeds`` become graph inputs (``shapes`` may name symbolic
    dims), ``consts`` initializers."""
    shapes = shapes or {}
    inputs = [helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(a.dtype), shapes.get(n, a.shape))
              for n, a in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (consts or {}).items()]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _node(op, inputs, outputs=("y",), name=None, **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=name or f"my_{op.lower()}", **attrs)


def _ort(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _check(model, feeds):
    expected = _ort(model, feeds)
    got = prepare(model, "CPU").run(feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        np.testing.assert_array_equal(g, e)
    return got


def _one(op, feeds, consts=None, opset=17, n_outputs=1, shapes=None, **attrs):
    outputs = tuple(f"y{i}" for i in range(n_outputs))
    node = _node(op, list(feeds) + list(consts or {}), outputs, **attrs)
    return _check(_model([node], feeds, consts, outputs, opset, shapes), feeds)


def _x(rng, *shape, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng.integers(-50, 50, size=shape).astype(dtype)
    return x


def _infos(model):
    graph = import_model(model)
    return {name: v.info for name, v in graph.values.items()}


# ------------------------------------------------------------------ symbolic shape chains


def _batch_chain():
    """Shape -> Gather(0) -> Unsqueeze -> Concat([N], [12]) -> Reshape, on x[N,3,4]."""
    nodes = [
        _node("Shape", ["x"], ["s"], name="shape"),
        _node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        _node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsq"),
        _node("Concat", ["n1", "twelve"], ["target"], name="concat", axis=0),
        _node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    consts = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64), "twelve": np.array([12], np.int64)}
    return nodes, consts


@pytest.mark.parametrize("batch", [2, 5])
def test_shape_gather_unsqueeze_concat_reshape_symbolic_batch(rng, batch):
    nodes, consts = _batch_chain()
    x = _x(rng, batch, 3, 4)
    model = _model(nodes, {"x": x}, consts, shapes={"x": ["N", 3, 4]})
    infos = _infos(model)
    assert infos["s"].value is None and infos["s"].shape == (3,)
    assert infos["target"].shape == (2,) and infos["target"].value is None
    assert infos["y"].rank == 2
    got = _check(model, {"x": x})
    assert got[0].shape == (batch, 12)


def test_shape_chain_static_propagates_values(rng):
    nodes, consts = _batch_chain()
    x = _x(rng, 6, 3, 4)
    model = _model(nodes, {"x": x}, consts)
    infos = _infos(model)
    np.testing.assert_array_equal(infos["s"].value, [6, 3, 4])
    np.testing.assert_array_equal(infos["target"].value, [6, 12])
    assert infos["y"].shape == (6, 12)
    _check(model, {"x": x})


def test_shape_value_with_symbolic_dims_outside_the_slice(rng):
    x = _x(rng, 3, 5, 2)
    model = _model([_node("Shape", ["x"], ["y"], start=1)], {"x": x}, opset=15, shapes={"x": ["N", 5, 2]})
    info = _infos(model)["y"]
    np.testing.assert_array_equal(info.value, [5, 2])
    assert _infos(_model([_node("Shape", ["x"], ["y"], end=-1)], {"x": x}, opset=15,
                         shapes={"x": ["N", 5, 2]}))["y"].value is None
    for start, end in [(1, None), (-2, None), (0, -1), (-10, 10), (2, 1)]:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        _check(_model([_node("Shape", ["x"], ["y"], **attrs)], {"x": x}, opset=15), {"x": x})


def test_reshape_minus_one_with_symbolic_dims(rng):
    x = _x(rng, 4, 3, 4)
    shapes = {"x": ["N", 3, 4]}
    for target, expect in [([-1, 12], ("N", 12)), ([0, -1], ("N", 12)), ([0, 6, -1], ("N", 6, 2)),
                           ([-1, 4], ("N*3", 4)), ([-1], ("N*12",))]:
        model = _model([_node("Reshape", ["x", "t"])], {"x": x}, {"t": np.array(target, np.int64)}, shapes=shapes)
        assert _infos(model)["y"].shape == expect, target
        _check(model, {"x": x})
    model = _model([_node("Reshape", ["x", "t"])], {"x": x}, {"t": np.array([2, -1], np.int64)}, shapes=shapes)
    (dim0, dim1) = _infos(model)["y"].shape
    assert dim0 == 2 and isinstance(dim1, str)


def test_unknown_shape_inputs_give_fresh_dims_of_the_right_rank(rng):
    x = _x(rng, 2, 3, 4)
    t = np.array([4, 6], np.int64)
    model = _model([_node("Reshape", ["x", "t"], name="r")], {"x": x, "t": t})
    assert _infos(model)["y"].shape == ("r_d0", "r_d1")
    _check(model, {"x": x, "t": t})
    e = np.array([3, 2, 1, 4], np.int64)
    model = _model([_node("Expand", ["x", "e"], name="e")], {"x": x, "e": e})
    assert _infos(model)["y"].shape == ("e_d0", 2, 3, 4)
    _check(model, {"x": x, "e": e})
    starts, ends = np.array([1], np.int64), np.array([3], np.int64)
    model = _model([_node("Slice", ["x", "s", "t", "a"], name="s")], {"x": x, "s": starts, "t": ends},
                   {"a": np.array([-1], np.int64)})
    assert _infos(model)["y"].shape == (2, 3, "s_d2")
    _check(model, {"x": x, "s": starts, "t": ends})


def test_symbolic_dims_through_shape_ops(rng):
    x = _x(rng, 3, 4, 5)
    shapes = {"x": ["N", 4, 5]}
    cases = [
        (_node("Slice", ["x", "s", "e", "a"]), {"s": [1], "e": [I64_MAX], "a": [0]}, ("(N-1)", 4, 5)),
        (_node("Slice", ["x", "s", "e", "a"]), {"s": [0, 1], "e": [I64_MAX, 3], "a": [0, 1]}, ("N", 2, 5)),
        (_node("Tile", ["x", "r"]), {"r": [2, 1, 3]}, ("N*2", 4, 15)),
        (_node("Expand", ["x", "r"]), {"r": [2, 1, 1, 1]}, (2, "N", 4, 5)),
        (_node("Unsqueeze", ["x", "r"]), {"r": [-1, 1]}, ("N", 1, 4, 5, 1)),
        (_node("Split", ["x", "r"], ["y", "z"], axis=1), {"r": [1, 3]}, ("N", 1, 5)),
        (_node("Flatten", ["x"], axis=1), {}, ("N", 20)),
        (_node("Concat", ["x", "x"], axis=0), {}, ("(N+N)", 4, 5)),
    ]
    for node, consts, expect in cases:
        consts = {k: np.array(v, np.int64) for k, v in consts.items()}
        model = _model([node], {"x": x}, consts, outputs=tuple(node.output), shapes=shapes)
        assert _infos(model)["y"].shape == expect, node.op_type
        _check(model, {"x": x})


# ------------------------------------------------------------------ reshaping ops


def test_reshape_allowzero_and_empty(rng):
    x = np.zeros((0, 3, 2), np.float32)
    _one("Reshape", {"x": x}, {"t": np.array([3, 0, 2], np.int64)}, opset=14, allowzero=1)
    _one("Reshape", {"x": x}, {"t": np.array([0, 6], np.int64)}, opset=14)
    x = _x(rng, 2, 3, 5)
    _one("Reshape", {"x": x}, {"t": np.array([5, 0, -1], np.int64)}, opset=14)
    _one("Reshape", {"x": x}, {"t": np.array([0, 0, 5], np.int64)}, opset=14, allowzero=0)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -4])
def test_flatten(rng, axis):
    _one("Flatten", {"x": _x(rng, 2, 3, 1, 5)}, axis=axis)


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.bool_])
def test_transpose(rng, dtype):
    x = _x(rng, 2, 3, 5, 7, dtype=np.int32).astype(dtype)
    _one("Transpose", {"x": x})
    for _ in range(3):
        _one("Transpose", {"x": x}, perm=[int(p) for p in rng.permutation(4)])


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat_three_inputs(rng, axis):
    shapes = [[3, 5], [3, 5], [3, 5]]
    a = axis % 2
    for i, s in enumerate(shapes):
        s[a] = [1, 4, 2][i]
    feeds = {f"x{i}": _x(rng, *s, dtype=np.int64) for i, s in enumerate(shapes)}
    _one("Concat", feeds, axis=axis)


def test_split_forms(rng):
    x = _x(rng, 4, 7, 3)
    _one("Split", {"x": x}, opset=11, n_outputs=3, axis=1, split=[2, 4, 1])
    _one("Split", {"x": x}, opset=11, n_outputs=2, axis=0)
    _one("Split", {"x": x}, {"s": np.array([0, 5, 2], np.int64)}, opset=13, n_outputs=3, axis=-2)
    _one("Split", {"x": x}, opset=18, n_outputs=3, axis=1, num_outputs=3)
    _one("Split", {"x": x}, opset=18, n_outputs=4, axis=1, num_outputs=4)
    _one("Split", {"x": x}, opset=13, n_outputs=3, axis=-1)


def _slice_params(rng, shape):
    axes = [int(a) for a in rng.choice(len(shape), size=rng.integers(1, len(shape) + 1), replace=False)]
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = int(rng.choice([-3, -2, -1, 1, 2, 3]))
        pool = [-d - 5, -d, -2, -1, 0, 1, d // 2, d - 1, d, d + 4, I64_MAX, I64_MIN]
        starts.append(int(rng.choice(pool)))
        ends.append(int(rng.choice(pool)))
        steps.append(step)
    axes = [a - len(shape) if rng.random() < 0.5 else a for a in axes]
    return starts, ends, axes, steps


def test_slice_random_steps_and_clamping(rng):
    x = _x(rng, 5, 7, 4)
    for _ in range(25):
        starts, ends, axes, steps = _slice_params(rng, x.shape)
        consts = {k: np.array(v, np.int64) for k, v in
                  {"s": starts, "e": ends, "a": axes, "t": steps}.items()}
        _one("Slice", {"x": x}, consts)
    _one("Slice", {"x": x}, {"s": np.array([1, -3], np.int32), "e": np.array([100, -1], np.int32)})


def test_slice_attribute_form_opset9(rng):
    x = _x(rng, 5, 7, 4)
    _one("Slice", {"x": x}, opset=9, starts=[1, -100], ends=[-1, 3], axes=[0, 2])
    _one("Slice", {"x": x}, opset=9, starts=[0, 2], ends=[1000, 5])


def test_squeeze_unsqueeze_forms(rng):
    x = _x(rng, 1, 3, 1, 5, 1)
    _one("Squeeze", {"x": x}, opset=11, axes=[0, -1])
    _one("Squeeze", {"x": x}, opset=11)
    _one("Squeeze", {"x": x}, {"a": np.array([-3], np.int64)}, opset=13)
    _one("Squeeze", {"x": x}, opset=13)
    y = _x(rng, 3, 5)
    _one("Unsqueeze", {"x": y}, opset=11, axes=[0, -1, 2])
    _one("Unsqueeze", {"x": y}, {"a": np.array([3, 0], np.int64)}, opset=13)
    _one("Unsqueeze", {"x": np.array(2.5, np.float32)}, {"a": np.array([0], np.int64)}, opset=13)


# ------------------------------------------------------------------ selection ops


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(rng, axis):
    x = _x(rng, 4, 5, 6)
    d = x.shape[axis]
    idx = rng.integers(-d, d, size=(2, 3)).astype(np.int64)
    _one("Gather", {"x": x, "i": idx}, axis=axis)
    _one("Gather", {"x": x, "i": np.array(-1, np.int32)}, axis=axis)


@pytest.mark.parametrize("axis", [0, 2, -2])
def test_gather_elements(rng, axis):
    x = _x(rng, 4, 5, 6)
    shape = [3, 4, 5]
    d = x.shape[axis]
    idx = rng.integers(-d, d, size=shape).astype(np.int64)
    _one("GatherElements", {"x": x, "i": idx}, axis=axis)



def _nd_indices(rng, shape, dims):
    """GatherND index tuples (the last axis of ``shape``) into ``dims``, half negative."""
    high = np.broadcast_to(np.array(dims, np.int64), shape)
    picks = rng.integers(0, high)
    return np.where(rng.random(shape) < 0.5, picks - high, picks).astype(np.int64)


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_gather_nd_negative_indices(rng, opset):
    x = _x(rng, 3, 5, 2)
    _one("GatherND", {"x": x, "i": _nd_indices(rng, (4, 1), (3,))}, opset=opset)
    _one("GatherND", {"x": x, "i": _nd_indices(rng, (2, 3, 2), (3, 5))}, opset=opset)
    _one("GatherND", {"x": x.astype(np.int32), "i": _nd_indices(rng, (3,), (3, 5, 2))}, opset=opset)


@pytest.mark.parametrize("batch_dims, data_shape, index_shape", [
    (1, (2, 3, 4), (2, 5, 2)), (1, (3, 4), (3, 1)), (2, (2, 3, 5, 2), (2, 3, 4, 1)), (1, (2, 3, 4, 2), (2, 2))])
def test_gather_nd_batch_dims(rng, batch_dims, data_shape, index_shape):
    x = _x(rng, *data_shape, dtype=np.float16)
    idx = _nd_indices(rng, index_shape, data_shape[batch_dims:batch_dims + index_shape[-1]])
    _one("GatherND", {"x": x, "i": idx}, opset=13, batch_dims=batch_dims)


def test_gather_nd_symbolic_dims(rng):
    x, idx = _x(rng, 2, 4, 3), _nd_indices(rng, (2, 5, 1), (4,))
    model = _model([_node("GatherND", ["x", "i"], batch_dims=1)], {"x": x, "i": idx}, opset=13,
                   shapes={"x": ["N", 4, 3], "i": [2, "T", 1]})
    assert _infos(model)["y"].shape == (2, "T", 3)  # the batch dim is the indices' 2
    np.testing.assert_array_equal(prepare(model, "CPU").run({"x": x, "i": idx})[0], _ort(model, {"x": x, "i": idx})[0])
    model = _model([_node("GatherND", ["x", "i"])], {"x": x, "i": idx}, shapes={"x": ["N", 4, 3], "i": [2, "T", "K"]})
    with pytest.raises(plugrt.UnsupportedError, match="my_gathernd.*last dim"):
        import_model(model)


def test_gather_nd_bad_input_is_refused(rng):
    x = _x(rng, 3, 4)

    def refused(error, match, idx, opset=13, **attrs):
        model = _model([_node("GatherND", ["x", "i"], **attrs)], {"x": x, "i": idx}, opset=opset)
        with pytest.raises(error, match=match):
            prepare(model, "CPU").run({"x": x, "i": idx})

    refused(plugrt.ShapeError, "my_gathernd.*3 entries.*1 to 2", np.zeros((2, 3), np.int64))
    refused(plugrt.ShapeError, "my_gathernd.*1 to 1 entries", np.zeros((3, 2), np.int64), batch_dims=1)
    refused(plugrt.ShapeError, "my_gathernd.*differ at batch axis 0", np.zeros((2, 1), np.int64), batch_dims=1)
    refused(plugrt.ShapeError, "my_gathernd.*batch_dims=2", np.zeros((3, 1), np.int64), batch_dims=2)
    refused(plugrt.UnsupportedError, "my_gathernd.*dtype int32.*int64", np.zeros((2, 1), np.int32))
    refused(plugrt.ModelError, "my_gathernd.*opset 12", np.zeros((3, 1), np.int64), opset=11, batch_dims=1)
    refused(plugrt.ModelError, "my_gathernd.*: index 4 is out of range \\[-4, 3\\] for axis 1",
            np.array([[0, 4]], np.int64))
    refused(plugrt.ModelError, "my_gathernd.*: index -4 is out of range \\[-3, 2\\] for axis 0",
            np.array([[-4]], np.int64))


@pytest.mark.parametrize("batch_axis, shape", [(1, (5, 3)), (0, (3, 5)), (1, (4, 3, 2, 3)), (0, (2, 6, 1))])
def test_reverse_sequence(rng, batch_axis, shape):
    time_axis = 1 - batch_axis
    x = _x(rng, *shape, dtype=np.int16)
    lens = rng.integers(0, shape[time_axis] + 1, size=shape[batch_axis]).astype(np.int64)
    lens[0] = shape[time_axis]  # at least one full reversal
    _one("ReverseSequence", {"x": x, "l": lens}, opset=10, batch_axis=batch_axis, time_axis=time_axis)


def test_reverse_sequence_symbolic_dims_and_bad_input(rng):
    x, lens = _x(rng, 4, 3, 2), np.array([4, 1, 2], np.int64)
    model = _model([_node("ReverseSequence", ["x", "l"])], {"x": x, "l": lens}, opset=10,
                   shapes={"x": ["T", "B", 2], "l": ["B"]})
    assert _infos(model)["y"].shape == ("T", "B", 2)
    np.testing.assert_array_equal(prepare(model, "CPU").run({"x": x, "l": lens})[0], _ort(model, {"x": x, "l": lens})[0])

    def refused(error, match, lens, feed=x, **attrs):
        model = _model([_node("ReverseSequence", ["x", "l"], **attrs)], {"x": feed, "l": lens}, opset=10)
        with pytest.raises(error, match=match):
            prepare(model, "CPU").run({"x": feed, "l": lens})

    refused(plugrt.ShapeError, "my_reversesequence.*shape \\[2\\].*one length per index of batch_axis 1",
            np.array([1, 2], np.int64))
    refused(plugrt.ShapeError, "my_reversesequence.*must be 0 and 1", lens, batch_axis=2)
    refused(plugrt.ShapeError, "my_reversesequence.*rank 2 or more", lens[:1], feed=x[:1, 0, 0])
    refused(plugrt.UnsupportedError, "my_reversesequence.*dtype int32.*int64", lens.astype(np.int32))
    refused(plugrt.ModelError, "my_reversesequence.*sequence length 5 is out of range \\[0, 4\\]",
            np.array([1, 5, 2], np.int64))

def test_expand_and_tile(rng):
    x = _x(rng, 3, 1, 5)
    for shape in ([2, 1, 4, 1], [5], [3, 7, 1], [1, 1, 1]):
        _one("Expand", {"x": x}, {"s": np.array(shape, np.int64)})
    _one("Tile", {"x": x}, {"r": np.array([2, 3, 1], np.int64)})
    _one("Tile", {"x": x.astype(np.int16)}, {"r": np.array([1, 0, 2], np.int64)})


@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(rng, upper):
    x = _x(rng, 2, 4, 7, dtype=np.int64)
    _one("Trilu", {"x": x}, upper=upper)
    for k in (-5, -1, 2, 9):
        _one("Trilu", {"x": x}, {"k": np.array(k, np.int64)}, upper=upper)


def test_identity_and_dropout_inference(rng):
    x = _x(rng, 3, 4)
    _one("Identity", {"x": x.astype(np.uint8)})
    # onnxruntime's Dropout-10 returns an all-False mask in inference; the spec (and ONNX's
    # reference) say the mask is all True, so check that opset against the spec directly.
    model = _model([_node("Dropout", ["x"], ["y0", "y1"], ratio=0.3)], {"x": x}, outputs=("y0", "y1"), opset=10)
    y, mask = prepare(model, "CPU").run({"x": x})
    np.testing.assert_array_equal(y, _ort(model, {"x": x})[0])
    assert mask.dtype == bool and mask.shape == x.shape and mask.all()
    consts = {"r": np.array(0.7, np.float32), "t": np.array(False)}
    got = _one("Dropout", {"x": x}, consts, opset=13, n_outputs=2)
    assert got[1].dtype == bool and got[1].all()
    got = prepare(_model([_node("Dropout", ["x"], ["y", "m"])], {"x": x}, outputs=("y", "m"), opset=7)).run({"x": x})
    assert got[1].dtype == np.float32 and (got[1] == 1).all()


# ------------------------------------------------------------------ generators


def test_constant_forms():
    cases = [
        {"value": numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3))},
        {"value_float": 1.5}, {"value_floats": [1.0, -2.5]}, {"value_int": -3}, {"value_ints": [4, 5, 6]},
    ]
    for attrs in cases:
        model = _model([_node("Constant", [], **attrs)], {}, opset=13)
        got = _check(model, {})
        assert _infos(model)["y"].value is not None
        assert got[0].dtype == (np.float32 if "float" in next(iter(attrs)) else got[0].dtype)



def test_eye_like(rng):
    for shape, k in (((4, 4), 0), ((3, 5), 2), ((5, 3), -1), ((2, 6), -4), ((3, 4), 7)):
        _one("EyeLike", {"x": _x(rng, *shape, dtype=np.int32)}, opset=9, k=k)
    _one("EyeLike", {"x": _x(rng, 3, 4)}, opset=9, dtype=TensorProto.DOUBLE, k=1)
    _one("EyeLike", {"x": _x(rng, 3, 2)}, opset=9, dtype=TensorProto.INT64)
    # onnxruntime implements EyeLike-9 only, and not for float16: opset 22 against ONNX's reference
    x = _x(rng, 3, 5, dtype=np.int64)
    for dtype, k in ((TensorProto.FLOAT16, -2), (TensorProto.BOOL, 1), (None, 0)):
        attrs = {"k": k} if dtype is None else {"dtype": dtype, "k": k}
        model = _model([_node("EyeLike", ["x"], **attrs)], {"x": x}, opset=22)
        got, = prepare(model, "CPU").run({"x": x})
        want, = ReferenceEvaluator(model).run(None, {"x": x})
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_eye_like_symbolic_dims_and_bad_input(rng):
    x = _x(rng, 3, 5)
    model = _model([_node("EyeLike", ["x"], dtype=TensorProto.DOUBLE)], {"x": x}, shapes={"x": ["N", 5]})
    assert _infos(model)["y"].shape == ("N", 5) and _infos(model)["y"].dtype == np.float64
    np.testing.assert_array_equal(prepare(model, "CPU").run({"x": x})[0], _ort(model, {"x": x})[0])
    with pytest.raises(plugrt.ShapeError, match="my_eyelike.*rank 2, got shape \\[2,3,4\\]"):
        import_model(_model([_node("EyeLike", ["x"])], {"x": _x(rng, 2, 3, 4)}))
    with pytest.raises(plugrt.UnsupportedError, match="my_eyelike.*dtype=BFLOAT16.*supported: FLOAT"):
        import_model(_model([_node("EyeLike", ["x"], dtype=TensorProto.BFLOAT16)], {"x": x}))

def test_constant_of_shape_and_range(rng):
    value = numpy_helper.from_array(np.array([7], np.int32))
    _one("ConstantOfShape", {}, {"s": np.array([2, 0, 3], np.int64)}, value=value)
    _one("ConstantOfShape", {}, {"s": np.array([3, 1], np.int64)})
    s = np.array([4, 2], np.int64)
    model = _model([_node("ConstantOfShape", ["s"], name="c")], {"s": s})
    assert _infos(model)["y"].shape == ("c_d0", "c_d1")
    _check(model, {"s": s})
    for dtype, (start, limit, delta) in [(np.int64, (10, -7, -3)), (np.int32, (-4, 9, 2)), (np.int16, (3, 3, 1)),
                                         (np.float32, (1.5, -2.2, -0.4)), (np.float64, (0.1, 2.0, 0.3))]:
        consts = {k: np.array(v, dtype) for k, v in zip("sld", (start, limit, delta))}
        model = _model([_node("Range", list(consts))], {}, consts)
        n = _infos(model)["y"].shape[0]
        expected = _ort(model, {})[0]
        got = prepare(model).run({})[0]
        assert got.dtype == expected.dtype and got.shape == expected.shape == (n,)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    feeds = {k: np.array(v, np.int64) for k, v in zip("sld", (2, 11, 4))}
    model = _model([_node("Range", list(feeds), name="rg")], feeds)
    assert _infos(model)["y"].shape == ("rg_d0",)
    _check(model, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_onehot(rng, axis):
    idx = rng.integers(-6, 8, size=(3, 4)).astype(np.int64)
    for depth, values, indices in ((np.array(5, np.int64), np.array([-1.5, 2.0], np.float32), idx),
                                   (np.array([4.0], np.float32), np.array([0, 9], np.int32), idx.astype(np.float32))):
        model = _model([_node("OneHot", ["i", "d", "v"], axis=axis)], {"i": indices}, {"d": depth, "v": values}, opset=11)
        (got,) = prepare(model, "CPU").run({"i": indices})
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, _onehot_oracle(indices, int(depth.reshape(-1)[0]), values, axis))


def _onehot_oracle(indices, depth, values, axis):
    """OneHot by the spec's words, element by element (onnxruntime lacks most type combos)."""
    rank = indices.ndim + 1
    axis = axis + rank if axis < 0 else axis
    out = np.full(indices.shape[:axis] + (depth,) + indices.shape[axis:], values[0], dtype=values.dtype)
    for pos in np.ndindex(indices.shape):
        k = int(indices[pos])
        k = k + depth if k < 0 else k
        if 0 <= k < depth:
            out[pos[:axis] + (k,) + pos[axis:]] = values[1]
    return out


# ------------------------------------------------------------------ declared unsupported


def test_declared_unsupported_cases_name_the_node(rng):
    x = _x(rng, 3, 4)
    train = _model([_node("Dropout", ["x", "r", "t"], ["y"], name="drop_train")], {"x": x},
                   {"r": np.array(0.5, np.float32), "t": np.array(True)}, opset=13)
    with pytest.raises(plugrt.UnsupportedError, match="drop_train"):
        prepare(train)
    text = _model([_node("Constant", [], name="const_text", value_strings=["a", "b"])], {}, opset=13)
    with pytest.raises(plugrt.UnsupportedError, match="const_text"):
        prepare(text)
    runtime = _model([_node("Dropout", ["x", "r", "t"], ["y"], name="drop_rt")],
                     {"x": x, "t": np.array(True)}, {"r": np.array(0.5, np.float32)}, opset=13)
    rep = prepare(runtime)
    np.testing.assert_array_equal(rep.run({"x": x, "t": np.array(False)})[0], x)
    with pytest.raises(plugrt.UnsupportedError, match="drop_rt"):
        rep.run({"x": x, "t": np.array(True)})
    assert TensorProto.STRING  # strings stay unsupported across the family
