"""The ``channels_last`` pass: a ResNet-like net (stem conv that stays NCHW, BatchNorm
folded, residual blocks, a max pool and the global average pool head) runs its
convolutions channels-last with the layout changes between them cancelled, and the
engine matches onnxruntime in every precision and format combination."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt_builtin_ops.shape import channels_last


#: float32 layers run TF32 tensor cores on a Hopper GPU (the default, as in TensorRT).
FP32_TOL = 1e-4 if simulated() else 5e-3


def small_resnet(rng, batch=1, size=6, width=8):
    """stem 3x3 conv (3 channels, padded to 8 channels-last) -> ReLU -> MaxPool -> a basic block with a
    residual add -> a strided block with a 1x1 downsample -> GAP -> Flatten -> Gemm."""
    inits, nodes = {}, []

    def conv(name, x, cin, cout, k, stride, bn=True):
        inits[f"{name}.w"] = rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)
        out = f"{name}.c"
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [out], name=name, pads=[k // 2] * 4,
                                      strides=[stride, stride]))
        if not bn:
            return out
        for stat, value in (("g", rng.uniform(0.5, 1.5, cout)), ("b", rng.standard_normal(cout) * 0.1),
                            ("m", rng.standard_normal(cout) * 0.1), ("v", rng.uniform(0.5, 2.0, cout))):
            inits[f"{name}.{stat}"] = value
        nodes.append(helper.make_node("BatchNormalization", [out] + [f"{name}.{s}" for s in "gbmv"], [f"{name}.y"],
                                      name=f"{name}.bn", epsilon=1e-5))
        return f"{name}.y"

    def relu(x, name):
        nodes.append(helper.make_node("Relu", [x], [name], name=name))
        return name

    stem = relu(conv("stem", "x", 3, width, 3, 1), "stem.r")
    nodes.append(helper.make_node("MaxPool", [stem], ["pool"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                  strides=[1, 1]))
    a = relu(conv("b1.c1", "pool", width, width, 3, 1), "b1.r1")
    b = conv("b1.c2", a, width, width, 3, 1)
    nodes.append(helper.make_node("Add", [b, "pool"], ["b1.sum"], name="b1.add"))
    block1 = relu("b1.sum", "b1.out")
    c = relu(conv("b2.c1", block1, width, 2 * width, 3, 2), "b2.r1")
    d = conv("b2.c2", c, 2 * width, 2 * width, 1, 1)
    down = conv("b2.down", block1, width, 2 * width, 1, 2)
    nodes.append(helper.make_node("Add", [d, down], ["b2.sum"], name="b2.add"))
    block2 = relu("b2.sum", "b2.out")
    nodes.append(helper.make_node("GlobalAveragePool", [block2], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"))
    inits["fc.w"] = rng.standard_normal((5, 2 * width)) * 0.3
    inits["fc.b"] = rng.standard_normal(5)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["y"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "small_resnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), helper.make_tensor_value_info("b1.out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ops_after_passes(model, disabled=()):
    """The graph after the passes, epilogues and pointwise chains unfused (to count ops)."""
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, fusion=True, disabled=("fuse_epilogues", "fuse_pointwise", *disabled))
    return graph


def test_convolutions_run_channels_last_with_one_transpose_per_end(rng):
    graph = ops_after_passes(small_resnet(rng))
    text = " ".join(node.qualified_op for node in graph.nodes) + " "
    # every convolution is channels-last, the stem's 3 channels padded to 8 (its weight too)
    assert text.count("ConvNHWC") == 6 and text.count(" Pad ") == 1, text
    stem = next(n for n in graph.nodes if n.name == "stem")
    assert graph.info(stem.inputs[0]).shape == (1, 6, 6, 8) and graph.info(stem.inputs[1]).shape == (8, 3, 3, 8)
    assert "MaxPoolNHWC" in text and "GlobalAveragePoolNHWC" in text, text
    # one Transpose into NHWC (the input), one back for the b1.out graph output; the
    # head's is a Reshape
    transposes = [n for n in graph.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 2, text


def test_a_disabled_pass_keeps_every_layer_in_the_model_layout(rng):
    graph = ops_after_passes(small_resnet(rng), disabled=["channels_last"])
    assert not any("NHWC" in node.op_type or node.op_type == "Transpose" for node in graph.nodes)


def test_constants_of_pointwise_ops_are_permuted_with_them(rng, monkeypatch):
    """A per-channel Mul between two convolutions (no BatchNorm to fold it) moves with the layout."""
    monkeypatch.setattr(channels_last, "MIN_CONVS", 2)
    w1, w2 = (rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2 for _ in range(2))
    scale = rng.uniform(0.5, 1.5, (8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4, name="c1"),
             helper.make_node("Mul", ["a", "s"], ["m"], name="mul"),
             helper.make_node("Sigmoid", ["m"], ["g"], name="sig"),
             helper.make_node("Conv", ["g", "w2"], ["y"], pads=[1] * 4, name="c2")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("w2", w2), ("s", scale))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized = ops_after_passes(model)
    assert sum(n.op_type == "Transpose" for n in optimized.nodes) == 2  # one at each end
    x = rng.standard_normal((1, 8, 5, 4)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    engine = Builder().build_engine(model, BuilderConfig(progress=False))
    got = engine.create_execution_context().execute({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=FP32_TOL, atol=FP32_TOL * np.abs(want).max())


def test_a_grouped_conv_keeps_the_model_layout(rng):
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, group=2, name="c")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w")])
    optimized = ops_after_passes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in optimized.nodes] == ["Conv"]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("layout", ["channels_last", "linear"])
def test_every_precision_and_format_matches_onnxruntime(rng, fp16, layout):
    model = small_resnet(rng, batch=2)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    config = BuilderConfig(progress=False, fp16=fp16,
                           disabled_passes=("channels_last",) if layout == "linear" else ())
    engine = Builder().build_engine(model, config)
    got = engine.create_execution_context().execute({"x": x})
    tol = 2e-2 if fp16 else FP32_TOL
    for name, expected in zip(("y", "b1.out"), want):
        assert got[name].shape == expected.shape
        np.testing.assert_allclose(got[name], expected, rtol=tol, atol=tol * np.abs(expected).max())
    layers = engine.inspect()["layers"]
    formats = {layer["format"] for layer in layers if "Conv" in layer["op"]}
    assert formats == ({"channels_last"} if layout == "channels_last" else {"linear"})


def test_the_stem_may_run_as_an_explicit_im2col_and_gemm(rng, tmp_path, monkeypatch):
    """A stem's 3 channels, padded to 8, leave 5/8 of its K unused: it is offered as an
    explicit im2col (K packed to the 27 real taps, 32) and a GEMM. A tuner that finds it
    fastest keeps it; the FP16 engine matches onnxruntime, in memory and from its plan.
    (Unequal strides: equal ones would fold into channels first, leaving too little unused.)"""
    monkeypatch.setattr(channels_last, "MIN_CONVS", 1)
    w = (rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 0, 1, 1], strides=[2, 1], name="stem"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    def measure(run):
        run.enqueue(0)
        return 0.5 if run.tactic.name.startswith("im2col_") else 1.0

    engine = Builder(measure=measure).build_engine(model, BuilderConfig(progress=False, fp16=True))
    stem = next(layer for layer in engine.inspect()["layers"] if layer["name"].startswith("stem + "))
    assert stem["tactic"].startswith("im2col_") and stem["format"] == "channels_last", stem
    engine.save(str(tmp_path / "stem.plan"))
    for built in (engine, Engine.load(str(tmp_path / "stem.plan"))):
        got = built.create_execution_context().execute({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def mobile_dense_net(rng):
    """A MobileNet block (1x1, depthwise 3x3, 1x1) and a 3x3 branch concatenated on the
    channels (DenseNet, U-Net), then a 3x3 conv."""
    def weights(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["a"], name="expand"), n("Relu", ["a"], ["ar"], name="r1"),
             n("Conv", ["ar", "wd"], ["d"], group=16, pads=[1] * 4, name="depthwise"),
             n("Relu", ["d"], ["dr"], name="r2"), n("Conv", ["dr", "w2"], ["b"], name="project"),
             n("Conv", ["x", "w3"], ["e"], pads=[1] * 4, name="branch"),
             n("Concat", ["b", "e"], ["cat"], axis=1, name="concat"),
             n("Conv", ["cat", "w4"], ["y"], pads=[1] * 4, name="head")]
    inits = {"w1": weights(16, 8, 1, 1), "wd": weights(16, 1, 3, 3), "w2": weights(8, 16, 1, 1),
             "w3": weights(8, 8, 3, 3), "w4": weights(8, 16, 3, 3)}
    graph = helper.make_graph(nodes, "mobile_dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 5, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fp16", [False, True])
def test_depthwise_convs_and_channel_concats_stay_channels_last(rng, fp16):
    model = mobile_dense_net(rng)
    graph = ops_after_passes(model)
    ops = [node.op_type for node in graph.nodes]
    assert ops.count("ConvNHWC") == 5 and ops.count("Transpose") == 2, ops
    assert next(n for n in graph.nodes if n.op_type == "Concat").attrs["axis"] == 3
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    engine = Builder().build_engine(model, BuilderConfig(progress=False, fp16=fp16))
    got = engine.create_execution_context().execute({"x": x})["y"]
    tol = 2e-2 if fp16 else FP32_TOL
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def se_net(rng, batch="N"):
    """Four 3x3 convolutions with a squeeze-and-excitation gate between the last two
    (GlobalAveragePool -> 1x1 conv -> Sigmoid -> Mul, broadcast over the image), at a
    dynamic batch size."""
    def weights(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["a"], pads=[1] * 4, name="c1"), n("Relu", ["a"], ["ar"], name="r1"),
             n("Conv", ["ar", "w2"], ["b"], pads=[1] * 4, name="c2"), n("Relu", ["b"], ["br"], name="r2"),
             n("Conv", ["br", "w3"], ["c"], pads=[1] * 4, name="c3"),
             n("GlobalAveragePool", ["c"], ["g"], name="squeeze"), n("Conv", ["g", "ws"], ["s"], name="excite"),
             n("Sigmoid", ["s"], ["gate"], name="gate"), n("Mul", ["c", "gate"], ["m"], name="scale"),
             n("Conv", ["m", "w4"], ["y"], pads=[1] * 4, name="c4")]
    inits = {"w1": weights(8, 8, 3, 3), "w2": weights(8, 8, 3, 3), "w3": weights(8, 8, 3, 3),
             "ws": weights(8, 8, 1, 1), "w4": weights(8, 8, 3, 3)}
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_squeeze_excitation_gate_at_a_dynamic_batch_stays_channels_last(rng):
    model = se_net(rng)
    graph = ops_after_passes(model)
    ops = [node.op_type for node in graph.nodes]
    assert ops.count("ConvNHWC") == 5 and ops.count("Transpose") == 2, ops
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 8, 4, 5), (2, 8, 4, 5), (3, 8, 4, 5)))
    engine = Engine.deserialize(Builder().build_engine(model, config).serialize())  # through a plan
    session = onnxruntime.InferenceSession(model.SerializeToString())
    context = engine.create_execution_context()
    for batch in (3, 1):
        x = rng.standard_normal((batch, 8, 4, 5)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        got = context.execute({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=FP32_TOL, atol=FP32_TOL * np.abs(want).max())


def test_an_nhwc_export_loses_its_own_transposes_and_a_flatten_keeps_the_order(rng):
    """A tf2onnx-style model (NHWC input, its own Transpose to NCHW) of four convs, a max
    pool and a head flattening a 2x2 map (VGG: the flatten needs NCHW order): the model's
    Transpose cancels against the pass's, one Transpose stays before the Flatten."""
    def weights(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2], name="to_nchw")]
    prev = "xt"
    for i in range(4):
        nodes += [n("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1] * 4, name=f"conv{i}"),
                  n("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        prev = f"r{i}"
    nodes += [n("MaxPool", [prev], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
              n("Flatten", ["p"], ["f"], name="flatten"), n("Gemm", ["f", "fc"], ["y"], transB=1, name="fc")]
    inits = {f"w{i}": weights(8, 8, 3, 3) for i in range(4)}
    inits["fc"] = weights(5, 32)
    graph = helper.make_graph(nodes, "nhwc_export", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(a, k) for k, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized = ops_after_passes(model)
    ops = [node.op_type for node in optimized.nodes]
    assert ops.count("ConvNHWC") == 4 and ops.count("Transpose") == 1 and "MaxPoolNHWC" in ops, ops
    assert ops.index("Transpose") > ops.index("MaxPoolNHWC")  # the flatten's, not the input's
    x = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = Builder().build_engine(model, BuilderConfig(progress=False)).create_execution_context().execute({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=FP32_TOL, atol=FP32_TOL * np.abs(want).max())


def test_a_lone_conv_or_two_keep_the_model_layout(rng):
    """Too few convolutions to amortize the layout changes: the pass leaves the graph."""
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4, name="c1"),
             helper.make_node("Conv", ["a", "w"], ["y"], pads=[1] * 4, name="c2")]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w")])
    optimized = ops_after_passes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op_type for n in optimized.nodes] == ["Conv", "Conv"]


def test_off_hopper_nothing_changes(rng, monkeypatch):
    monkeypatch.setattr(channels_last, "hopper", lambda: False)
    graph = ops_after_passes(small_resnet(rng))
    assert not any(node.op_type == "ConvNHWC" for node in graph.nodes)


def strided_stem_net(rng, channels, size, kernel, stride, pads, batch=2):
    """A first conv (``kernel``/``stride`` over few channels), ReLU, then three 3x3 convs of 8."""
    inits = {"stem.w": rng.standard_normal((8, channels, kernel, kernel)) * 0.3, "stem.b": rng.standard_normal(8)}
    nodes = [helper.make_node("Conv", ["x", "stem.w", "stem.b"], ["s"], name="stem", kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=pads),
             helper.make_node("Relu", ["s"], ["r0"], name="stem.relu")]
    for i in range(1, 4):
        inits[f"c{i}.w"] = rng.standard_normal((8, 8, 3, 3)) * 0.2
        nodes.append(helper.make_node("Conv", [f"r{i - 1}", f"c{i}.w"], [f"r{i}"], name=f"c{i}", pads=[1] * 4))
    graph = helper.make_graph(nodes, "stem_net",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, *size])],
                              [helper.make_tensor_value_info("r3", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("channels, size, kernel, stride, pads, folded", [
    # ResNet's stem: pairs of pixels along W (3 channels padded to 4 first), stride 2 along
    # H, 7 x 4 taps over 8 channels: no copy makes the pairs (a Reshape)
    (3, (14, 14), 7, 2, [3, 3, 3, 3], ([7, 4], [2, 1], 8)),
    (3, (13, 11), 5, 2, [2, 1, 0, 2], ([5, 3], [2, 1], 8)),  # odd W (padded to whole pairs), uneven pads
    (1, (9, 12), 3, 3, [1, 1, 1, 1], ([3, 2], [3, 1], 8)),  # grayscale, stride 3: triples padded 3 -> 8
    # a patch embedding (ConvNeXt's, a ViT's): 4 x 4 blocks (a Transpose), a 1x1 over 48 channels
    (3, (12, 8), 4, 4, [0, 0, 0, 0], ([1, 1], [1, 1], 48)),
])
@pytest.mark.parametrize("fp16", [False, True])
def test_a_strided_stem_over_few_channels_runs_on_its_blocks(rng, channels, size, kernel, stride, pads, folded, fp16):
    """A first layer's stride folds into its channels (space to depth), along W alone or
    along both axes, whichever gives the shorter K (shorter than ``kernel x kernel`` over 8
    padded channels), and the engine matches onnxruntime."""
    model = strided_stem_net(rng, channels, size, kernel, stride, pads)
    graph = ops_after_passes(model)
    stem = next(n for n in graph.nodes if n.name == "stem")
    taps, strides, depth = folded
    assert stem.op_type == "ConvNHWC" and list(stem.attrs["kernel_shape"]) == taps, stem.attrs
    assert list(stem.attrs["strides"]) == strides
    assert graph.info(stem.inputs[1]).shape == (8, *taps, depth)
    assert taps[0] * taps[1] * depth < kernel * kernel * 8
    # a fold along W alone moves no data: no Transpose but the input's to channels-last
    transposes = sum(n.op_type == "Transpose" for n in graph.nodes)
    assert transposes == (2 if strides[1] == 1 and strides[0] > 1 else 3), graph.nodes
    x = rng.standard_normal((2, channels, *size)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    profile = OptimizationProfile().set_shape("x", (1, channels, *size), (2, channels, *size), (2, channels, *size))
    engine = Builder().build_engine(model, BuilderConfig(progress=False, fp16=fp16, profiles=[profile]))
    got = engine.create_execution_context().execute({"x": x})["r3"]
    tol = 2e-2 if fp16 else FP32_TOL
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("channels, kernel", [(3, 1), (8, 7)])
def test_blocks_only_where_they_shorten_k(rng, channels, kernel):
    """A strided 1x1 over 3 channels (its K would grow from 8 to 16) and a stem whose
    channels are whole keep their own kernel."""
    graph = ops_after_passes(strided_stem_net(rng, channels, (8, 8), kernel, 2, [kernel // 2] * 4))
    stem = next(n for n in graph.nodes if n.name == "stem")
    assert list(stem.attrs["kernel_shape"]) == [kernel, kernel] and list(stem.attrs["strides"]) == [2, 2]


def test_convolutions_reading_each_other_directly_all_run_channels_last(rng):
    """Conv -> Conv -> Conv -> Conv with nothing between them (no activation, a BatchNorm
    folded): each is converted, not only every other one (a converted Conv's output was left
    untyped for the next), and one Transpose stays at each end."""
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        inits.append(numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"y{i}"], pads=[1] * 4, name=f"c{i}"))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 6])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized = ops_after_passes(model)
    assert [n.op_type for n in optimized.nodes] == ["Transpose"] + ["ConvNHWC"] * 4 + ["Transpose"], optimized.nodes
    x = rng.standard_normal((1, 8, 5, 6)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = Builder().build_engine(model, BuilderConfig(progress=False)).create_execution_context().execute({"x": x})[prev]
    np.testing.assert_allclose(got, want, rtol=FP32_TOL, atol=FP32_TOL * np.abs(want).max())
