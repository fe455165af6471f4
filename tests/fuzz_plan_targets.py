"""Small valid plans, and the fuzz target that loads mutated ones (tests/test_fuzz_plans.py).

A case is one byte naming the plan it was mutated from, then the mutated plan bytes. The
target loads it; a plan that loads must inspect, make a context and give the original
plan's answer on that plan's input, or the target returns the problem (a silent load of
an inconsistent header).
"""

from __future__ import annotations

import json
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from plugrt import PlugrtError
from plugrt.engine import Builder, Engine

#: When set, the target appends "refused" or "loaded" to this file for every case.
COUNTS_VARIABLE = "PLUGRT_FUZZ_PLAN_COUNTS"


def _relu():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), None, (2, 3)


def _conv_relu():
    """Conv + Relu, fused into one layer, with two initializers."""
    weight = numpy_helper.from_array(np.linspace(-1, 1, 18, dtype=np.float32).reshape(2, 1, 3, 3), "w")
    bias = numpy_helper.from_array(np.array([0.1, -0.2], np.float32), "b")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "conv_relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], [bias, weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), None, (1, 1, 4, 4)


def _dynamic():
    """A dynamic batch dim with a profile; Add + Sigmoid fused into one pointwise layer."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])],
                              "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), ((1, 3), (2, 3), (4, 3)), (2, 3)


MODELS = (_relu, _conv_relu, _dynamic)


def feed(shape) -> np.ndarray:
    return np.linspace(-2, 2, int(np.prod(shape)), dtype=np.float32).reshape(shape)


def build_plans() -> list[bytes]:
    """The plans of :data:`MODELS`, built at optimization level 0 (no timing)."""
    builder = Builder()
    plans = []
    for make in MODELS:
        model, profile_shapes, _ = make()
        config = builder.create_builder_config()
        config.optimization_level = 0
        config.progress = False
        if profile_shapes:
            profile = builder.create_optimization_profile()
            profile.set_shape("x", *profile_shapes)
            config.add_optimization_profile(profile)
        plans.append(builder.build_engine(model, config).serialize())
    return plans


_EXPECTED: list | None = None


def _expected() -> list:
    global _EXPECTED
    if _EXPECTED is None:
        _EXPECTED = [_run(Engine.deserialize(plan), make()[2]) for plan, make in zip(build_plans(), MODELS)]
    return _EXPECTED


def _run(engine, shape) -> np.ndarray:
    name = engine.input_names[0]
    x = feed(shape).astype(engine.graph.info(name).dtype)
    return engine.create_execution_context().execute({name: x})[engine.output_names[0]]


def _count(what: str) -> None:
    path = os.environ.get(COUNTS_VARIABLE)
    if path:
        with open(path, "a") as f:
            f.write(what + "\n")


def load_plan(payload: bytes):
    """Load a mutated plan; if it loads, it must behave as the plan it came from."""
    which, data = payload[0], payload[1:]
    expected = _expected()[which]
    try:
        engine = Engine.deserialize(data, label="<fuzzed>")
    except Exception:
        _count("refused")
        raise
    json.dumps(engine.inspect())
    if engine.graph.info(engine.input_names[0]).dtype != np.float32:
        _count("retyped")  # a self-consistent plan of another model: the input's dtype was edited
        _run(engine, MODELS[which]()[2])
        return None
    _count("loaded")
    try:
        got = _run(engine, MODELS[which]()[2])
    except PlugrtError as exc:
        return f"plan loaded but cannot run the original's input: {exc}"
    if got.shape != expected.shape or not np.allclose(got.astype(np.float64), expected, rtol=1e-2, atol=1e-3):
        return f"plan loaded but computes something else: {got.ravel()[:6]} vs {expected.ravel()[:6]}"
    return None
