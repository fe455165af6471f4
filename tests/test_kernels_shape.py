"""CUDA tactics of the data-movement ops (``shape.copies``, ``shape.transpose``) and generator
ops (``shape.generators``) against their NumPy references, in the simulator without a GPU.

Every dtype class (float16/32/64, signed and unsigned ints, bool), negative axes, empty
and rank-0 tensors, and inputs known at build time versus runtime tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from onnx import numpy_helper

from plugrt.errors import ModelError, UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.plugin import TensorInfo
from plugrt.testing import check_node, node_tactics, run_tactic, single_node_model

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint16, np.int32, np.int64, np.bool_]
I64 = np.int64


def _data(rng, shape, dtype=np.float32):
    """Random, mostly nonzero data of any dtype."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) + 0.1).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    low = 1 if dtype.kind == "u" else -50
    return rng.integers(low, 50, size=shape).astype(dtype)


def _i64(*values):
    return np.array(values, dtype=I64)


def _runtime(registry, op_type, feeds, attrs=None, *, constants=(), opset=17, n_outputs=1):
    """Run every tactic with the non-constant inputs as runtime tensors and concrete
    output shapes taken from the reference (for ops whose output shape inference cannot
    know, such as Range of runtime scalars); returns the tactics' names."""
    model = single_node_model(op_type, feeds, attrs, constants, opset=opset, n_outputs=n_outputs)
    graph = import_model(model, registry=registry)
    node = graph.nodes[0]
    op = registry.op(node)
    arrays = [np.asarray(feeds[n]) if n else None for n in node.inputs]
    expected = op.reference(node, arrays)
    ins = [graph.info(n) if n else None for n in node.inputs]
    outs = [TensorInfo(e.dtype, e.shape) for e in expected]
    tactics = op.tactics(node, ins, outs)
    assert tactics
    for tactic in tactics:
        dev_ins = [None if a is None else cuda.to_device(np.ascontiguousarray(a)) for a in arrays]
        dev_outs = [cuda.device_array(e.shape, e.dtype) for e in expected]
        for launch in tactic.launches(dev_ins, dev_outs, None):
            launch.kernel[launch.grid, launch.block, 0, launch.shared_bytes](*launch.args)
        for got, want in zip(dev_outs, expected):
            got = got.copy_to_host()
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=0,
                                       err_msg=f"{op_type} tactic {tactic.name}")
    return [t.name for t in tactics]


# --------------------------------------------------------------------------- copies


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_every_dtype(rng, dtype):
    x = _data(rng, (2, 3, 5), dtype)
    check_node("Reshape", {"x": x, "shape": _i64(5, 0, -1)}, constants={"shape"})


def test_reshape_rank0_empty_and_runtime_shape(rng, registry):
    check_node("Reshape", {"x": _data(rng, ()), "shape": _i64(1, 1)}, constants={"shape"})
    check_node("Reshape", {"x": _data(rng, (0, 3)), "shape": _i64(3, 0)}, {"allowzero": 1}, constants={"shape"})
    # The shape tensor arrives at run time: the copy does not need its values.
    assert _runtime(registry, "Reshape", {"x": _data(rng, (4, 3)), "shape": _i64(2, 6)}) == ["copy"]


@pytest.mark.parametrize("axis", [0, 2, -1, -3])
def test_flatten(rng, axis):
    check_node("Flatten", {"x": _data(rng, (2, 3, 2), np.int8)}, {"axis": axis})


def test_squeeze_unsqueeze_identity(rng):
    x = _data(rng, (3, 1, 2, 1), np.uint16)
    check_node("Squeeze", {"x": x, "axes": _i64(-1, 1)}, constants={"axes"})
    check_node("Squeeze", {"x": x}, opset=11)
    check_node("Unsqueeze", {"x": _data(rng, (3, 2), np.bool_), "axes": _i64(-1, 0)}, constants={"axes"})
    check_node("Unsqueeze", {"x": _data(rng, (), np.float16)}, {"axes": [0]}, opset=11)
    check_node("Identity", {"x": _data(rng, (7,), np.float64)})


@pytest.mark.parametrize("opset, dtype", [(7, np.float32), (7, np.float16), (13, np.float64), (13, np.float32)])
def test_dropout_inference_with_mask(rng, opset, dtype):
    check_node("Dropout", {"x": _data(rng, (3, 5), dtype)}, opset=opset, n_outputs=2)


def test_dropout_training_mode_input(rng, registry):
    x = _data(rng, (2, 3))
    feeds = {"x": x, "ratio": np.array(0.3, np.float32), "training_mode": np.array(False)}
    check_node("Dropout", feeds, constants={"ratio", "training_mode"}, n_outputs=2)
    # A runtime training_mode (or ratio) is checked on the device: no dropping is a copy ...
    for ratio, training in [(0.3, False), (0.0, True), (-0.0, True)]:
        feeds = {"x": x, "ratio": np.array(ratio, np.float32), "training_mode": np.array(training)}
        _runtime(registry, "Dropout", feeds, n_outputs=2)
        _runtime(registry, "Dropout", feeds, constants={"ratio"}, n_outputs=2)
    _runtime(registry, "Dropout", {"x": x, "ratio": np.array(0.0), "training_mode": np.array(True)},
             constants={"training_mode"}, n_outputs=2)


def test_dropout_runtime_training_with_nonzero_ratio_poisons(registry, rng):
    x = _data(rng, (5,), np.float16)
    feeds = {"x": x, "ratio": np.array(0.5, np.float16), "training_mode": np.array(True)}
    graph = import_model(single_node_model("Dropout", feeds, n_outputs=2), registry=registry)
    node = graph.nodes[0]
    op = registry.op(node)
    (tactic,) = op.tactics(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs])
    ins = [cuda.to_device(a) for a in feeds.values()]
    outs = [cuda.device_array(5, np.float16), cuda.device_array(5, np.bool_)]
    for launch in tactic.launches(ins, outs, None):
        launch.kernel[launch.grid, launch.block, 0, launch.shared_bytes](*launch.args)
    assert np.isnan(outs[0].copy_to_host()).all()


# --------------------------------------------------------------------------- strided copies


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_, np.uint8])
@pytest.mark.parametrize("perm", [None, [2, 0, 1], [0, 2, 1, 3], [1, 0, 2, 3]])
def test_transpose(rng, dtype, perm):
    shape = (2, 3, 4) if perm is None or len(perm) == 3 else (2, 3, 2, 3)
    check_node("Transpose", {"x": _data(rng, shape, dtype)}, {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.bool_])
@pytest.mark.parametrize("shape, perm", [
    ((2, 5, 3, 6), [0, 2, 3, 1]), ((2, 5, 3, 6), [0, 3, 1, 2]), ((9, 7), [1, 0]), ((2, 3, 5, 4), [0, 1, 3, 2]),
    ((3, 2, 5), [-1, 0, 1]), ((2, 17, 3, 2), [0, 2, 3, 1]), ((1, 3, 4, 5), [0, 2, 3, 1]),
])
def test_transpose_moving_the_contiguous_axis_is_tiled(rng, registry, dtype, shape, perm):
    """Every tactic against the reference; the output's last axis narrow (at most 16,
    e.g. an image's channels going last) puts the one-thread-per-row kernel first; the
    strided copy of any rank (a profile's generic tactic) comes last."""
    from plugrt.testing import node_tactics

    check_node("Transpose", {"x": _data(rng, shape, dtype)}, {"perm": perm})
    graph = import_model(single_node_model("Transpose", {"x": _data(rng, shape, dtype)}, {"perm": perm}))
    narrow = graph.info(graph.outputs[0]).shape[-1] <= 16
    assert [t.name for t in node_tactics(graph, registry)] == ["narrow"] * narrow + ["tiled", "strided", "strided_any_rank"]


@pytest.mark.parametrize("dtype, shape, perm, unit", [
    (np.float16, (2, 3, 2, 5, 2, 4), [0, 1, 3, 2, 4, 5], 8),  # space to depth over 4 channels: 16-byte runs
    (np.float16, (2, 3, 2, 5, 2, 3), [0, 1, 3, 2, 4, 5], 4),  # over 3 channels: 12-byte runs
    (np.float32, (2, 3, 4, 6), [0, 2, 1, 3], 8),              # attention's head split, heads of 6
    (np.uint8, (3, 2, 12), [1, 0, 2], 4),
])
def test_transpose_moves_whole_contiguous_runs_in_wide_units(rng, registry, dtype, shape, perm, unit):
    """A permutation keeping the contiguous axis last moves its runs 8 or 4 bytes at a time
    (``strided_u8``/``strided_u4``, then the element-wise copy); both match the reference."""
    check_node("Transpose", {"x": _data(rng, shape, dtype)}, {"perm": perm})
    graph = import_model(single_node_model("Transpose", {"x": _data(rng, shape, dtype)}, {"perm": perm}))
    assert [t.name for t in node_tactics(graph, registry)] == [f"strided_u{unit}", "strided", "strided_any_rank"]


def test_runs_no_unit_divides_and_a_misaligned_array_move_element_by_element(rng, registry):
    graph = import_model(single_node_model("Transpose", {"x": _data(rng, (2, 3, 5), np.float16)}, {"perm": [1, 0, 2]}))
    assert [t.name for t in node_tactics(graph, registry)] == ["strided", "strided_any_rank"]  # runs of 10 bytes
    x = _data(rng, (2, 3, 4), np.float16)
    graph = import_model(single_node_model("Transpose", {"x": x}, {"perm": [1, 0, 2]}))
    wide = node_tactics(graph, registry)[0]
    room = cuda.to_device(np.concatenate([np.zeros(1, np.float16), x.ravel()]))
    shifted = room[1:].reshape(x.shape)  # 2 bytes past an 8-byte boundary
    out = cuda.device_array((3, 2, 4), np.float16)
    launches = wide.launches([shifted], [out], None)
    assert wide.name == "strided_u8" and launches[0].args[0].dtype == np.uint16
    for launch in launches:
        launch.kernel[launch.grid, launch.block](*launch.args)
    np.testing.assert_array_equal(out.copy_to_host(), np.transpose(x, (1, 0, 2)))


def test_transpose_identity_and_size_one_axes(rng):
    check_node("Transpose", {"x": _data(rng, (1, 5, 1, 3))}, {"perm": [2, 0, 1, 3]})
    check_node("Transpose", {"x": _data(rng, (0, 3))})
    check_node("Transpose", {"x": _data(rng, ())})


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1, 0], [3, 10], None, None),
    ([-1, 3], [-10, 0], [2, 1], [-2, -1]),              # negative steps from the end
    ([-100], [100], [-1], [3]),                         # clamping, negative axis
    ([5], [-100], [0], [-1]),                           # start past the end, stepping back
    ([2], [2], [1], [1]),                               # empty result
    ([0, -2], [2**62, -1], [-3, -2], [1, 1]),           # huge end
])
def test_slice_known_params(rng, starts, ends, axes, steps):
    feeds = {"x": _data(rng, (3, 4, 5), np.int32), "starts": _i64(*starts), "ends": _i64(*ends)}
    if axes is not None:
        feeds["axes"] = _i64(*axes)
    if steps is not None:
        feeds["steps"] = _i64(*steps)
    check_node("Slice", feeds, constants=set(feeds) - {"x"})


def test_slice_int32_params_dtypes_and_old_opset(rng):
    for dtype in (np.float16, np.bool_, np.uint64):
        feeds = {"x": _data(rng, (4, 3), dtype), "starts": np.array([3, 1], np.int32),
                 "ends": np.array([0, 3], np.int32), "axes": np.array([0, -1], np.int32),
                 "steps": np.array([-1, 1], np.int32)}
        check_node("Slice", feeds, constants={"starts", "ends", "axes", "steps"})
    check_node("Slice", {"x": _data(rng, (4, 3))}, {"starts": [1], "ends": [-1], "axes": [0]}, opset=9)


def test_slice_runtime_params_are_refused(rng, registry):
    feeds = {"x": _data(rng, (4, 3)), "starts": _i64(1), "ends": _i64(3)}
    with pytest.raises(UnsupportedError, match="run time"):
        _runtime(registry, "Slice", feeds)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int16, np.bool_])
@pytest.mark.parametrize("x_shape, target", [
    ((3, 1), (2, 1, 4)), ((1,), (5,)), ((2, 1, 3), (2, 4, 3)), ((), (2, 3)), ((4,), (1, 4)), ((3, 1), (0, 3, 2)),
])
def test_expand(rng, dtype, x_shape, target):
    check_node("Expand", {"x": _data(rng, x_shape, dtype), "shape": _i64(*target)}, constants={"shape"})


@pytest.mark.parametrize("dtype", [np.float64, np.uint16, np.bool_])
@pytest.mark.parametrize("shape, repeats", [((2, 3), (2, 1)), ((3,), (3,)), ((2, 1, 3), (1, 3, 2)), ((2, 2), (0, 2))])
def test_tile(rng, dtype, shape, repeats):
    check_node("Tile", {"x": _data(rng, shape, dtype), "repeats": _i64(*repeats)}, constants={"repeats"})


# --------------------------------------------------------------------------- row blocks


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_concat(rng, axis, dtype):
    shapes = [(2, 3, 2), (2, 3, 2), (2, 3, 2)]
    sizes = [1, 3, 2]
    feeds = {}
    for k, (shape, size) in enumerate(zip(shapes, sizes)):
        shape = list(shape)
        shape[axis] = size
        feeds[f"x{k}"] = _data(rng, tuple(shape), dtype)
    check_node("Concat", feeds, {"axis": axis})


def test_concat_with_empty_and_single_input(rng):
    check_node("Concat", {"a": _data(rng, (2, 0)), "b": _data(rng, (2, 3)), "c": _data(rng, (2, 1))}, {"axis": -1})
    check_node("Concat", {"a": _data(rng, (4,), np.int8)}, {"axis": 0})


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_split_known_sizes(rng, dtype):
    x = _data(rng, (3, 6, 2), dtype)
    check_node("Split", {"x": x, "split": _i64(1, 0, 5)}, {"axis": -2}, constants={"split"}, n_outputs=3)
    check_node("Split", {"x": x}, {"axis": 0}, n_outputs=3)


def test_split_num_outputs_attribute_and_runtime_sizes(rng, registry):
    x = _data(rng, (7, 2), np.uint8)
    check_node("Split", {"x": x}, {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3)
    check_node("Split", {"x": x}, {"axis": 0, "split": [4, 3]}, opset=11, n_outputs=2)
    # Sizes known only at run time: the tactic takes them from the concrete output shapes.
    assert _runtime(registry, "Split", {"x": x, "split": _i64(2, 5)}, {"axis": 0}, n_outputs=2) == ["rows"]


# --------------------------------------------------------------------------- gathers


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_runtime_indices(rng, index_dtype, axis):
    x = _data(rng, (3, 4, 2), np.float32)
    dim = x.shape[axis]
    idx = rng.integers(-dim, dim, size=(2, 3)).astype(index_dtype)
    check_node("Gather", {"x": x, "idx": idx}, {"axis": axis})


def test_gather_dtypes_scalar_and_empty_indices(rng):
    for dtype in (np.float16, np.bool_, np.int8, np.float64):
        check_node("Gather", {"x": _data(rng, (5, 3), dtype), "idx": _i64(-1, 0, 4, -5)}, {"axis": 0})
    check_node("Gather", {"x": _data(rng, (5, 3)), "idx": np.array(-2, np.int64)}, {"axis": 0})
    check_node("Gather", {"x": _data(rng, (5, 3)), "idx": np.zeros((0,), np.int32)}, {"axis": -1})
    check_node("Gather", {"x": _data(rng, (5, 3)), "idx": np.array([4, -1], np.int32)}, constants={"idx"})


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_smaller_indices(rng, index_dtype, axis):
    x = _data(rng, (3, 4, 2), np.int16)
    dim = x.shape[axis]
    idx = rng.integers(-dim, dim, size=(2, 3, 2)).astype(index_dtype)
    check_node("GatherElements", {"x": x, "idx": idx}, {"axis": axis})


def test_gather_elements_dtypes(rng):
    for dtype in (np.float16, np.bool_, np.float64):
        x = _data(rng, (3, 3), dtype)
        check_node("GatherElements", {"x": x, "idx": rng.integers(-3, 3, size=(4, 2))}, {"axis": 0})



def _nd_indices(rng, shape, dims):
    """GatherND index tuples (the last axis of ``shape``) into ``dims``, about half negative."""
    high = np.broadcast_to(np.array(dims, I64), shape)
    picks = rng.integers(0, high)
    return np.where(rng.random(shape) < 0.5, picks - high, picks).astype(I64)


@pytest.mark.parametrize("batch_dims, data_shape, index_shape", [
    (0, (3, 5, 2), (4, 1)), (0, (3, 5, 2), (2, 3, 2)), (0, (3, 5, 2), (3,)), (0, (7,), (2, 2, 1)),
    (1, (2, 3, 4), (2, 5, 2)), (1, (3, 4), (3, 1)), (2, (2, 3, 5, 2), (2, 3, 4, 1)), (1, (2, 3, 4, 2), (2, 2))])
def test_gather_nd_runtime_indices(rng, batch_dims, data_shape, index_shape):
    x = _data(rng, data_shape, np.float32)
    idx = _nd_indices(rng, index_shape, data_shape[batch_dims:batch_dims + index_shape[-1]])
    check_node("GatherND", {"x": x, "idx": idx}, {"batch_dims": batch_dims}, opset=13)


def test_gather_nd_dtypes_constant_and_empty_indices(rng):
    for dtype in (np.float16, np.bool_, np.int8, np.float64, np.int64):
        check_node("GatherND", {"x": _data(rng, (4, 3), dtype), "idx": _nd_indices(rng, (5, 1), (4,))}, opset=13)
    check_node("GatherND", {"x": _data(rng, (4, 3)), "idx": _nd_indices(rng, (2, 2), (4, 3))}, constants={"idx"})
    check_node("GatherND", {"x": _data(rng, (4, 3)), "idx": np.zeros((0, 1), I64)}, opset=11)
    check_node("GatherND", {"x": _data(rng, (0, 3)), "idx": np.zeros((0, 1), I64)}, {"batch_dims": 1}, opset=12)


def test_gather_nd_out_of_range_indices_are_clamped_by_the_kernel(rng, registry):
    x = _data(rng, (3, 4))
    feeds = {"x": x, "idx": np.array([[0, 9], [-7, 1], [2, -2]], I64)}
    graph = import_model(single_node_model("GatherND", feeds, opset=13), registry=registry)
    with pytest.raises(ModelError, match=r"test_gathernd.*index -7 is out of range \[-3, 2\] for axis 0"):
        registry.op(graph.nodes[0]).reference(graph.nodes[0], list(feeds.values()))
    for tactic in node_tactics(graph, registry):
        (got,) = run_tactic(graph, tactic, feeds)
        np.testing.assert_array_equal(got, [x[0, 3], x[0, 1], x[2, 2]])


@pytest.mark.parametrize("batch_axis, shape", [(1, (5, 3)), (0, (3, 5)), (1, (4, 3, 2, 3)), (0, (2, 6, 1)),
                                               (0, (3, 0, 2))])
def test_reverse_sequence_runtime_lengths(rng, batch_axis, shape):
    time_axis = 1 - batch_axis
    lens = rng.integers(0, shape[time_axis] + 1, size=shape[batch_axis]).astype(I64)
    lens[0] = shape[time_axis]
    for dtype in (np.float32, np.float16, np.bool_):
        check_node("ReverseSequence", {"x": _data(rng, shape, dtype), "lens": lens},
                   {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10)
    check_node("ReverseSequence", {"x": _data(rng, shape, np.int64), "lens": lens},
               {"batch_axis": batch_axis, "time_axis": time_axis}, constants={"lens"}, opset=10)


def test_reverse_sequence_out_of_range_lengths_are_clamped_by_the_kernel(rng, registry):
    x = _data(rng, (4, 3))
    feeds = {"x": x, "lens": np.array([9, -2, 2], I64)}
    graph = import_model(single_node_model("ReverseSequence", feeds, opset=10), registry=registry)
    with pytest.raises(ModelError, match=r"test_reversesequence.*sequence length 9 is out of range \[0, 4\]"):
        registry.op(graph.nodes[0]).reference(graph.nodes[0], list(feeds.values()))
    want = x.copy()
    want[:, 0] = x[::-1, 0]  # 9 clamps to 4
    want[:2, 2] = x[1::-1, 2]  # -2 clamps to 0: column 1 unchanged
    for tactic in node_tactics(graph, registry):
        (got,) = run_tactic(graph, tactic, feeds)
        np.testing.assert_array_equal(got, want)

# --------------------------------------------------------------------------- generators


@pytest.mark.parametrize("shape, k", [((4, 4), 0), ((3, 5), 2), ((5, 3), -1), ((2, 3), 5), ((0, 3), 0)])
def test_eye_like(rng, shape, k):
    for dtype in (np.float32, np.int8, np.bool_):
        check_node("EyeLike", {"x": _data(rng, shape, dtype)}, {"k": k})
    check_node("EyeLike", {"x": _data(rng, shape, np.int64)}, {"k": k, "dtype": 10})  # to float16


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_k_known_runtime_and_omitted(rng, dtype, upper):
    x = _data(rng, (2, 3, 4), dtype)
    check_node("Trilu", {"x": x}, {"upper": upper})
    for k in (-2, 1, 7):
        check_node("Trilu", {"x": x, "k": np.array(k, I64)}, {"upper": upper}, constants={"k"})
    check_node("Trilu", {"x": x, "k": np.array(-1, I64)}, {"upper": upper})


def test_shape_and_size_write_known_dims(rng):
    x = _data(rng, (2, 3, 4), np.float16)
    check_node("Shape", {"x": x})
    check_node("Shape", {"x": x}, {"start": -2}, opset=15)
    check_node("Shape", {"x": x}, {"start": 2, "end": 1}, opset=15)
    check_node("Size", {"x": x})
    check_node("Size", {"x": _data(rng, (), np.bool_)})


def test_constant_of_shape_fills(rng):
    check_node("ConstantOfShape", {"s": _i64(2, 3)}, constants={"s"})
    for value in (np.array([-7], np.int32), np.array([True]), np.array([2.5], np.float16), np.array([3.25])):
        check_node("ConstantOfShape", {"s": _i64(3, 1, 2)}, {"value": numpy_helper.from_array(value)},
                   constants={"s"})
    check_node("ConstantOfShape", {"s": _i64(2, 0)}, constants={"s"})
    check_node("ConstantOfShape", {"s": np.zeros(0, I64)}, {"value": numpy_helper.from_array(np.array([4], I64))},
               constants={"s"})


def test_constant_writes_its_value(rng):
    check_node("Constant", {}, {"value": numpy_helper.from_array(_data(rng, (2, 3), np.float16))})
    check_node("Constant", {}, {"value": numpy_helper.from_array(_data(rng, (4,), np.bool_))})
    check_node("Constant", {}, {"value_float": 1.5})
    check_node("Constant", {}, {"value_ints": [3, -1, 2]})


@pytest.mark.parametrize("dtype, start, limit, delta", [
    (np.int64, 3, 17, 4), (np.int32, 10, -3, -4), (np.int16, -5, 5, 1),
    (np.float32, 1.5, 7.0, 0.7), (np.float64, -1.0, 1.0, 0.3), (np.float16, 0.5, 4.0, 0.25),
    (np.float32, 1.0, 0.0, 1.0),
])
def test_range_known_and_runtime_scalars(registry, dtype, start, limit, delta):
    feeds = {"start": np.array(start, dtype), "limit": np.array(limit, dtype), "delta": np.array(delta, dtype)}
    check_node("Range", feeds, constants=set(feeds), rtol=1e-6, atol=0)
    _runtime(registry, "Range", feeds)
    _runtime(registry, "Range", feeds, constants={"start"})


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.float32, np.float16, np.uint8])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_runtime_indices(rng, index_dtype, axis):
    depth = 4
    low = 0 if np.dtype(index_dtype).kind == "u" else -depth
    indices = rng.integers(low, depth + 1, size=(2, 3)).astype(index_dtype)
    if np.dtype(index_dtype).kind == "f":
        indices = indices + np.asarray(0.4, index_dtype)
    feeds = {"indices": indices, "depth": np.array(depth, I64), "values": np.array([2, -3], np.int32)}
    check_node("OneHot", feeds, {"axis": axis}, constants={"depth", "values"})


def test_one_hot_opsets_value_dtypes_and_runtime_values(rng):
    indices = np.array([[0, -1, 2], [5, 1, -3]], np.int64)
    for values in (np.array([0.5, 1.5], np.float16), np.array([False, True]), np.array([1, 9], np.uint64)):
        feeds = {"indices": indices, "depth": np.array([3.0], np.float32), "values": values}
        check_node("OneHot", feeds, constants={"depth", "values"})
        check_node("OneHot", feeds, constants={"depth", "values"}, opset=9)
        check_node("OneHot", feeds, {"axis": -2}, constants={"depth"})


def test_transpose_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile the Transpose kernels for sm_90."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.shape import transpose as T
        for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
            check(f"narrow {dt}", T.narrow_transpose_kernel,
                  [arr(dt), arr(dt), I64, I64, I64, I64, arr(np.int64), arr(np.int64)], True)
    """)
    assert not failures, "\\n".join(failures)


def test_gather_nd_reverse_sequence_and_eye_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile GatherND's, ReverseSequence's and
    EyeLike's kernels for sm_90, for every element size and both index dtypes."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.shape import copies as C, generators as G
        for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
            for index in (np.int32, np.int64):
                check(f"gather_nd {dt} {index}", C.gather_nd_kernel,
                      [arr(dt), arr(dt), arr(index), I64, I64, I64, I64, I64, arr(np.int64), arr(np.int64)], True)
            check(f"reverse_sequence {dt}", C.reverse_sequence_kernel,
                  [arr(dt), arr(dt), arr(np.int64), I64, I64, I64, I64, I64], True)
            check(f"eye {dt}", G.eye_kernel, [arr(dt), I64, I64, I64, scalar(dt)], True)
    """)
    assert not failures, "\\n".join(failures)
