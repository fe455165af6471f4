"""Whole-pipeline fusion on model fragments shaped like the real ones: a ResNet basic
block with a downsample branch (BatchNorm folded, ReLU and the residual add in the conv
epilogues) and a BERT MLP written the way the TorchScript exporter writes it at opset 14
(LayerNorm and GELU as primitive ops), built into engines and compared with onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig


def _model(nodes, inputs, outputs, inits, opset):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def resnet_block(rng, cin=4, cout=6):
    inits, nodes = {}, []

    def conv_bn(name, x, cin, cout, k, stride):
        inits[f"{name}.w"] = rng.standard_normal((cout, cin, k, k)) * 0.3
        for stat, value in (("g", rng.uniform(0.5, 1.5, cout)), ("b", rng.standard_normal(cout)),
                            ("m", rng.standard_normal(cout) * 0.1), ("v", rng.uniform(0.5, 2.0, cout))):
            inits[f"{name}.{stat}"] = value
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.c"], name=f"{name}", pads=[k // 2] * 4,
                                      strides=[stride, stride]))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c"] + [f"{name}.{s}" for s in "gbmv"],
                                      [f"{name}.y"], name=f"{name}.bn", epsilon=1e-5))
        return f"{name}.y"

    a = conv_bn("conv1", "x", cin, cout, 3, 2)
    nodes.append(helper.make_node("Relu", [a], ["r1"], name="relu1"))
    b = conv_bn("conv2", "r1", cout, cout, 3, 1)
    d = conv_bn("down", "x", cin, cout, 1, 2)
    nodes.append(helper.make_node("Add", [b, d], ["sum"], name="add"))
    nodes.append(helper.make_node("Relu", ["sum"], ["y"], name="relu2"))
    return _model(nodes, [("x", [2, cin, 6, 6])], ["y"], inits, 17)


def bert_mlp(rng, hidden=8, inner=16):
    """x -> LayerNorm (primitives) -> MatMul+bias -> GELU (Erf form) -> MatMul+bias -> +x."""
    c = lambda value: np.array(value, np.float32)  # noqa: E731
    inits = {"two": c(2.0), "eps": c(1e-5), "gamma": rng.uniform(0.5, 1.5, hidden), "beta": rng.standard_normal(hidden),
             "w1": rng.standard_normal((hidden, inner)) * 0.3, "b1": rng.standard_normal(inner),
             "root2": c(math.sqrt(2.0)), "one": c(1.0), "half": c(0.5),
             "w2": rng.standard_normal((inner, hidden)) * 0.3, "b2": rng.standard_normal(hidden)}
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x"], ["mu"], axes=[-1], name="ln/mean"), n("Sub", ["x", "mu"], ["d"], name="ln/sub"),
        n("Pow", ["d", "two"], ["sq"], name="ln/pow"), n("ReduceMean", ["sq"], ["var"], axes=[-1], name="ln/var"),
        n("Add", ["var", "eps"], ["ve"], name="ln/add"), n("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
        n("Div", ["d", "sd"], ["nrm"], name="ln/div"), n("Mul", ["nrm", "gamma"], ["sc"], name="ln/mul"),
        n("Add", ["sc", "beta"], ["ln"], name="ln/add2"),
        n("MatMul", ["ln", "w1"], ["h0"], name="fc1"), n("Add", ["h0", "b1"], ["h"], name="fc1/bias"),
        n("Div", ["h", "root2"], ["hd"], name="gelu/div"), n("Erf", ["hd"], ["he"], name="gelu/erf"),
        n("Add", ["he", "one"], ["h1"], name="gelu/add"), n("Mul", ["h", "h1"], ["hm"], name="gelu/mul"),
        n("Mul", ["hm", "half"], ["g"], name="gelu/half"),
        n("MatMul", ["g", "w2"], ["o0"], name="fc2"), n("Add", ["o0", "b2"], ["o"], name="fc2/bias"),
        n("Add", ["o", "x"], ["y"], name="residual"),
    ]
    return _model(nodes, [("x", [2, 3, hidden])], ["y"], inits, 14)


def _check(onnx_model, rng, feeds_shape):
    x = rng.standard_normal(feeds_shape).astype(np.float32)
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    engines = {fusion: Builder().build_engine(onnx_model, BuilderConfig(fusion=fusion)) for fusion in (True, False)}
    for engine in engines.values():
        got = engine.create_execution_context().execute({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return {fusion: engine.inspect()["layers"] for fusion, engine in engines.items()}


def test_resnet_block_is_one_layer_per_conv(rng):
    layers = _check(resnet_block(rng), rng, (2, 4, 6, 6))
    assert sorted(layer["op"] for layer in layers[True]) == ["Conv", "Conv+Add+Relu", "Conv+Relu"]
    assert len(layers[False]) == 9
    covered = {name for layer in layers[True] for name in layer["onnx_nodes"]}
    assert {"conv1.bn", "relu1", "add", "relu2", "down.bn"} <= covered


def test_bert_mlp_fuses_layernorm_gelu_and_bias_epilogues(rng):
    layers = _check(bert_mlp(rng), rng, (2, 3, 8))
    assert [layer["op"] for layer in layers[True]] == ["LayerNormalization", "MatMul+Add+Gelu", "MatMul+Add+Add"]
    assert len(layers[False]) == 19
