"""Conv and ConvTranspose references against onnxruntime, over the attribute space."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import plugrt
from plugrt.onnx.backend import prepare

_ONNX_TYPES = {np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float32): TensorProto.FLOAT,
               np.dtype(np.float64): TensorProto.DOUBLE}


def _model(op, feeds, attrs, opset=17, shapes=None):
    shapes = shapes or {}
    names = list(feeds)
    dtype = _ONNX_TYPES[feeds["x"].dtype]
    inputs = [helper.make_tensor_value_info(n, dtype, shapes.get(n, feeds[n].shape)) for n in names]
    node = helper.make_node(op, names, ["y"], name=f"my_{op.lower()}", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(rng, op, x_shape, w_shape, group=1, bias=False, dtype=np.float32):
    feeds = {
        "x": rng.standard_normal(x_shape).astype(dtype),
        "w": rng.standard_normal(w_shape).astype(dtype),
    }
    if bias:
        out_channels = w_shape[0] if op == "Conv" else w_shape[1] * group
        feeds["b"] = rng.standard_normal(out_channels).astype(dtype)
    return feeds


def _compare(rng, op, x_shape, w_shape, bias=False, opset=17, rtol=1e-5, atol=1e-5, **attrs):
    feeds = _feeds(rng, op, x_shape, w_shape, attrs.get("group", 1), bias)
    model = _model(op, feeds, attrs, opset)
    expected = _ort(model, feeds)
    got = prepare(model, "CPU").run(feeds)[0]
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    return got


# ----------------------------------------------------------------------------- Conv


@pytest.mark.parametrize(
    "x_shape, w_shape, group",
    [
        ((1, 4, 9, 7), (6, 4, 3, 3), 1),
        ((2, 6, 7, 5), (9, 2, 3, 2), 3),  # grouped
        ((1, 8, 11, 9), (8, 1, 3, 3), 8),  # depthwise
        ((1, 4, 6, 7), (8, 1, 5, 3), 4),  # depthwise, channel multiplier 2
    ],
)
def test_conv_groups(rng, x_shape, w_shape, group):
    _compare(rng, "Conv", x_shape, w_shape, bias=True, group=group, pads=[1, 1, 1, 1])


@pytest.mark.parametrize(
    "strides, dilations, pads",
    [
        ([2, 3], [1, 1], [0, 1, 2, 0]),
        ([1, 1], [2, 3], [3, 0, 1, 2]),
        ([3, 2], [2, 2], [1, 2, 0, 3]),
        ([2, 2], [1, 2], [0, 0, 0, 0]),
    ],
)
def test_conv_stride_dilation_asymmetric_pads(rng, strides, dilations, pads):
    _compare(rng, "Conv", (2, 3, 13, 11), (5, 3, 3, 2), bias=True, strides=strides, dilations=dilations, pads=pads)


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(
    "x_shape, w_shape, strides",
    [
        ((1, 3, 10), (4, 3, 4), [3]),  # 1-D, even kernel
        ((1, 2, 8, 9), (3, 2, 2, 3), [2, 2]),
        ((1, 2, 5, 6, 7), (4, 2, 3, 2, 3), [2, 1, 3]),  # 3-D
    ],
)
def test_conv_auto_pad(rng, auto_pad, x_shape, w_shape, strides):
    got = _compare(rng, "Conv", x_shape, w_shape, auto_pad=auto_pad, strides=strides)
    if auto_pad.startswith("SAME"):
        assert got.shape[2:] == tuple(-(-n // s) for n, s in zip(x_shape[2:], strides))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_with_dilation(rng, auto_pad):
    """onnxruntime refuses SAME with dilation; compare with the spec's explicit pads."""
    x_shape, w_shape, strides, dilations = (1, 2, 9, 8), (3, 2, 3, 2), [2, 1], [2, 3]
    feeds = _feeds(rng, "Conv", x_shape, w_shape)
    begins, ends = [], []
    for n, k, s, d in zip(x_shape[2:], w_shape[2:], strides, dilations):
        total = max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    explicit = _model("Conv", feeds, dict(strides=strides, dilations=dilations, pads=begins + ends))
    model = _model("Conv", feeds, dict(strides=strides, dilations=dilations, auto_pad=auto_pad))
    got = prepare(model, "CPU").run(feeds)[0]
    np.testing.assert_allclose(got, _ort(explicit, feeds), rtol=1e-5, atol=1e-5)


def test_conv_1d_and_3d_grouped(rng):
    _compare(rng, "Conv", (2, 4, 17), (6, 2, 5), bias=True, group=2, strides=[2], dilations=[3], pads=[4, 1])
    _compare(rng, "Conv", (1, 6, 7, 6, 5), (6, 1, 3, 3, 2), bias=True, group=6, strides=[2, 1, 2],
             dilations=[1, 2, 1], pads=[1, 0, 1, 0, 2, 0])


def test_conv_1x1_kernel_shape_attribute_and_opsets(rng):
    _compare(rng, "Conv", (1, 5, 7, 3), (4, 5, 1, 1), kernel_shape=[1, 1], strides=[2, 2])
    _compare(rng, "Conv", (1, 3, 6, 5), (2, 3, 3, 3), bias=True, opset=11, pads=[1, 1, 1, 1])
    _compare(rng, "Conv", (1, 3, 6, 5), (2, 3, 3, 3), bias=True, opset=22, auto_pad="SAME_LOWER")


def test_conv_resnet_stem(rng):
    _compare(rng, "Conv", (1, 3, 64, 64), (16, 3, 7, 7), bias=True, strides=[2, 2], pads=[3, 3, 3, 3], rtol=1e-4)


# ----------------------------------------------------------------------------- ConvTranspose


@pytest.mark.parametrize(
    "attrs",
    [
        dict(strides=[2, 3], output_padding=[1, 2]),
        dict(strides=[2, 2], pads=[1, 0, 2, 1], dilations=[1, 2]),
        dict(strides=[3, 2], output_padding=[2, 1], pads=[0, 2, 1, 0], dilations=[2, 1]),
        dict(strides=[2, 2], output_shape=[10, 13]),  # asymmetric padding split
        dict(strides=[2, 3], output_shape=[12, 16]),  # larger than natural: extends with zeros
        dict(strides=[2, 2], output_shape=[9, 11], output_padding=[1, 1]),
        dict(strides=[2, 3], auto_pad="SAME_UPPER"),
        dict(strides=[2, 3], auto_pad="SAME_LOWER"),
        dict(strides=[2, 3], auto_pad="SAME_UPPER", output_shape=[9, 14]),
        dict(strides=[2, 3], auto_pad="SAME_LOWER", output_shape=[9, 14]),
        dict(strides=[2, 1], auto_pad="VALID", output_padding=[1, 0]),
    ],
)
@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_2d(rng, attrs, group):
    _compare(rng, "ConvTranspose", (2, 4, 5, 6), (4, 3, 3, 4), bias=True, group=group, **attrs)


def test_conv_transpose_depthwise_1d_3d(rng):
    _compare(rng, "ConvTranspose", (1, 6, 7, 5), (6, 1, 3, 3), bias=True, group=6, strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 0])
    _compare(rng, "ConvTranspose", (2, 3, 9), (3, 2, 4), bias=True, strides=[3], dilations=[2], pads=[2, 1],
             output_padding=[1])
    _compare(rng, "ConvTranspose", (1, 4, 3, 4, 5), (4, 2, 2, 3, 3), bias=True, group=2, strides=[2, 1, 2],
             output_shape=[7, 6, 10])
    _compare(rng, "ConvTranspose", (1, 2, 3, 4, 3), (2, 3, 3, 2, 3), strides=[1, 2, 2], auto_pad="SAME_UPPER")


def test_conv_transpose_opsets(rng):
    _compare(rng, "ConvTranspose", (1, 2, 4, 3), (2, 3, 3, 3), bias=True, opset=11, strides=[2, 2])
    _compare(rng, "ConvTranspose", (1, 2, 4, 3), (2, 3, 3, 3), bias=True, opset=22, strides=[2, 2], pads=[1, 0, 0, 1])


# ----------------------------------------------------------------------------- dtypes, symbolic dims


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_float16_and_float64(rng, op):
    w_shape = (4, 2, 3, 3)
    feeds = _feeds(rng, op, (1, 4, 7, 6), w_shape, group=2, bias=True)
    attrs = dict(group=2, strides=[2, 1], pads=[1, 0, 0, 1])
    expected = _ort(_model(op, feeds, attrs), feeds)
    half = {k: v.astype(np.float16) for k, v in feeds.items()}
    got = prepare(_model(op, half, attrs), "CPU").run(half)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=1e-2, atol=2e-2)
    wide = {k: v.astype(np.float64) for k, v in feeds.items()}
    got = prepare(_model(op, wide, attrs), "CPU").run(wide)[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("Conv", dict(strides=[2, 3], pads=[1, 0, 2, 1], dilations=[1, 2])),
        ("Conv", dict(strides=[2, 2], auto_pad="SAME_LOWER")),
        ("Conv", dict(strides=[3, 1], auto_pad="VALID")),
        ("ConvTranspose", dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2])),
        ("ConvTranspose", dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ],
)
def test_symbolic_batch_and_spatial_dims(rng, op, attrs):
    w_shape = (4, 4, 3, 3)
    feeds = _feeds(rng, op, (1, 4, 5, 5), w_shape, bias=True)
    model = _model(op, feeds, attrs, shapes={"x": ("N", 4, "H", "W")})
    rep = prepare(model, "CPU")
    info = rep.graph.values["y"].info
    assert info.shape[0] == "N" and info.shape[1] == 4
    assert all(isinstance(d, str) for d in info.shape[2:])
    for shape in [(1, 4, 7, 9), (3, 4, 10, 6)]:
        feeds["x"] = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(rep.run(feeds)[0], _ort(model, feeds), rtol=1e-5, atol=1e-5)


def test_infer_symbolic_names_distinguish_parameters():
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo
    from plugrt_builtin_ops.conv.ops import Conv

    def out_shape(**attrs):
        full = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None)
        full.update(attrs)
        node = Node("c", "Conv", "", ("x", "w"), ("y",), full, 17)
        x, w = TensorInfo(np.float32, ("N", 3, "H", 8)), TensorInfo(np.float32, (5, 3, 3, 3))
        return Conv().infer(node, [x, w])[0].shape

    a, b = out_shape(strides=[1, 1]), out_shape(strides=[2, 2])
    assert a[:2] == ("N", 5) and a[3] == 6 and b[3] == 3
    assert a[2] != b[2]


# ----------------------------------------------------------------------------- refusals


def test_kernel_shape_mismatch_is_declared_unsupported(rng):
    feeds = _feeds(rng, "Conv", (1, 2, 6, 6), (3, 2, 3, 3))
    model = _model("Conv", feeds, dict(kernel_shape=[2, 2]))
    with pytest.raises(plugrt.UnsupportedError, match="my_conv.*kernel_shape"):
        prepare(model, "CPU")


def test_unknown_auto_pad_is_declared_unsupported(rng):
    feeds = _feeds(rng, "ConvTranspose", (1, 2, 6, 6), (2, 3, 3, 3))
    model = _model("ConvTranspose", feeds, dict(auto_pad="SAME"))
    with pytest.raises(plugrt.UnsupportedError, match="my_convtranspose.*auto_pad"):
        prepare(model, "CPU")


def test_integer_input_is_refused(rng):
    feeds = {"x": rng.integers(1, 5, (1, 2, 4, 4)).astype(np.int32), "w": rng.integers(1, 5, (1, 2, 3, 3)).astype(np.int32)}
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, v.shape) for n, v in feeds.items()]
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="int_conv")
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(plugrt.UnsupportedError, match="int_conv"):
        prepare(model, "CPU")


def test_channel_mismatch_is_a_shape_error(rng):
    feeds = _feeds(rng, "Conv", (1, 4, 6, 6), (3, 3, 3, 3))
    with pytest.raises(plugrt.ShapeError, match="my_conv"):
        prepare(_model("Conv", feeds, {}), "CPU")
