"""The ``sink_reshapes`` pass: a Reshape between a GEMM and the pointwise nodes after it
(HF GPT-2's every Linear) moves below them where that changes no result, so the GEMM and
its epilogue are one kernel; where it would change a result, or the reshaped tensor has
another reader, it stays. Each graph is compared with onnxruntime on fresh inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry

TOL = 1e-4


#: The Reshapes' targets, as initializers.
SHAPES = {"to_3d": [2, 3, 8], "to_rows": [-1, 5], "to_3x8": [3, 8], "to_batch": [-1, 3, 8],
          "axes0": [0]}


def model(nodes, inputs, outputs, inits, opset=17):
    targets = {name: SHAPES[name] for node in nodes for name in node.input if name in SHAPES}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(a, np.float32), k)
                                           for k, a in inits.items()]
                              + [numpy_helper.from_array(np.asarray(a, np.int64), k) for k, a in targets.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def kernels(model_proto, rng, feeds_shapes, profile=None):
    """The engine's kernel layers' ops, after checking every output against onnxruntime."""
    config = BuilderConfig(progress=False, tf32=False)
    if profile is not None:
        config.add_optimization_profile(profile)
    engine = Builder().build_engine(model_proto, config)
    session = onnxruntime.InferenceSession(model_proto.SerializeToString())
    context = engine.create_execution_context()
    for shapes in feeds_shapes:
        feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
        got = context.execute(feeds)
        for output, want in zip(session.get_outputs(), session.run(None, feeds)):
            assert got[output.name].shape == want.shape
            np.testing.assert_allclose(got[output.name], want, rtol=TOL, atol=TOL * np.abs(want).max())
    return [layer["op"] for layer in engine.inspect()["layers"] if layer["alias"] is None]


def weights(rng, *shape):
    return rng.standard_normal(shape) / np.sqrt(shape[0])


def test_a_gelu_after_a_reshaped_gemm_fuses_into_it(rng):
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="fc"),
             helper.make_node("Reshape", ["g", "to_3d"], ["r"], name="reshape"),
             helper.make_node("Gelu", ["r"], ["y"], name="gelu")]
    m = model(nodes, [("x", [6, 5])], ["y"], {"w": weights(rng, 5, 8), "b": rng.standard_normal(8)}, opset=20)
    assert kernels(m, rng, [{"x": (6, 5)}]) == ["Gemm+Gelu"]


def test_a_residual_add_of_the_output_shape_fuses_its_reshape_read_back(rng):
    """GPT-2's c_proj: Gemm -> Reshape [6, 8] -> [2, 3, 8] -> Add(residual [2, 3, 8]): the
    residual is read through a Reshape to [6, 8] (an alias), the Add fuses into the Gemm."""
    nodes = [helper.make_node("Reshape", ["x", "to_rows"], ["x2"], name="flat"),
             helper.make_node("Gemm", ["x2", "w", "b"], ["g"], name="fc"),
             helper.make_node("Reshape", ["g", "to_3d"], ["r"], name="reshape"),
             helper.make_node("Add", ["res", "r"], ["y"], name="residual")]
    m = model(nodes, [("x", [2, 3, 5]), ("res", [2, 3, 8])], ["y"],
              {"w": weights(rng, 5, 8), "b": rng.standard_normal(8)})
    assert kernels(m, rng, [{"x": (2, 3, 5), "res": (2, 3, 8)}]) == ["Gemm+Add"]


def test_at_a_dynamic_batch_the_residual_is_read_back_through_a_minus_one(rng):
    nodes = [helper.make_node("Reshape", ["x", "to_rows"], ["x2"], name="flat"),
             helper.make_node("Gemm", ["x2", "w", "b"], ["g"], name="fc"),
             helper.make_node("Reshape", ["g", "to_batch"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "res"], ["y"], name="residual")]
    m = model(nodes, [("x", ["B", 3, 5]), ("res", ["B", 3, 8])], ["y"],
              {"w": weights(rng, 5, 8), "b": rng.standard_normal(8)})
    profile = OptimizationProfile().set_shape("x", (1, 3, 5), (2, 3, 5), (4, 3, 5)).set_shape(
        "res", (1, 3, 8), (2, 3, 8), (4, 3, 8))
    feeds = [{"x": (batch, 3, 5), "res": (batch, 3, 8)} for batch in (4, 1, 3)]
    assert kernels(m, rng, feeds, profile) == ["Gemm+Add"]


def test_a_bias_and_relu_chain_moves_through_one_node_at_a_time(rng):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"], name="mm"),
             helper.make_node("Reshape", ["g", "to_3d"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "bias"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    m = model(nodes, [("x", [6, 5])], ["y"], {"w": weights(rng, 5, 8), "bias": rng.standard_normal(8)})
    assert kernels(m, rng, [{"x": (6, 5)}]) == ["MatMul+Add+Relu"]
    registry = default_registry()
    graph = import_model(m, registry=registry)
    optimize(graph, registry, disabled=("fuse_epilogues", "fuse_pointwise"))
    assert [node.op_type for node in graph.nodes] == ["MatMul", "Add", "Relu", "Reshape"]


def test_a_reshape_changing_the_last_axis_under_a_bias_stays(rng):
    """[6, 4] -> [3, 8] with a bias [8]: over [6, 4] the bias would meet other elements."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"], name="mm"),
             helper.make_node("Reshape", ["g", "to_3x8"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "bias"], ["y"], name="bias")]
    m = model(nodes, [("x", [6, 5])], ["y"], {"w": weights(rng, 5, 4), "bias": rng.standard_normal(8)})
    assert kernels(m, rng, [{"x": (6, 5)}]) == ["MatMul", "Add"]


def test_a_reshaped_tensor_read_twice_stays(rng):
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="fc"),
             helper.make_node("Reshape", ["g", "to_3d"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["y"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["z"], name="sigmoid")]
    m = model(nodes, [("x", [6, 5])], ["y", "z"], {"w": weights(rng, 5, 8)})
    assert kernels(m, rng, [{"x": (6, 5)}]) == ["Gemm", "Relu", "Sigmoid"]


def test_an_unsqueeze_moves_below_a_constant_of_its_output_shape_stored_reshaped(rng):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["g"], name="mm"),
             helper.make_node("Unsqueeze", ["g", "axes0"], ["u"], name="unsqueeze"),
             helper.make_node("Mul", ["u", "scale"], ["y"], name="scale")]
    m = model(nodes, [("x", [6, 5])], ["y"], {"w": weights(rng, 5, 8), "scale": rng.standard_normal((1, 6, 8))})
    assert kernels(m, rng, [{"x": (6, 5)}]) == ["MatMul+Mul"]
