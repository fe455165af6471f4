"""NonZero (builtin-shape) and NonMaxSuppression (builtin-spatial): ops whose output size is
their input's data. Their references against ONNX's own, and through engines: on the host
where the inputs are known when the engine is specialized (constants, shape computations,
shape-tensor inputs); where they are computed on the device, NonZero runs as a
data-dependent layer, as does NonMaxSuppression."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.errors import UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_node, single_node_model


def _ours_and_onnx(registry, op_type, feeds, attrs=None, opset=17):
    model = single_node_model(op_type, feeds, attrs, opset=opset)
    graph = import_model(model, registry=registry)
    ours = ReferenceExecutor(graph, registry).run(dict(feeds))[graph.outputs[0]]
    return ours, ReferenceEvaluator(model).run(None, dict(feeds))[0]


def _model(nodes, inputs, output, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(output, TensorProto.UNDEFINED, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _config(shapes, values=None):
    """A profile of these static shapes; ``values``: shape-tensor inputs' opt values, or
    ``(min, opt, max)`` values."""
    config = BuilderConfig(optimization_level=0, progress=False)
    profile = OptimizationProfile()
    for name, shape in shapes.items():
        profile.set_shape(name, shape, shape, shape)
    for name, value in (values or {}).items():
        if isinstance(value, tuple):
            profile.set_shape_input(name, *value)
        else:
            profile.set_shape_values(name, value)
    config.add_optimization_profile(profile)
    return config


# ---------------------------------------------------------------------- NonZero


@pytest.mark.parametrize("x", [
    np.array([[1, 0], [1, 1]], bool),
    np.array([[0.0, 2.5, -1.0], [0.0, 0.0, 3.0]], np.float32),
    np.arange(-3, 9, dtype=np.int64).reshape(2, 3, 2) % 3,
    np.array(5, np.int32),
    np.array(0.0, np.float16),
    np.zeros((2, 0, 3), np.float32),
    np.zeros((4,), np.uint8),
], ids=["bool", "float32", "int64-3d", "0d-nonzero", "0d-zero", "empty", "all-zero"])
def test_nonzero_reference_matches_onnx(registry, x):
    ours, theirs = _ours_and_onnx(registry, "NonZero", {"x": x})
    assert ours.dtype == theirs.dtype == np.int64
    np.testing.assert_array_equal(ours, theirs)


def test_nonzero_of_a_shape_computation_runs_on_the_host(registry, rng):
    """Reduction axes found as NonZero(Greater(Shape(x), 1)) over a dynamic shape: the
    axes are computed on the host at each specialization, the reduction on the device."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Greater", ["s", "one"], ["wide"], name="wide"),
             helper.make_node("NonZero", ["wide"], ["idx"], name="nonzero"),
             helper.make_node("Reshape", ["idx", "flat"], ["axes"], name="axes"),
             helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1, name="reduce")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 3, 1])], "y",
                   [("one", np.array(1, np.int64)), ("flat", np.array([-1], np.int64))])
    model.opset_import[0].version = 18  # ReduceMax's axes input
    engine = Builder(registry).build_engine(model, _config({"x": (2, 1, 3, 1)}))
    assert "nonzero" in engine.inspect()["host_nodes"]
    x = rng.standard_normal((2, 1, 3, 1)).astype(np.float32)
    got = engine.create_execution_context().execute({"x": x})["y"]
    np.testing.assert_array_equal(got, x.max(axis=(0, 2), keepdims=True))


def test_nonzero_of_a_shape_tensor_input_follows_its_values(registry, rng):
    """A mask fed as a shape-tensor input: each run's values size the Gather after it."""
    nodes = [helper.make_node("NonZero", ["m"], ["idx"], name="nonzero"),
             helper.make_node("Reshape", ["idx", "flat"], ["cols"], name="cols"),
             helper.make_node("Gather", ["x", "cols"], ["g"], axis=1, name="gather"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    model = _model(nodes, [helper.make_tensor_value_info("m", TensorProto.BOOL, [8]),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])], "y",
                   [("flat", np.array([-1], np.int64))])
    built_for = np.array([1, 0, 0, 1, 0, 0, 0, 0], bool)
    mask_range = (np.zeros(8, bool), built_for, np.ones(8, bool))
    engine = Builder(registry).build_engine(model, _config({"m": (8,), "x": (3, 8)}, {"m": mask_range}))
    assert [layer["op"] for layer in engine.inspect()["layers"]] == ["Gather", "Relu"]
    context = engine.create_execution_context()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    for mask in (built_for, np.array([1, 1, 1, 1, 0, 1, 1, 1], bool), np.zeros(8, bool)):
        got = context.execute({"m": mask, "x": x})["y"]
        np.testing.assert_array_equal(got, np.maximum(x[:, np.nonzero(mask)[0]], 0))


def test_nonzero_of_device_data_runs_as_a_data_dependent_layer(registry, rng):
    """Relu -> NonZero: the count is known only after the device ran; the output comes
    back at its actual size (tests/test_data_dependent_shapes.py has the engine's side)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("NonZero", ["r"], ["y"], name="nonzero")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], "y")
    engine = Builder(registry).build_engine(model, _config({"x": (2, 3)}))
    assert [layer["op"] for layer in engine.inspect()["layers"]] == ["Relu", "NonZero"]
    with engine.create_execution_context() as context:
        for x in (rng.standard_normal((2, 3)), np.zeros((2, 3)), np.ones((2, 3))):
            x = x.astype(np.float32)
            np.testing.assert_array_equal(context.execute({"x": x})["y"], np.vstack(np.nonzero(np.maximum(x, 0))))


@pytest.mark.parametrize("x", [
    np.array([[0.0, 2.5, -1.0], [0.0, -0.0, np.nan]], np.float32),
    np.arange(-3, 9, dtype=np.int64).reshape(2, 3, 2) % 3,
    np.array([[1, 0], [1, 1]], bool),
    np.array(5, np.int32),
    np.array(0.0, np.float16),
    np.array([0, 3, 0, 0, 7, 1, 0, 0, 0, 2], np.uint8),
    np.array([[0.5, 0.0], [-0.0, -2.0]], np.float64),
], ids=["float32-nan-negzero", "int64-3d", "bool", "0d-nonzero", "0d-zero", "uint8", "float64"])
def test_nonzero_tactic_matches_the_reference(registry, x):
    """The scan tactic reports (rank, count) and writes the indices in row-major order;
    -0.0 is zero and NaN nonzero, as in NumPy."""
    check_node("NonZero", {"x": x}, registry=registry)


# ---------------------------------------------------------------------- NonMaxSuppression


def nms_feeds(rng, batches=2, classes=3, boxes=12, center=False, ties=False):
    if center:
        b = np.concatenate([rng.uniform(0, 10, (batches, boxes, 2)), rng.uniform(0.5, 4, (batches, boxes, 2))], -1)
    else:
        b = rng.uniform(0, 10, (batches, boxes, 4))  # corners in any order
    scores = rng.integers(0, 4, (batches, classes, boxes)) / 4 if ties else rng.random((batches, classes, boxes))
    return {"boxes": b.astype(np.float32), "scores": scores.astype(np.float32)}


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("max_out, iou, score", [
    (3, 0.5, 0.2), (100, 0.0, None), (5, 0.3, None), (0, 0.5, 0.1), (2, 1.0, 0.7), (20, 0.6, 0.0),
])
def test_nms_reference_matches_onnx(registry, rng, center, ties, max_out, iou, score):
    feeds = nms_feeds(rng, center=bool(center), ties=ties)
    feeds["max_output_boxes_per_class"] = np.array([max_out], np.int64)
    feeds["iou_threshold"] = np.array([iou], np.float32)
    if score is not None:
        feeds["score_threshold"] = np.array([score], np.float32)
    ours, theirs = _ours_and_onnx(registry, "NonMaxSuppression", feeds, {"center_point_box": center}, opset=11)
    assert ours.dtype == np.int64 and ours.shape[1:] == (3,)
    np.testing.assert_array_equal(ours, theirs)


def test_nms_optional_inputs_omitted(registry, rng):
    """No max_output_boxes_per_class: no box is selected (its default is 0)."""
    feeds = nms_feeds(rng)
    graph = import_model(single_node_model("NonMaxSuppression", feeds, opset=11), registry=registry)
    out = ReferenceExecutor(graph, registry).run(feeds)[graph.outputs[0]]
    assert out.shape == (0, 3)


def test_nms_on_the_host_feeds_device_layers(registry, rng):
    """Constant anchors, scores as a shape-tensor input: NMS runs on the host for each
    run's scores, the selected boxes' features are gathered on the device."""
    feeds = nms_feeds(rng, batches=1, classes=1, boxes=10)
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"], name="nms"),
             helper.make_node("Gather", ["sel", "two"], ["box_index"], axis=1, name="box_index"),
             helper.make_node("Gather", ["features", "box_index"], ["y"], axis=0, name="gather")]
    initializers = [("boxes", feeds["boxes"]), ("k", np.array([4], np.int64)), ("iou", np.array([0.3], np.float32)),
                    ("two", np.array(2, np.int64))]
    inputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 10]),
              helper.make_tensor_value_info("features", TensorProto.FLOAT, [10, 5])]
    model = _model(nodes, inputs, "y", initializers)
    score_range = (np.zeros((1, 1, 10), np.float32), feeds["scores"], np.ones((1, 1, 10), np.float32))
    config = _config({"scores": (1, 1, 10), "features": (10, 5)}, {"scores": score_range})
    engine = Builder(registry).build_engine(model, config)
    report = engine.inspect()
    assert "nms" in report["host_nodes"] and [layer["op"] for layer in report["layers"]] == ["Gather"]
    context = engine.create_execution_context()
    reference = ReferenceExecutor(import_model(model, registry), registry)
    features = rng.standard_normal((10, 5)).astype(np.float32)
    for scores in (feeds["scores"], rng.random((1, 1, 10)).astype(np.float32)):
        run = {"scores": scores, "features": features}
        np.testing.assert_array_equal(context.execute(run)["y"], reference.run(run)["y"])


@pytest.mark.parametrize("center, ties", [(0, False), (1, True)])
@pytest.mark.parametrize("max_out, iou, score", [(3, 0.5, 0.2), (100, 0.0, None), (0, 0.5, 0.1), (20, 0.6, 0.0)])
@pytest.mark.parametrize("constants", [("max_output_boxes_per_class", "iou_threshold", "score_threshold"), ()],
                         ids=["constant-scalars", "runtime-scalars"])
def test_nms_tactic_matches_the_reference(registry, rng, center, ties, max_out, iou, score, constants):
    """The greedy tactic, its output sized after it ran, against the reference (itself
    checked against ONNX's above): scalars known at build time or read on the device."""
    feeds = nms_feeds(rng, center=bool(center), ties=ties)
    feeds["max_output_boxes_per_class"] = np.array([max_out], np.int64)
    feeds["iou_threshold"] = np.array([iou], np.float32)
    if score is not None:
        feeds["score_threshold"] = np.array([score], np.float32)
    check_node("NonMaxSuppression", feeds, {"center_point_box": center}, opset=11, registry=registry,
               constants=[name for name in constants if name in feeds])


def test_nms_of_device_scores_runs_as_a_data_dependent_layer(registry, rng):
    """Sigmoid scores on the device, then NMS, then the kept boxes' batch indices summed:
    the engine reads the count after NMS; onnxruntime is the oracle."""
    nodes = [helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"], name="nms"),
             helper.make_node("ReduceSum", ["sel", "axes"], ["y"], keepdims=0, name="sum")]
    model = _model(nodes, [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["b", 6, 4]),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 2, 6])], "y",
                   [("k", np.array([2], np.int64)), ("iou", np.array([0.4], np.float32)),
                    ("axes", np.array([0], np.int64))])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64  # (onnxruntime needs it typed)
    config = BuilderConfig(optimization_level=0, progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("boxes", (1, 6, 4), (2, 6, 4), (3, 6, 4))
                                    .set_shape("logits", (1, 2, 6), (2, 2, 6), (3, 2, 6)))
    engine = Builder(registry).build_engine(model, config)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        for batch in (2, 3, 1):
            feeds = {"boxes": rng.uniform(0, 4, (batch, 6, 4)).astype(np.float32),
                     "logits": rng.standard_normal((batch, 2, 6)).astype(np.float32)}
            np.testing.assert_array_equal(context.execute(feeds)["y"], session.run(None, feeds)[0])


@pytest.mark.parametrize("boxes, scores, attrs, message", [
    ((1, 6, 4), (1, 2, 5), {}, "do not match"),
    ((1, 6, 3), (1, 2, 6), {}, "do not match"),
    ((6, 4), (1, 2, 6), {}, "ranks 2 and 3"),
    ((1, 6, 4), (1, 2, 6), {"center_point_box": 2}, "center_point_box=2"),
])
def test_nms_refuses_invalid_nodes(registry, boxes, scores, attrs, message):
    feeds = {"boxes": np.zeros(boxes, np.float32), "scores": np.zeros(scores, np.float32)}
    with pytest.raises(Exception, match=message):
        import_model(single_node_model("NonMaxSuppression", feeds, attrs, opset=11), registry=registry)
