"""FP16 engines (plugrt.engine.precision): the builder's precision choice, per-layer
constraints, strongly typed builds, the FP16 range check and the accuracy report.

Every engine is compared with onnxruntime running the FP32 model on fresh random inputs
(relative error: max |engine - onnxruntime| / max |onnxruntime|); FP16 engines within
FP16's tolerance. In the simulator nothing is timed, so FP16 is chosen wherever allowed.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from plugrt.cli import main
from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.engine.accuracy import relative_error
from plugrt.engine.precision import float_slots
from plugrt.errors import PlanError, PlugrtError
from plugrt.registry import Registry, default_registry
from test_tuner import DOMAIN, Twice, _variant

#: An FP16 engine's relative error against the FP32 model (the issue's figure).
FP16_TOLERANCE = 1e-2
#: FP32 layers on a Hopper GPU run TF32 tensor cores (the default, as in TensorRT).
FP32_TOLERANCE = 1e-4 if simulated() else 5e-3


def _weights(rng, *shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))).astype(np.float32)


def conv_net(seed: int = 0):
    """Conv-BN-Relu, MaxPool, a residual Conv block, global pooling and a Gemm: ResNet's
    shape in miniature."""
    rng = np.random.default_rng(seed)
    init = {"w1": _weights(rng, 8, 3, 3, 3), "b1": _weights(rng, 8, scale=0.1),
            "gamma": (1 + 0.1 * rng.standard_normal(8)).astype(np.float32), "beta": _weights(rng, 8, scale=0.1),
            "mean": _weights(rng, 8, scale=0.1), "var": (0.5 + rng.random(8)).astype(np.float32),
            "w2": _weights(rng, 8, 8, 3, 3), "w3": _weights(rng, 8, 8, 1, 1), "fc": _weights(rng, 10, 8),
            "fcb": _weights(rng, 10, scale=0.1)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "p1"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(a, n) for n, a in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def encoder_layer(seed: int = 1, dtype=TensorProto.FLOAT):
    """One transformer encoder layer (one head, hidden 8, seq 4): attention, residual,
    LayerNorm, a Gelu MLP, residual, LayerNorm."""
    rng = np.random.default_rng(seed)
    d, f = 8, 16
    np_dtype = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    init = {"wq": _weights(rng, d, d), "wk": _weights(rng, d, d), "wv": _weights(rng, d, d),
            "scale": np.array(1 / np.sqrt(d), np.float32), "g1": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            "b1": _weights(rng, d, scale=0.1), "w1": _weights(rng, d, f), "bias1": _weights(rng, f, scale=0.1),
            "w2": _weights(rng, f, d), "g2": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            "b2": _weights(rng, d, scale=0.1)}
    init = {name: array.astype(np_dtype) for name, array in init.items()}
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["qk"], name="qk"),
        helper.make_node("Mul", ["qk", "scale"], ["scores"], name="scaled"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "v"], ["att"], name="att"),
        helper.make_node("Add", ["att", "x"], ["res1"], name="res1"),
        helper.make_node("LayerNormalization", ["res1", "g1", "b1"], ["ln1"], axis=-1, name="ln1"),
        helper.make_node("MatMul", ["ln1", "w1"], ["h"], name="ffn1"),
        helper.make_node("Add", ["h", "bias1"], ["hb"], name="ffn1_bias"),
        helper.make_node("Gelu", ["hb"], ["act"], name="gelu"),
        helper.make_node("MatMul", ["act", "w2"], ["o"], name="ffn2"),
        helper.make_node("Add", ["o", "ln1"], ["res2"], name="res2"),
        helper.make_node("LayerNormalization", ["res2", "g2", "b2"], ["y"], axis=-1, name="ln2"),
    ]
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", dtype, [1, 4, d])],
                              [helper.make_tensor_value_info("y", dtype, [1, 4, d])],
                              [numpy_helper.from_array(a, n) for n, a in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


MODELS = {"conv net": conv_net, "encoder layer": encoder_layer}


def build(model, registry=None, measure=None, **config) -> Engine:
    config.setdefault("optimization_level", 0)
    config.setdefault("progress", False)
    return Builder(registry, measure=measure).build_engine(model, BuilderConfig(**config))


def compare(engine: Engine, model, seed: int = 7) -> float:
    """The engine's relative error against onnxruntime on fresh random inputs."""
    rng = np.random.default_rng(seed)
    info = model.graph.input[0]
    shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
    dtype = np.float16 if info.type.tensor_type.elem_type == TensorProto.FLOAT16 else np.float32
    x = rng.standard_normal(shape).astype(dtype)
    got = engine.create_execution_context().execute({"x": x})["y"]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    return relative_error(got, expected)


def layers(engine: Engine) -> dict[str, str]:
    return {layer["name"]: layer["precision"] for layer in engine.inspect()["layers"]}


# ---------------------------------------------------------------------- precision combinations


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("combination", ["fp32", "fp16", "fp16 with an fp32 layer"])
def test_every_precision_combination_matches_onnxruntime(name, combination):
    model = MODELS[name]()
    config = {}
    pinned = "conv2" if name == "conv net" else "ffn1"
    if combination != "fp32":
        config["fp16"] = True
    if combination == "fp16 with an fp32 layer":
        config["layer_precisions"] = {pinned: "fp32"}
    engine = build(model, **config)
    error = compare(engine, model)
    precisions = layers(engine)
    compute = {p for p in precisions.values() if p != "reformat"}
    if combination == "fp32":
        assert error <= FP32_TOLERANCE and compute == {"fp32"} and engine.precision is None
        return
    assert error <= FP16_TOLERANCE, error
    assert "fp16" in compute
    accuracy = engine.precision["accuracy"]
    assert 0 <= accuracy["max"] <= FP16_TOLERANCE and set(accuracy["outputs"]) == {"y"}
    holding = [layer for layer in engine.inspect()["layers"] if pinned in layer["onnx_nodes"]]
    assert len(holding) == 1
    if combination == "fp16":
        assert compute == {"fp16"}, precisions
        assert holding[0]["precision"] == "fp16"
    else:
        assert holding[0]["precision"] == "fp32" and compute == {"fp16", "fp32"}, precisions
        assert engine.precision["decisions"][pinned] == "fp32"
    for layer in engine.inspect()["layers"]:  # channels-last convolutions, on Hopper and in the simulator
        assert layer["format"] == ("channels_last" if "NHWC" in layer["op"] else "linear"), layer


@pytest.mark.parametrize("fp16", [True, False])
def test_fp16_io_makes_float32_bindings_fp16(rng, fp16):
    """--fp16-io: the engine takes and gives float16 arrays (TensorRT's fp16 I/O formats);
    with FP16 layers there is no conversion at either end."""
    model = conv_net()
    engine = build(model, fp16=fp16, fp16_io=True)
    assert engine.graph.info("x").dtype == np.float16 and engine.graph.info("y").dtype == np.float16
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float16)
    got = engine.create_execution_context().execute({"x": x})["y"]
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x.astype(np.float32)})[0]
    assert got.dtype == np.float16 and relative_error(got, expected) <= FP16_TOLERANCE
    conversions = [layer for layer in engine.inspect()["layers"] if layer["precision"] == "reformat"]
    if fp16:
        assert not conversions and engine.precision["fp16_io"] is True
    else:  # FP32 layers: in and out through conversions
        assert len(conversions) == 2
    assert engine.precision["accuracy"]["max"] <= FP16_TOLERANCE


def test_an_fp16_engine_stores_its_weights_in_fp16_and_keeps_its_bindings():
    model = conv_net()
    engine = build(model, fp16=True)
    weights = engine.graph.initializers()
    assert weights and {a.dtype for a in weights.values() if a.size > 1 and a.dtype.kind == "f"} == {np.dtype(np.float16)}
    fp32 = build(model)
    assert engine.weight_bytes < 0.6 * fp32.weight_bytes
    assert engine.graph.info("x").dtype == np.float32 and engine.graph.info("y").dtype == np.float32
    assert engine.precision["casts"] >= 2  # the input in, the output out


def test_a_weight_shared_by_fp16_and_fp32_layers_is_kept_in_both():
    rng = np.random.default_rng(2)
    w = _weights(rng, 6, 6)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["a"], name="first"),
                               helper.make_node("MatMul", ["a", "w"], ["y"], name="second")], "shared",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    engine = build(model, fp16=True, layer_precisions={"second": "fp32"})
    assert sorted(a.dtype.name for a in engine.graph.initializers().values()) == ["float16", "float32"]
    assert compare(engine, model) <= FP16_TOLERANCE


# ---------------------------------------------------------------------- constraints


def fp32_only_registry():
    """The built-ins plus ``Twice`` (y = 2x) whose plugin runs float32 only."""

    class Fp32Twice(Twice):
        dtypes = frozenset({np.dtype(np.float32)})

    class Holder:
        from plugrt import hookimpl

        @hookimpl
        def plugrt_ops(self):
            return [Fp32Twice([_variant("only", 1.0)])]

    base, registry = default_registry(), Registry()
    for record in base.plugins.values():
        if record.name not in registry.plugins:  # the core's own come with every registry
            registry.register(base.pm.get_plugin(record.name), name=record.name, distribution=record.distribution,
                              version=record.version)
    registry.register(Holder(), name="fp32-twice", distribution="plugrt-fp32-twice", version="1.0")
    registry.finish()
    return registry


def twice_model():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Twice", ["r"], ["t"], domain=DOMAIN, name="twice"),
                               helper.make_node("Sigmoid", ["t"], ["y"], name="sigmoid")], "twice",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def test_a_layer_without_fp16_runs_fp32_between_fp16_layers():
    registry = fp32_only_registry()
    engine = build(twice_model(), registry, fp16=True, fusion=False)
    assert engine.precision["decisions"]["twice"] == "fp32"
    assert engine.precision["decisions"]["relu"] == "fp16" and engine.precision["decisions"]["sigmoid"] == "fp16"
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    y = engine.create_execution_context().execute({"x": x})["y"]
    assert relative_error(y, 1 / (1 + np.exp(-2 * np.maximum(x, 0)))) <= FP16_TOLERANCE


def test_a_constraint_the_plugin_cannot_meet(caplog):
    registry = fp32_only_registry()
    with pytest.raises(PlugrtError, match=r"node 'twice'.*constrained to fp16 \(--precision-constraints obey\)"):
        build(twice_model(), registry, fp16=True, layer_precisions={"twice": "fp16"}, precision_constraints="obey")
    with caplog.at_level(logging.WARNING, logger="plugrt.builder"):
        engine = build(twice_model(), registry, fp16=True, layer_precisions={"twice": "fp16"})
    assert "constrained to fp16 (prefer)" in caplog.text
    assert engine.precision["fallbacks"][0]["layer"] == "twice"


def test_constraints_apply_without_fp16_and_none_ignores_them(caplog):
    model = conv_net()
    engine = build(model, layer_precisions={"conv2": "fp16"}, precision_constraints="obey")
    assert engine.precision["decisions"]["conv2"] == "fp16"
    assert {p for n, p in engine.precision["decisions"].items() if n != "conv2" and p != "reformat"} == {"fp32"}
    assert compare(engine, model) <= FP16_TOLERANCE
    with caplog.at_level(logging.WARNING, logger="plugrt.builder"):
        engine = build(model, layer_precisions={"conv2": "fp16"}, precision_constraints="none")
    assert engine.precision is None and "ignored" in caplog.text


@pytest.mark.parametrize("config, message", [
    ({"layer_precisions": {"conv9": "fp32"}}, "no node named 'conv9'; did you mean 'conv"),
    ({"layer_precisions": {"conv1": "int4"}}, "the precisions are fp32, fp16, int8"),
    ({"fp16": True, "strongly_typed": True}, "--fp16 with --strongly-typed"),
    ({"fp16_io": True, "strongly_typed": True}, "--fp16-io with --strongly-typed"),
    ({"layer_precisions": {"conv1": "fp32"}, "strongly_typed": True}, "--layer-precision with --strongly-typed"),
    ({"precision_constraints": "always"}, "use one of prefer, obey, none"),
])
def test_bad_precision_settings_are_refused(config, message):
    with pytest.raises(PlugrtError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(conv_net(), **config)


# ---------------------------------------------------------------------- typed models, range, timing


def test_an_fp16_model_builds_strongly_typed_in_fp16():
    model = encoder_layer(dtype=TensorProto.FLOAT16)
    engine = build(model, strongly_typed=True)
    assert set(layers(engine).values()) == {"fp16"}
    assert engine.precision["strongly_typed"] is True and engine.precision["decisions"] == {}
    assert compare(engine, model) <= FP16_TOLERANCE


def test_an_fp16_model_built_weakly_typed_runs_in_fp32():
    model = encoder_layer(dtype=TensorProto.FLOAT16)
    engine = build(model)
    compute = {p for p in layers(engine).values() if p != "reformat"}
    assert compute == {"fp32"}
    assert engine.graph.info("x").dtype == np.float16 and engine.graph.info("y").dtype == np.float16
    assert compare(engine, model) <= FP16_TOLERANCE


def test_a_layer_whose_fp16_output_overflows_stays_fp32(caplog):
    rng = np.random.default_rng(3)
    big = _weights(rng, 8, 8, scale=3e4)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "big"], ["h"], name="huge"),
                               helper.make_node("Tanh", ["h"], ["y"], name="squash")], "range",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                              [numpy_helper.from_array(big, "big")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with caplog.at_level(logging.WARNING, logger="plugrt.builder"):
        engine = build(model, fp16=True, fusion=False)
    assert "node 'huge'" in caplog.text and "beyond FP16's range" in caplog.text
    # Tanh reads the huge values too: FP32 as well (a cast to FP16 would make them inf).
    assert engine.precision["decisions"]["huge"] == "fp32" and engine.precision["decisions"]["squash"] == "fp32"
    assert engine.precision["fallbacks"][0]["reason"].startswith("FP16 overflow")
    assert compare(engine, model) <= FP16_TOLERANCE


def _fp16_args(run) -> bool:
    return any(getattr(arg, "dtype", None) == np.float16 for launches in run.launches[:1] for launch in launches
               for arg in launch.launch.args)


@pytest.mark.parametrize("faster", ["fp16", "fp32"])
def test_timing_chooses_the_faster_precision(faster):
    """With a measure function the tuner times both precisions of each layer (the GPU
    path in the simulator): the faster one wins."""
    rng = np.random.default_rng(4)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                               helper.make_node("Sigmoid", ["m"], ["y"], name="sigmoid")], "timed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(_weights(rng, 4, 4), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def measure(run) -> float:
        return 1.0 if _fp16_args(run) == (faster == "fp16") else 2.0

    engine = build(model, None, measure, fp16=True, fusion=False, optimization_level=1)
    decisions = {n: p for n, p in engine.precision["decisions"].items() if p != "reformat"}
    assert decisions and set(decisions.values()) == {faster}, decisions


def test_float_slots_follow_the_onnx_type_variables():
    model = encoder_layer()
    engine = build(model, fusion=False)
    graph = engine.graph
    by_name = {node.name: node for node in graph.nodes}
    assert float_slots(graph, by_name["ln1"]) == ((0, 1, 2), (0,))
    assert float_slots(graph, by_name["q"]) == ((0, 1), (0,))


# ---------------------------------------------------------------------- plans and the command line


def test_the_precision_section_round_trips_and_is_checked(tmp_path):
    engine = build(conv_net(), fp16=True)
    path = tmp_path / "m.plan"
    engine.save(str(path))
    loaded = Engine.load(str(path))
    assert loaded.precision == json.loads(json.dumps(engine.precision))
    assert layers(loaded) == layers(engine)
    from test_plan_validation import edited, refused

    plan = path.read_bytes()
    refused(edited(plan, lambda h: h["precision"].update(fp16="yes")), "precision.fp16", "true or false")
    refused(edited(plan, lambda h: h["precision"].pop("decisions")), "precision.decisions", "missing")
    refused(edited(plan, lambda h: h["precision"]["accuracy"].update(max=-1)), "precision.accuracy.max")
    assert isinstance(Engine.deserialize(edited(plan, lambda h: h.pop("precision"))), Engine)
    with pytest.raises(PlanError):
        Engine.deserialize(edited(plan, lambda h: h["precision"].update(extra=1)))


def test_build_fp16_prints_precisions_and_accuracy(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_net().SerializeToString())
    plan = tmp_path / "m.plan"
    assert main(["build", str(model), "-o", str(plan), "--fp16", "--layer-precision", "conv2:fp32",
                 "--optimization-level", "0", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "precision: " in out and "fp16" in out and "fp32" in out
    assert "accuracy against the model's reference at opt shapes (relative error): y " in out
    assert main(["inspect", str(plan), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_node = {node: layer for layer in report["layers"] for node in layer["onnx_nodes"]}
    assert by_node["conv2"]["precision"] == "fp32" and by_node["conv1"]["precision"] == "fp16"
    assert all(layer["format"] == ("channels_last" if "NHWC" in layer["op"] else "linear") for layer in report["layers"])
    assert report["precision"]["layer_precisions"] == {"conv2": "fp32"}
    assert main(["inspect", str(plan)]) == 0
    text = capsys.readouterr().out
    assert "precision: built with fp16" in text and "the build's accuracy check" in text


@pytest.mark.parametrize("argv, message", [
    (["--layer-precision", "conv2"], "give NAME:fp32, NAME:fp16 or NAME:int8"),
    (["--layer-precision", "conv2:fp8"], "give NAME:fp32, NAME:fp16 or NAME:int8"),
    (["--layer-precision", "conv2:fp32,conv2:fp16"], "is given both fp32 and fp16"),
    (["--fp16", "--strongly-typed"], "--fp16 with --strongly-typed"),
])
def test_bad_precision_flags_exit_with_a_message(tmp_path, capsys, argv, message):
    model = tmp_path / "m.onnx"
    model.write_bytes(conv_net().SerializeToString())
    assert main(["build", str(model), "-o", str(tmp_path / "m.plan"), "--no-progress", *argv]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "m.plan").exists()


def test_a_small_gain_does_not_pay_for_the_conversions():
    """FP32 is faster for both MatMuls, FP16 a hair faster for the Sigmoid between them:
    the Sigmoid stays FP32, as its input would need a conversion costing more than it saves."""
    rng = np.random.default_rng(5)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                               helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
                               helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2")], "islands",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(_weights(rng, 4, 4), "w1"),
                               numpy_helper.from_array(_weights(rng, 4, 4), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def measure(run) -> float:
        if run.node.op_type == "MatMul":
            return 2.0 if _fp16_args(run) else 1.0
        return 0.9999 if _fp16_args(run) else 1.0

    engine = build(model, None, measure, fp16=True, fusion=False, optimization_level=1)
    decisions = engine.precision["decisions"]
    assert decisions["mm1"] == decisions["mm2"] == decisions["sigmoid"] == "fp32", decisions
    assert engine.precision["casts"] == 0
