"""INT8 engines: calibration (implicit quantization), the calibration cache, Q/DQ placement
and fusion into integer layers, fallbacks, the accuracy budget and the CLI.

Oracles: the FP32 model in onnxruntime (an INT8 engine is within quantization's error of
it), and the engine's own graph run through the plugins' NumPy references (the kernels
compute exactly the quantized arithmetic: equal up to a rounding tie now and then).
In the simulator nothing is timed, so INT8 is taken wherever calibration allows it.
"""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.engine.accuracy import relative_error
from plugrt.errors import PlugrtError
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from test_precision import conv_net, encoder_layer

#: An INT8 engine of these small random networks against the FP32 model.
INT8_TOLERANCE = 6e-2
#: The engine against its own graph's references (a rounding tie may flip one level).
KERNEL_TOLERANCE = 2e-2


def _batches(seed: int, shape, count: int = 3, name: str = "x") -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


#: conv_net's quantizable layers pinned to INT8: tests of the graph's shape do not hang on a
#: GPU's timing of tiny layers (where INT8 and float are a hair apart either way).
PINNED = {name: "int8" for name in ("conv1", "conv2", "conv3", "fc")}
ATTENTION_PINNED = {name: "int8" for name in ("q", "k", "v")}  # (encoder_layer's projections)


def _build(model, **options):
    config = BuilderConfig(int8=True, progress=False, **options)
    return Builder().build_engine(model, config)


def _run(engine, feeds):
    with engine.create_execution_context() as context:
        return context.execute(feeds)


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _layer_ops(engine) -> list[str]:
    return [layer["op"] for layer in engine.inspect()["layers"]]


def test_calibrated_convnet_runs_int8_layers_without_quantize_kernels_between_them():
    model = conv_net(3)
    engine = _build(model, calibration_data=_batches(0, (1, 3, 6, 6), 4), layer_precisions=PINNED)
    decisions = engine.precision["decisions"]
    assert {name for name, d in decisions.items() if d == "int8"} >= {"conv1", "conv2", "conv3", "fc"}
    ops = _layer_ops(engine)
    # Only the engine's input and the global pool's output are quantized by a kernel of their
    # own: what an integer layer stores is already INT8 (or read by its reader's epilogue).
    layers = engine.inspect()["layers"]
    made_by = {name: layer["op"] for layer in layers for name in layer["outputs"]}
    for layer in layers:
        if layer["op"] in ("QuantizeLinear", "DequantizeLinear"):
            assert not any("Integer" in made_by.get(name, "") for name in layer["inputs"]), layers
    assert sum("ConvInteger" in op for op in ops) == 3 and any("MatMulInteger" in op for op in ops), ops
    feeds = _batches(11, (1, 3, 6, 6), 1)[0]
    got = _run(engine, feeds)["y"]
    expected = _onnxruntime(model, feeds)["y"]
    quantized = ReferenceExecutor(engine.graph, default_registry()).run(feeds)["y"]
    assert relative_error(got, quantized) < KERNEL_TOLERANCE
    assert 0 < relative_error(got, expected) < INT8_TOLERANCE
    assert engine.precision["int8"]["layers"] >= 4 and engine.precision["accuracy"]["max"] < INT8_TOLERANCE


def test_transformer_matmuls_run_int8():
    model = encoder_layer(5)
    engine = _build(model, calibration_data=_batches(1, (1, 4, 8), 3), layer_precisions=ATTENTION_PINNED)
    int8 = {name for name, d in engine.precision["decisions"].items() if d == "int8"}
    assert {"q", "k", "v"} <= int8, engine.precision["decisions"]
    feeds = _batches(12, (1, 4, 8), 1)[0]
    got, expected = _run(engine, feeds), _onnxruntime(model, feeds)
    name = next(iter(expected))
    assert relative_error(got[name], expected[name]) < INT8_TOLERANCE


@pytest.mark.parametrize("algorithm", ["entropy", "minmax", "percentile", "mse"])
def test_every_algorithm_builds(algorithm):
    engine = _build(conv_net(4), calibration_data=_batches(2, (1, 3, 6, 6), 2), calibration_algorithm=algorithm,
                    layer_precisions=PINNED)
    assert engine.precision["int8"]["algorithm"] == algorithm and engine.precision["int8"]["layers"] >= 4


def test_cache_is_reused_to_the_same_plan_and_refused_for_another_model(tmp_path):
    cache = tmp_path / "calibration.cache"
    # (One timing cache too: on a GPU, the second build's tactics are the first's, not a new timing's.)
    options = dict(calibration_cache=str(cache), layer_precisions=PINNED, timing_cache=str(tmp_path / "timing.cache"))
    first = _build(conv_net(6), calibration_data=_batches(3, (1, 3, 6, 6), 3), **options)
    text = cache.read_text().splitlines()
    assert text[0].startswith("plugrt-1-EntropyCalibration2 model=") and len(text) > 4
    # Calibration skipped (the data only serves the accuracy check): the same plan, byte for byte.
    again = _build(conv_net(6), calibration_data=_batches(3, (1, 3, 6, 6), 3), **options)
    a, b = tmp_path / "a.plan", tmp_path / "b.plan"
    first.save(str(a))
    again.save(str(b))
    assert a.read_bytes() == b.read_bytes()
    alone = _build(conv_net(6), **options)  # no data at all: the cache has the ranges
    assert alone.inspect()["layers"] == first.inspect()["layers"]
    assert alone.precision["decisions"] == first.precision["decisions"] and alone.precision["accuracy"] is None
    changed = conv_net(6)
    weight = next(t for t in changed.graph.initializer if t.name == "w2")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, "w2"))
    with pytest.raises(PlugrtError, match="another model"):
        _build(changed, calibration_cache=str(cache))
    with pytest.raises(PlugrtError, match="MinMax|minmax"):
        _build(conv_net(6), calibration_cache=str(cache), calibration_algorithm="minmax")


def test_a_layer_without_a_range_falls_back_and_says_why():
    from onnx import TensorProto, helper

    model = conv_net(7)
    graph = model.graph
    # conv2 reads p1 * 0: a tensor that is zero throughout calibration has no range.
    graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    graph.node.insert(4, helper.make_node("Mul", ["p1", "zero"], ["p1_zero"], name="zeroed"))
    conv2 = next(n for n in graph.node if n.name == "conv2")
    conv2.input[0] = "p1_zero"
    assert TensorProto.FLOAT  # (the model stays float)
    engine = _build(model, calibration_data=_batches(4, (1, 3, 6, 6), 2))
    reasons = {f["layer"]: f["reason"] for f in engine.precision["fallbacks"]}
    assert "conv2" in reasons and "no calibrated range" in reasons["conv2"]
    assert engine.precision["decisions"].get("conv2") != "int8"
    with pytest.raises(PlugrtError, match="'conv2'.*constrained to int8 .*obey.*no calibrated range"):
        _build(model, calibration_data=_batches(4, (1, 3, 6, 6), 2), layer_precisions={"conv2": "int8"},
               precision_constraints="obey")


def test_layer_precision_keeps_a_layer_in_float():
    engine = _build(conv_net(8), calibration_data=_batches(5, (1, 3, 6, 6), 2), layer_precisions={"conv3": "fp32"})
    assert engine.precision["decisions"].get("conv3") != "int8"
    assert any(f["layer"] == "conv3" for f in engine.precision["fallbacks"])


def test_accuracy_budget_keeps_the_most_sensitive_layers_in_float():
    data = _batches(6, (1, 3, 6, 6), 4)
    full = _build(conv_net(9), calibration_data=data)
    error = full.precision["accuracy"]["max"]
    assert error > 0
    budget = error / 4
    engine = _build(conv_net(9), calibration_data=data, accuracy_budget=budget)
    fallbacks = [f for f in engine.precision["fallbacks"] if "accuracy budget" in f["reason"]]
    assert fallbacks, engine.precision
    assert engine.precision["accuracy"]["max"] <= budget + KERNEL_TOLERANCE * error
    assert engine.precision["int8"]["layers"] < full.precision["int8"]["layers"]


def test_int8_errors_name_the_fix(tmp_path):
    model = conv_net(10)
    with pytest.raises(PlugrtError, match="calibration data"):
        _build(model)
    with pytest.raises(PlugrtError, match="without --int8"):
        Builder().build_engine(model, BuilderConfig(calibration_data=_batches(0, (1, 3, 6, 6), 1)))
    with pytest.raises(PlugrtError, match="layer precision conv2:int8 in a build without --int8"):
        Builder().build_engine(model, BuilderConfig(layer_precisions={"conv2": "int8"}))
    with pytest.raises(PlugrtError, match="'x'"):
        _build(model, calibration_data=[{"input": np.ones((1, 3, 6, 6), np.float32)}])
    with pytest.raises(PlugrtError, match="algorithm"):
        _build(model, calibration_data=_batches(0, (1, 3, 6, 6), 1), calibration_algorithm="kl")


def test_calibration_covers_every_batch_shape_in_the_profile():
    """Batches at the profile's min and max shapes both calibrate; one outside is refused."""
    model = conv_net(12)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    profile = OptimizationProfile()
    profile.set_shape("x", (1, 3, 6, 6), (2, 3, 6, 6), (4, 3, 6, 6))
    data = _batches(7, (1, 3, 6, 6), 1) + _batches(8, (4, 3, 6, 6), 1)
    engine = _build(model, calibration_data=data, profiles=[profile])
    feeds = _batches(13, (3, 3, 6, 6), 1)[0]
    assert relative_error(_run(engine, feeds)["y"], _onnxruntime(model, feeds)["y"]) < INT8_TOLERANCE
    with pytest.raises(PlugrtError, match=r"calibration batch 0: .*outside the engine.s profile range"):
        _build(model, calibration_data=_batches(9, (8, 3, 6, 6), 1), profiles=[profile])


def test_cli_builds_int8_from_a_folder_of_batches(tmp_path, capsys):
    import onnx

    model_path = tmp_path / "net.onnx"
    onnx.save(conv_net(13), str(model_path))
    folder = tmp_path / "calibration"
    folder.mkdir()
    for index, batch in enumerate(_batches(10, (1, 3, 6, 6), 3)):
        np.savez(folder / f"batch{index}.npz", **batch)
    plan = tmp_path / "net.plan"
    cache = tmp_path / "net.calibration"
    code = main(["build", str(model_path), "-o", str(plan), "--int8", "--calibration-data", str(folder),
                 "--calibration-cache", str(cache), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and plan.exists() and cache.exists()
    assert "int8" in out
    code = main(["build", str(model_path), "-o", str(tmp_path / "other.plan"), "--int8", "--no-progress"])
    captured = capsys.readouterr()
    assert code != 0 and "calibration data" in captured.err and "Traceback" not in captured.err


def test_quantize_passes_log_nothing_for_a_float_build(caplog):
    with caplog.at_level(logging.INFO, logger="plugrt"):
        engine = Builder().build_engine(conv_net(14), BuilderConfig(progress=False))
    assert engine.precision is None


def test_int8_plan_loads_and_runs_the_same(tmp_path):
    from plugrt.engine import Engine

    engine = _build(conv_net(15), calibration_data=_batches(14, (1, 3, 6, 6), 2), layer_precisions=PINNED)
    path = tmp_path / "int8.plan"
    engine.save(str(path))
    loaded = Engine.load(str(path))
    feeds = _batches(15, (1, 3, 6, 6), 1)[0]
    assert np.array_equal(_run(loaded, feeds)["y"], _run(engine, feeds)["y"])
    layers = loaded.inspect()["layers"]
    assert {layer["precision"] for layer in layers if "Integer" in layer["op"]} == {"int8"}


def test_int8_with_fp16_runs_the_float_layers_in_fp16():
    model = encoder_layer(16)
    config = BuilderConfig(int8=True, fp16=True, progress=False, calibration_data=_batches(17, (1, 4, 8), 8),
                           layer_precisions=ATTENTION_PINNED)
    engine = Builder().build_engine(model, config)
    precisions = {layer["precision"] for layer in engine.inspect()["layers"]}
    assert "int8" in precisions and "fp16" in precisions, precisions
    feeds = _batches(18, (1, 4, 8), 1)[0]
    got, expected = _run(engine, feeds), _onnxruntime(model, feeds)
    name = next(iter(expected))
    assert relative_error(got[name], expected[name]) < INT8_TOLERANCE


def test_int8_convolutions_go_channels_last_as_a_float_build_does():
    """A network of four convolutions: a float build on Hopper (or the simulator) runs them
    channels-last (ConvNHWC); the INT8 build runs every one as ConvIntegerNHWC, its 8
    channels padded to whole int8 chunks (16) by Pads that run on INT8 data, so the one
    standalone QuantizeLinear is the input's."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(19)
    nodes, inits, current = [], [], "x"
    for index in range(4):
        weight = (rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{index}"))
        nodes += [helper.make_node("Conv", [current, f"w{index}"], [f"c{index}"], pads=[1, 1, 1, 1], name=f"conv{index}"),
                  helper.make_node("Relu", [f"c{index}"], [f"r{index}"], name=f"relu{index}")]
        current = f"r{index}"
    graph = helper.make_graph(nodes, "four", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, 8, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    engine = _build(model, calibration_data=_batches(20, (1, 8, 4, 4), 3),
                    layer_precisions={f"conv{index}": "int8" for index in range(4)})
    ops = _layer_ops(engine)
    assert sum(op.startswith("ConvIntegerNHWC+") for op in ops) == 4, ops
    assert not any(op.startswith("ConvInteger+") for op in ops), ops
    assert [op for op in ops if op.startswith("QuantizeLinear")] == ["QuantizeLinear"], ops
    feeds = _batches(21, (1, 8, 4, 4), 1)[0]
    got = _run(engine, feeds)[current]
    assert relative_error(got, ReferenceExecutor(engine.graph, default_registry()).run(feeds)[current]) < KERNEL_TOLERANCE
    assert relative_error(got, _onnxruntime(model, feeds)[current]) < INT8_TOLERANCE


def test_a_timed_build_keeps_in_float_the_layers_int8_makes_slower(caplog):
    """With a timer (a GPU build's; here a given measure), a layer whose integer kernel is
    measured slower than its float ones stays in float, named in the report and a warning."""
    model = conv_net(14)

    def measure(run):
        return 5.0 if "Integer" in run.node.op_type else 1.0

    config = BuilderConfig(int8=True, fp16=True, progress=False, calibration_data=_batches(15, (1, 3, 6, 6), 3),
                           accuracy_check=False, optimization_level=1)
    with caplog.at_level(logging.WARNING, logger="plugrt.builder"):
        engine = Builder(measure=measure).build_engine(model, config)
    slower = [f for f in engine.precision["fallbacks"] if "INT8 measured slower than" in f["reason"]]
    assert {f["layer"] for f in slower} == {"conv1", "conv2", "conv3"}, engine.precision["fallbacks"]
    assert "(5.0000 ms against 1.0000 ms)" in slower[0]["reason"]
    assert not any("ConvInteger" in op for op in _layer_ops(engine))
    assert any("INT8 measured slower" in record.getMessage() for record in caplog.records)
    feeds = _batches(16, (1, 3, 6, 6), 1)[0]
    got = _run(engine, feeds)["y"]
    assert relative_error(got, ReferenceExecutor(engine.graph, default_registry()).run(feeds)["y"]) < KERNEL_TOLERANCE
    assert relative_error(got, _onnxruntime(model, feeds)["y"]) < INT8_TOLERANCE  # (only the head is INT8)


def test_a_layer_constrained_to_int8_is_not_timed():
    """``layer_precisions`` NAME:int8 takes INT8 where calibration allows it, whatever the
    timer says (TensorRT's layer precision under its constraints)."""
    def measure(run):
        return 5.0 if "Integer" in run.node.op_type else 1.0

    config = BuilderConfig(int8=True, progress=False, calibration_data=_batches(15, (1, 3, 6, 6), 2),
                           accuracy_check=False, optimization_level=1, layer_precisions={"conv2": "int8"})
    engine = Builder(measure=measure).build_engine(conv_net(14), config)
    slower = {f["layer"] for f in engine.precision["fallbacks"] if "INT8 measured slower" in f["reason"]}
    assert slower == {"conv1", "conv3"} and engine.precision["decisions"].get("conv2") == "int8", engine.precision
    assert sum("ConvInteger" in op for op in _layer_ops(engine)) == 1


@pytest.mark.parametrize("times, expected", [((0.5, 1.0, 2.0), None), ((0.9, 1.0, 0.8), "FP16"),
                                             ((1.5, 1.0, None), "FP32"), ((None, 1.0, 0.8), None)])
def test_int8_is_kept_where_no_float_kernel_is_faster(times, expected):
    """:func:`slower_in_int8` against the timer's answers (integer, FP32, FP16 ms; None:
    not timed, which keeps INT8)."""
    from plugrt.ir.graph import Int8Request
    from plugrt.onnx.importer import import_model
    from plugrt_builtin_ops.quant.timed import slower_in_int8

    registry = default_registry()
    graph = import_model(conv_net(17), registry=registry)
    node = next(n for n in graph.nodes if n.op_type == "Conv")
    asked = []

    def timer(variant, dtypes):
        label = "int8" if variant.op_type == "ConvInteger" else "fp16" if dtypes else "fp32"
        asked.append((label, variant.inputs[:2] == node.inputs[:2]))
        return dict(zip(("int8", "fp32", "fp16"), times))[label]

    reason = slower_in_int8(graph, registry, node, Int8Request(fp16=True, timer=timer))
    assert sorted(asked) == [("fp16", True), ("fp32", True), ("int8", True)]
    assert (reason is None) if expected is None else f"INT8 measured slower than {expected}" in reason
