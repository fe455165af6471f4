"""INT8 builds channels-last: the ``channels_last`` pass converts an INT8 build's
convolutions too (channels padded to 16, whole int8 chunks), ``place_qdq`` quantizes the
ConvNHWC nodes as Conv, and ``fuse_qdq`` makes them ``plugrt.quant::ConvIntegerNHWC`` with
the rescale along the last axis, the DQ moved below the channels-last max pool and the
channel Pad. Each rewrite on a few nodes, numerically before and after; then a small CNN's
INT8 engine (four convolutions, a max pool, a residual add) against its own graph's
references and onnxruntime's FP32 run, with no standalone quantize kernel between layers.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig
from plugrt.engine.accuracy import relative_error
from plugrt.ir.graph import Int8Request
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.passes import eliminate_dead_code
from plugrt.registry import default_registry
from plugrt_builtin_ops.conv import nhwc_ops as conv_nhwc
from plugrt_builtin_ops.quant import fuse_qdq, quantizable

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # int32 wrapping in the simulator
#: As tests/test_int8.py: the engine against the FP32 model, and against its own graph.
INT8_TOLERANCE = 6e-2
KERNEL_TOLERANCE = 2e-2


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(conv_nhwc.DOMAIN, 1),
                                                   helper.make_opsetid("plugrt.pooling", 1)])


def _ops(graph) -> list[str]:
    return [node.op_type for node in graph.nodes]


def _dq_conv_nhwc(rng, pre=(), x_shape=(1, 5, 5, 16), x_zero=0):
    """``DQ(xq) [-> pre...] -> ConvNHWC(., DQ(wq per channel), B)``: the graph ``place_qdq``
    leaves. ``pre``: (op_type, domain, attrs, extra inputs) of nodes between the DQ and the conv."""
    m, c = 8, 16
    inits = [_init("xs", np.float32(0.05)), _init("xz", np.int8(x_zero)), _init("wq", rng.integers(-127, 128, (m, 3, 3, c)).astype(np.int8)),
             _init("ws", rng.uniform(0.01, 0.02, m).astype(np.float32)), _init("wz", np.zeros(m, np.int8)),
             _init("b", rng.standard_normal(m).astype(np.float32))]
    nodes = [helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["x"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0, name="dqw")]
    current = "x"
    for index, (op_type, domain, attrs, extra) in enumerate(pre):
        for name, value in extra:
            inits.append(_init(name, value))
        nodes.append(helper.make_node(op_type, [current, *(name for name, _ in extra)], [f"p{index}"], domain=domain,
                                      name=f"pre{index}", **attrs))
        current = f"p{index}"
    nodes.append(helper.make_node("ConvNHWC", [current, "w", "b"], ["y"], domain=conv_nhwc.DOMAIN, name="conv",
                                  pads=[1, 1, 1, 1]))
    model = _model(nodes, [helper.make_tensor_value_info("xq", TensorProto.INT8, list(x_shape))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    graph = import_model(model, registry=default_registry())
    return graph, {"xq": rng.integers(-128, 128, x_shape).astype(np.int8)}


def _rewritten(graph, feeds):
    """Run ``fuse_qdq``; return the outputs before and after."""
    registry = default_registry()
    before = ReferenceExecutor(graph, registry).run(feeds)["y"]
    assert fuse_qdq.run(graph, registry) > 0
    eliminate_dead_code.run(graph, registry)  # (as the pipeline does after the quantize passes)
    return before, ReferenceExecutor(graph, registry).run(feeds)["y"]


def test_fuse_qdq_makes_conv_nhwc_integer_with_the_rescale_along_the_last_axis(rng):
    graph, feeds = _dq_conv_nhwc(rng)
    before, after = _rewritten(graph, feeds)
    assert _ops(graph) == ["ConvIntegerNHWC", "Cast", "Mul", "Add"]
    assert graph.nodes[0].domain == "plugrt.quant" and graph.opsets["plugrt.quant"] == 1
    scale = graph.info(graph.nodes[2].inputs[1]).value
    assert scale.shape == (1, 1, 1, 8)
    assert graph.int8.decisions == {"conv": "int8"}
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_dq_moves_below_the_channels_last_max_pool_and_a_channel_pad(rng):
    pool = ("MaxPoolNHWC", "plugrt.pooling", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 0, 1, 1]}, [])
    pad = ("Pad", "", {}, [("pads", np.array([0, 0, 0, 0, 0, 0, 0, 6], np.int64))])
    graph, feeds = _dq_conv_nhwc(rng, pre=[pool, pad], x_shape=(1, 5, 5, 10))
    before, after = _rewritten(graph, feeds)
    assert _ops(graph) == ["MaxPoolNHWC", "Pad", "ConvIntegerNHWC", "Cast", "Mul", "Add"]
    assert graph.info(graph.nodes[1].outputs[0]).dtype == np.int8  # the pool and the pad run on int8
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_a_pad_of_zeros_keeps_a_dq_with_a_zero_point_above_it(rng):
    """Padding ``q`` with zeros is not padding ``DQ(q)`` with zeros when the zero point is
    not 0: the Pad stays in float (the conv is then no integer layer: its input is no DQ)."""
    pad = ("Pad", "", {}, [("pads", np.array([0, 0, 0, 0, 0, 0, 0, 6], np.int64))])
    graph, feeds = _dq_conv_nhwc(rng, pre=[pad], x_shape=(1, 5, 5, 10), x_zero=3)
    registry = default_registry()
    before = ReferenceExecutor(graph, registry).run(feeds)["y"]
    fuse_qdq.run(graph, registry)
    eliminate_dead_code.run(graph, registry)
    assert "ConvNHWC" in _ops(graph) and graph.info(graph.nodes[_ops(graph).index("Pad")].outputs[0]).dtype == np.float32
    np.testing.assert_allclose(ReferenceExecutor(graph, registry).run(feeds)["y"], before, rtol=1e-6)


def test_place_qdq_quantizes_conv_nhwc_as_conv(rng):
    registry = default_registry()
    w = rng.standard_normal((8, 3, 3, 16)).astype(np.float32)
    model = _model([helper.make_node("ConvNHWC", ["x", "w"], ["y"], domain=conv_nhwc.DOMAIN, name="conv")],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_init("w", w)])
    graph = import_model(model, registry=registry)
    graph.int8 = Int8Request(ranges={"x": 2.0})
    assert quantizable.run(graph, registry) == 1
    producers = graph.producers()
    conv = next(n for n in graph.nodes if n.op_type == "ConvNHWC")
    x_dq, w_dq = producers[conv.inputs[0]], producers[conv.inputs[1]]
    assert (x_dq.op_type, w_dq.op_type) == ("DequantizeLinear", "DequantizeLinear")
    assert w_dq.attrs["axis"] == 0 and graph.info(w_dq.inputs[1]).value.shape == (8,)
    fuse_qdq.run(graph, registry)
    eliminate_dead_code.run(graph, registry)
    assert _ops(graph) == ["QuantizeLinear", "ConvIntegerNHWC", "Cast", "Mul"]


def test_channels_last_form_pads_int8_builds_to_whole_chunks():
    from plugrt.ir.graph import Graph, Node
    from plugrt.plugin import TensorInfo

    graph = Graph()
    graph.add_input("x", TensorInfo(np.float32, (1, 24, 4, 4)))
    graph.add_const("w", np.ones((8, 24, 3, 3), np.float32))
    node = graph.add_node(Node("conv", "Conv", "", ("x", "w"), ("y",), {"group": 1}, opset=17))
    assert conv_nhwc.channels_last_form(node, graph)["pad_channels"] == 0
    form = conv_nhwc.channels_last_form(node, graph, conv_nhwc.INT8_CHANNEL_MULTIPLE)
    assert form["pad_channels"] == 8 and form["weight"].shape == (8, 3, 3, 32)


# ----------------------------------------------------------------------------- an INT8 engine


def small_cnn(seed: int = 23, stem_stride: int = 1):
    """Conv-BN-Relu (3 -> 16, stride ``stem_stride``), MaxPool, a residual block (3x3 then
    1x1, Add), a strided 3x3 to 32 channels, global pooling and a Gemm: four convolutions
    channels-last."""
    rng = np.random.default_rng(seed)

    def weights(*shape, scale=None):
        fan_in = np.prod(shape[1:]) if len(shape) > 1 else 1
        return (rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))).astype(np.float32)

    init = {"w1": weights(16, 3, 3, 3), "b1": weights(16, scale=0.1), "gamma": 1 + weights(16, scale=0.1),
            "beta": weights(16, scale=0.1), "mean": weights(16, scale=0.1),
            "var": (0.5 + rng.random(16)).astype(np.float32), "w2": weights(16, 16, 3, 3), "w3": weights(16, 16, 1, 1),
            "w4": weights(32, 16, 3, 3), "b4": weights(32, scale=0.1), "fc": weights(10, 32), "fcb": weights(10, scale=0.1)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[stem_stride] * 2, name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "p1"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv4"),
        helper.make_node("Relu", ["c4"], ["r4"], name="relu4"),
        helper.make_node("GlobalAveragePool", ["r4"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(a, n) for n, a in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("stem_stride", [1, 2])  # 2: the stem runs on 2x2 blocks, 12 of 16 channels
def test_int8_cnn_runs_conv_integer_nhwc_without_quantize_kernels_between_layers(stem_stride):
    model = small_cnn(stem_stride=stem_stride)
    rng = np.random.default_rng(24)
    batches = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    # (No build-time accuracy check: one more engine run in the simulator; the test measures it.)
    pinned = {name: "int8" for name in ("conv1", "conv2", "conv3", "conv4", "fc")}  # (not a GPU's timing of tiny layers)
    engine = Builder().build_engine(model, BuilderConfig(int8=True, progress=False, calibration_data=batches,
                                                         accuracy_check=False, layer_precisions=pinned))
    decisions = engine.precision["decisions"]
    assert {name for name, d in decisions.items() if d == "int8"} >= {"conv1", "conv2", "conv3", "conv4", "fc"}
    layers = engine.inspect()["layers"]
    ops = [layer["op"] for layer in layers]
    assert sum(op.startswith("ConvIntegerNHWC+") for op in ops) == 4, ops
    assert not any(op.startswith("ConvInteger+") for op in ops), ops
    # What an integer layer stores is INT8 already (or read by its reader's epilogue): the
    # quantize kernels left are the input's and the global pool's.
    made_by = {name: layer["op"] for layer in layers for name in layer["outputs"]}
    for layer in layers:
        if layer["op"] in ("QuantizeLinear", "DequantizeLinear"):
            assert not any("Integer" in made_by.get(name, "") for name in layer["inputs"]), layers
    assert sum(op == "QuantizeLinear" for op in ops) <= 2, ops
    weights = {tuple(v.info.shape) for v in engine.graph.values.values() if v.info is not None and v.info.value is not None}
    assert ((16, 2, 2, 16) if stem_stride == 2 else (16, 3, 3, 16)) in weights, weights
    pool = next(node for node in engine.graph.nodes if node.op_type == "MaxPoolNHWC")
    assert engine.graph.info(pool.inputs[0]).dtype == np.int8  # the pool moves INT8 data
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    with engine.create_execution_context() as context:
        got = context.execute(feeds)["y"]
    quantized = ReferenceExecutor(engine.graph, default_registry()).run(feeds)["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    assert relative_error(got, quantized) < KERNEL_TOLERANCE
    assert 0 < relative_error(got, expected) < INT8_TOLERANCE
