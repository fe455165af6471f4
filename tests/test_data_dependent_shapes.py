"""Issue 19 part 3: shape-tensor inputs with value ranges, and data-dependent output sizes.

Shape-tensor inputs (values read on the host, as a Reshape's target) are declared in a
profile with min/opt/max values: layers are tuned at opt, memory is planned at max, a run
outside the range is refused, plans keep the range. Data-dependent layers (NonZero of
device data) report their outputs' sizes after they run; the engine specializes the rest
of the network for them, with the plan's kernels, and hands engine outputs of such sizes
back at their actual shape or through an output allocator (TensorRT's IOutputAllocator).
Every result is compared with onnxruntime on fresh random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile, plan_kernels
from plugrt.engine.generic import launch_key, probes
from plugrt.errors import BindingError, PlugrtError
from plugrt.kernels import cuda, jit


def _model(nodes, inputs, outputs, initializers=()):
    """``outputs``: names of float outputs, or (name, element type) pairs."""
    typed = [o if isinstance(o, tuple) else (o, TensorProto.FLOAT) for o in outputs]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, kind, None) for o, kind in typed],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model, feeds: dict) -> dict:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _build(model, profile: OptimizationProfile, **options):
    config = BuilderConfig(progress=False, tf32=False, **options)
    config.add_optimization_profile(profile)
    return Engine.deserialize(Builder().build_engine(model, config).serialize())


def _planned(engine, context) -> None:
    """Every launch of every specialization the context made is among the plan's kernels."""
    planned = plan_kernels.planned_keys(engine)
    for spec in context._specs.values():
        needed = {launch_key(launch.key, launch.launch.kernel) for launch in spec.launches}
        assert needed <= planned, f"{spec.label} {spec.sizes}: {len(needed - planned)} kernel(s) not in the plan"


# ---------------------------------------------------------------------- shape-tensor value ranges


def tile_model():
    """x (2, 3) tiled by the shape-tensor input ``repeats`` (2 values), then Softmax over
    the last axis: the device layers' shapes follow the values, and any values in range
    make a valid network."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Tile", ["r", "repeats"], ["v"], name="tile"),
             helper.make_node("Softmax", ["v"], ["y"], axis=-1, name="softmax")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
              helper.make_tensor_value_info("repeats", TensorProto.INT64, [2])]
    return _model(nodes, inputs, ["y"])


RANGE = ([1, 1], [2, 3], [4, 5])


def test_shape_tensor_values_run_across_their_range_and_are_refused_outside(rng):
    model = tile_model()
    engine = _build(model, OptimizationProfile().set_shape_input("repeats", *RANGE))
    profile = engine.profiles[0]
    assert (profile.shape_values["repeats"], profile.value_ranges["repeats"]) == (RANGE[1], (RANGE[0], RANGE[2]))
    assert engine.shapes["max"]["y"] == [8, 15]  # memory for the max values
    with engine.create_execution_context() as context:
        for values in ([2, 3], [1, 1], [4, 5], [3, 2], [1, 4], [2, 3]):
            feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32), "repeats": np.array(values, np.int64)}
            want = _onnxruntime(model, feeds)["y"]
            got = context.execute(feeds)["y"]
            assert got.shape == want.shape, values
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(values))
        _planned(engine, context)
        feeds["repeats"] = np.array([5, 1], np.int64)
        with pytest.raises(BindingError, match=r"shape-tensor input 'repeats': value 0 is 5, outside the profile's "
                                               r"range \[1, 4\].*--min-values/--max-values"):
            context.execute(feeds)
        with pytest.raises(BindingError, match="value 1 is 0"):
            context.specialize({"x": (2, 3), "repeats": (2,)}, {"repeats": [2, 0]})


def test_value_ranges_are_checked_when_set_and_kept_in_plans():
    with pytest.raises(PlugrtError, match="value 1 needs min <= opt <= max, got 3, 2, 5"):
        OptimizationProfile().set_shape_input("s", [1, 3], [1, 2], [1, 5])
    with pytest.raises(PlugrtError, match="as many values, got 2, 2, 3"):
        OptimizationProfile().set_shape_input("s", [1, 3], [1, 3], [1, 3, 4])
    engine = _build(tile_model(), OptimizationProfile().set_shape_input("repeats", *RANGE))
    entry = engine.profiles[0].as_json()["repeats"]
    assert (entry["values_min"], entry["values"], entry["values_max"]) == tuple(RANGE)
    assert OptimizationProfile.from_json(engine.profiles[0].as_json()).value_ranges == engine.profiles[0].value_ranges


def test_the_cli_takes_value_trios(tmp_path, capsys):
    model, plan = tmp_path / "m.onnx", tmp_path / "m.plan"
    onnx.save(tile_model(), model)
    flags = ["--min-values", "repeats:1x1", "--opt-values", "repeats:2x3", "--max-values", "repeats:4x5"]
    assert main(["build", str(model), "-o", str(plan), "--no-progress", *flags]) == 0
    assert Engine.load(str(plan)).profiles[0].value_ranges["repeats"] == ([1, 1], [4, 5])
    assert main(["run", str(plan), "--compare-onnxruntime", str(model)]) == 0
    assert "y: float32[4, 9]" in capsys.readouterr().out
    assert main(["build", str(model), "-o", str(tmp_path / "bad.plan"), "--no-progress",
                 "--opt-values", "repeats:2x3x4"]) != 0
    err = capsys.readouterr().err
    assert "shape-tensor input 'repeats' must have one fixed shape holding its 3 values" in err
    assert "Traceback" not in err
    assert main(["build", str(model), "-o", str(tmp_path / "bad.plan"), "--opt-values", "repeats:2xfour"]) != 0
    assert "--opt-values: 'repeats:2xfour' is not NAME:VxVx..." in capsys.readouterr().err


def test_probes_cover_shape_tensor_values_and_data_dependent_sizes():
    profile = OptimizationProfile().set_shape("x", (2, 3), (2, 3), (2, 3)).set_shape_input("s", *RANGE)
    found = probes(profile)
    assert [p.values["s"] for p in found] == [[1, 1], [4, 5], [3, 3], [4, 4]]
    static = OptimizationProfile().set_shape("x", (2, 3), (2, 3), (2, 3))
    assert probes(static) == []
    assert [p.sizes for p in probes(static, data_dependent=True)] == ["min", "max", "odd", "even"]


# ---------------------------------------------------------------------- data-dependent sizes (NonZero)


def masked_gather_model():
    """The values of x above 0.2, gathered by NonZero's indices into x flattened, doubled;
    their sum; and the indices themselves: one output of a data-dependent size, others
    computed from it."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["xs"], name="flatten"),
             helper.make_node("Greater", ["xs", "t"], ["mask"], name="greater"),
             helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero"),
             helper.make_node("Reshape", ["idx", "flat"], ["rows"], name="rows"),
             helper.make_node("Gather", ["xs", "rows"], ["picked"], axis=0, name="gather"),
             helper.make_node("Mul", ["picked", "two"], ["y"], name="double"),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=1, name="total")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])]
    return _model(nodes, inputs, ["y", ("idx", TensorProto.INT64), "total"],
                  [("t", np.float32(0.2)), ("two", np.float32(2.0)), ("flat", np.array([-1], np.int64))])


def _masked_feeds(rng, rows, kind="random"):
    x = rng.standard_normal((rows, 3)).astype(np.float32)
    if kind == "none":
        x = -np.abs(x)
    elif kind == "all":
        x = np.abs(x) + 1.0
    return {"x": x}


def test_a_data_dependent_layer_sizes_the_layers_after_it(rng, tmp_path):
    model = masked_gather_model()
    profile = OptimizationProfile().set_shape("x", (1, 3), (3, 3), (5, 3))
    path = tmp_path / "masked.plan"
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(profile)
    Builder().build_engine(model, config).save(str(path))
    engine = Engine.load(str(path))
    layers = {layer["name"]: layer for layer in engine.inspect()["layers"]}
    assert layers["nonzero"]["data_dependent"] and not any(layers[n]["data_dependent"] for n in layers if n != "nonzero")
    assert engine.shapes["max"]["idx"] == [1, 15]  # memory for every element nonzero
    with engine.create_execution_context() as context:
        for rows, kind in [(3, "random"), (5, "random"), (1, "random"), (4, "none"), (2, "all"), (3, "random")]:
            feeds = _masked_feeds(rng, rows, kind)
            want, got = _onnxruntime(model, feeds), context.execute(feeds)
            for name in ("y", "idx", "total"):
                assert got[name].shape == want[name].shape, (rows, kind, name)
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"{rows} {kind} {name}")
        _planned(engine, context)


def test_outputs_of_data_dependent_size_go_through_an_output_allocator(rng):
    class Allocator:
        def __init__(self):
            self.calls, self.shapes = [], []

        def reallocate_output(self, name, memory, size, alignment):
            self.calls.append((name, memory is not None, size, alignment))
            if memory is not None and memory.size >= size:
                return memory
            return cuda.device_array(max(size, 1) + 8, np.uint8)

        def notify_shape(self, name, shape):
            self.shapes.append((name, tuple(shape)))

    model = masked_gather_model()
    engine = _build(model, OptimizationProfile().set_shape("x", (1, 3), (3, 3), (5, 3)))
    allocator = Allocator()
    with engine.create_execution_context() as context:
        context.set_output_allocator("idx", allocator)
        for rows in (4, 2):
            feeds = _masked_feeds(rng, rows)
            want = _onnxruntime(model, feeds)
            got = context.execute_async(feeds)
            context.stream.synchronize()
            np.testing.assert_array_equal(got["idx"].copy_to_host(), want["idx"])
            np.testing.assert_allclose(got["y"].copy_to_host(), want["y"], rtol=1e-5, atol=1e-6)
            assert allocator.shapes[-1] == ("idx", want["idx"].shape)
            assert allocator.calls[-1] == ("idx", rows == 2, want["idx"].nbytes, 256)
        with pytest.raises(BindingError, match="its size depends on data: give it an output allocator"):
            context.execute_async(_masked_feeds(rng, 3), outputs={"y": cuda.device_array((1,), np.float32)})
        with pytest.raises(BindingError, match="has no reallocate_output or notify_shape\\(\\) method"):
            context.set_output_allocator("y", object())
        with pytest.raises(BindingError, match="the model has no such output"):
            context.set_output_allocator("nope", allocator)


def test_two_data_dependent_layers_in_a_row(rng):
    """NonZero of a mask computed from the first NonZero's indices: two reads, two
    specializations after the first."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["mask"], name="greater"),
             helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero_1"),
             helper.make_node("Cast", ["idx"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Greater", ["f", "one"], ["mask2"], name="greater_2"),
             helper.make_node("NonZero", ["mask2"], ["y"], name="nonzero_2")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])], [("y", TensorProto.INT64)],
                   [("zero", np.float32(0.0)), ("one", np.float32(1.0))])
    engine = _build(model, OptimizationProfile().set_shape("x", (1, 4), (2, 4), (3, 4)))
    with engine.create_execution_context() as context:
        for rows in (2, 3, 1, 3):
            feeds = {"x": rng.standard_normal((rows, 4)).astype(np.float32)}
            np.testing.assert_array_equal(context.execute(feeds)["y"], _onnxruntime(model, feeds)["y"])
        assert max(len(key) for key in context._specs) == len(next(iter(context._specs))) + 2
        _planned(engine, context)


def test_a_tactic_reporting_sizes_beyond_its_bounds_is_named(rng, monkeypatch):
    from plugrt_builtin_ops.shape import generators

    model = masked_gather_model()
    engine = _build(model, OptimizationProfile().set_shape("x", (1, 3), (3, 3), (5, 3)))
    @jit
    def too_many(counts, chunks, shape, rank):
        if cuda.grid(1) == 0:
            shape[0] = rank
            shape[1] = 10 ** 6

    monkeypatch.setattr(generators, "nonzero_offsets_kernel", too_many)
    with engine.create_execution_context() as context:
        with pytest.raises(PlugrtError, match=r"nonzero.*reported output shapes \[\[1, 1000000\]\], outside the "
                                              r"bounds \[\[1, 9\]\].*the plugin is at fault"):
            context.execute(_masked_feeds(rng, 3))


def test_batch_buckets_are_refused_for_data_dependent_layers():
    """Padded rows would change a data-dependent output's size: no padding, an error."""
    engine = _build(masked_gather_model(), OptimizationProfile().set_shape("x", (1, 3), (3, 3), (5, 3)))
    with pytest.raises(PlugrtError, match="batch buckets: the engine has data-dependent layers .*nonzero"):
        engine.create_execution_context(batch_buckets=[2, 4])


def test_the_layer_profile_goes_past_a_data_dependent_layer(rng):
    from plugrt.layer_profile import profile_layers

    engine = _build(masked_gather_model(), OptimizationProfile().set_shape("x", (1, 3), (3, 3), (5, 3)))
    rows = profile_layers(engine, _masked_feeds(rng, 4), runs=2)
    names = [row.name for row in rows]
    assert "nonzero" in names and names.index("nonzero") < len(names) - 1, names  # the layers after it too
    assert {engine.graph.nodes[layer.node_index].name for layer in engine.layers if layer.alias is None} <= set(names)
