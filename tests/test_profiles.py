"""Several optimization profiles per engine (issue 19, part 1): each tuned at its own opt
shapes, memory planned for the largest of their max shapes, all saved in the plan; a
context runs one at a time (``set_optimization_profile_async``), two contexts of one
engine different ones at once; an input outside the context's profile is refused naming
every profile's range; the CLI's flag trios make profiles, ``run``/``bench`` take
``--profile``. Every run is checked against onnxruntime on fresh random inputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile
from plugrt.errors import BindingError, PlanError, PlugrtError

RTOL, ATOL = 1e-4, 1e-5


def conv_model(seed: int = 0):
    """Conv-Relu, Conv, GlobalAveragePool, Flatten, Gemm over x [batch, 3, 4, 4]."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.standard_normal((4, 3, 3, 3)) / 4, "b1": rng.standard_normal(4) / 4,
             "w2": rng.standard_normal((4, 4, 3, 3)) / 6, "fc": rng.standard_normal((5, 4)) / 3,
             "fcb": rng.standard_normal(5) / 3}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "profiles", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["batch", 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: (min, opt, max) batch of each profile.
BATCHES = [(1, 1, 2), (3, 4, 5), (6, 6, 7)]


def profiles(count: int) -> list[OptimizationProfile]:
    return [OptimizationProfile().set_shape("x", (a, 3, 4, 4), (b, 3, 4, 4), (c, 3, 4, 4)) for a, b, c in BATCHES[:count]]


def build(count: int, model=None, measure=None, **options) -> Engine:
    """An engine of ``count`` profiles (FP32 without TF32 unless ``options`` say otherwise:
    the tests compare with onnxruntime at 1e-4)."""
    config = BuilderConfig(progress=False, **{"tf32": False, **options})
    for profile in profiles(count):
        config.add_optimization_profile(profile)
    return Builder(measure=measure).build_engine(model or conv_model(), config)


def expected(model, x) -> np.ndarray:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def fresh(rng, batch: int) -> np.ndarray:
    return rng.standard_normal((batch, 3, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("count", [2, 3])
def test_an_engine_of_several_profiles_runs_each_and_survives_its_plan(count, rng, tmp_path):
    model = conv_model(count)
    built = build(count, model)
    assert len(built.profiles) == count and len(built.inspect()["profiles"]) == count
    path = tmp_path / "several.plan"
    built.save(str(path))
    for which, engine in enumerate((built, Engine.load(str(path)))):  # each profile's max, then its min
        assert [p.shapes["x"] for p in engine.profiles] == [p.shapes["x"] for p in profiles(count)]
        for index, batches in enumerate(BATCHES[:count]):
            with engine.create_execution_context(profile=index) as context:
                assert context.optimization_profile == index
                for batch in (batches[2 - 2 * which],):
                    x = fresh(rng, batch)
                    np.testing.assert_allclose(context.execute({"x": x})["y"], expected(model, x), RTOL, ATOL)


def test_two_contexts_run_different_profiles_at_once(rng):
    model = conv_model(4)
    engine = build(2, model)
    small, large = engine.create_execution_context(), engine.create_execution_context(profile=1)
    for turn in range(2):  # interleaved: neither context's profile leaks into the other
        xs, xl = fresh(rng, 2 - turn), fresh(rng, 4 + turn)
        ys, yl = small.execute({"x": xs})["y"], large.execute({"x": xl})["y"]
        np.testing.assert_allclose(ys, expected(model, xs), RTOL, ATOL)
        np.testing.assert_allclose(yl, expected(model, xl), RTOL, ATOL)
    small.set_optimization_profile_async(1, small.stream)  # the switch: profile 1's shapes now
    x = fresh(rng, 3)
    np.testing.assert_allclose(small.execute({"x": x})["y"], expected(model, x), RTOL, ATOL)
    with pytest.raises(PlugrtError, match="optimization profile 2: the engine has 2 profile"):
        small.set_optimization_profile_async(2)


def test_an_input_outside_the_contexts_profile_names_every_range():
    engine = build(2)
    context = engine.create_execution_context()
    with pytest.raises(BindingError, match=r"'x': shape \[4, 3, 4, 4\] is outside profile 0.*profile 0: min "
                                           r"\[1, 3, 4, 4\], max \[2, 3, 4, 4\]; profile 1: min \[3, 3, 4, 4\].*"
                                           r"set_optimization_profile_async\(1"):
        context.execute({"x": np.ones((4, 3, 4, 4), np.float32)})
    with pytest.raises(BindingError, match=r"outside profile 0.*rebuild with a profile that covers it"):
        context.execute({"x": np.ones((12, 3, 4, 4), np.float32)})
    with pytest.raises(PlugrtError, match="optimization profile -1"):
        engine.create_execution_context(profile=-1)


def test_each_profile_is_tuned_at_its_own_opt_shapes():
    """A measure under which the tactic whose name sorts first is fastest at batch 1 and
    the one sorting last at batch 4: where a layer has two such tactics, profile 0 and
    profile 1 choose differently, the plan keeps both, and a context of profile 1 runs
    profile 1's."""
    def measure(run):
        batch = run.shapes[run.node.outputs[0]][0]
        order = int.from_bytes(run.tactic.name.encode()[:6].ljust(6, b"\0"), "big") / 2.0 ** 48
        return 1.0 + (order if batch == 1 else 1.0 - order)

    engine = build(2, optimization_level=5, measure=measure)
    varied = [layer for layer in engine.layers if layer.profile_tactics and layer.profile_tactics[0] != layer.tactic]
    assert varied, [(layer.tactic["name"], layer.profile_tactics) for layer in engine.layers]
    reloaded = Engine.deserialize(engine.serialize())
    assert [layer.profile_tactics for layer in reloaded.layers] == [layer.profile_tactics for layer in engine.layers]
    for index in (0, 1):
        with reloaded.create_execution_context(profile=index) as context:
            ran = context.current.tactics
        for layer in varied:
            assert ran[reloaded.graph.nodes[layer.node_index].name] == layer.tactic_for(index)["name"]


def test_a_plan_with_a_bad_profile_tactic_is_refused():
    engine = build(2)
    from plugrt.engine.plan_file import decode_plan, encode_plan

    header, arrays = decode_plan(engine.serialize(), "<bytes>")
    layer = next(entry for entry in header["layers"] if entry.get("profile_tactics"))
    layer["profile_tactics"][0] = {"name": "no_such_tactic", "params": {}}
    with pytest.raises(PlanError, match=r"profile_tactics\[0\].*offers no tactic 'no_such_tactic'"):
        Engine.deserialize(encode_plan(header, arrays))
    layer["profile_tactics"] = []
    with pytest.raises(PlanError, match=r"profile_tactics.*0 tactics for 1 later profiles"):
        Engine.deserialize(encode_plan(header, arrays))


def test_the_cli_builds_profiles_from_flag_trios_and_runs_each(tmp_path, capsys):
    model, plan = tmp_path / "m.onnx", tmp_path / "m.plan"
    onnx.save(conv_model(5), model)
    trios = ["--min-shapes", "x:1x3x4x4", "--opt-shapes", "x:1x3x4x4", "--max-shapes", "x:2x3x4x4",
             "--min-shapes", "x:3x3x4x4", "--opt-shapes", "x:4x3x4x4", "--max-shapes", "x:6x3x4x4"]
    assert main(["build", str(model), "-o", str(plan), "--no-progress", "--no-tf32", *trios]) == 0
    assert [p.shapes["x"][1] for p in Engine.load(str(plan)).profiles] == [(1, 3, 4, 4), (4, 3, 4, 4)]
    capsys.readouterr()
    assert main(["inspect", str(plan)]) == 0
    assert "profile 1 {'min': [3, 3, 4, 4], 'opt': [4, 3, 4, 4], 'max': [6, 3, 4, 4]}" in capsys.readouterr().out
    assert main(["run", str(plan), "--profile", "1", "--compare-onnxruntime", str(model)]) == 0
    assert "y: float32[4, 5]" in capsys.readouterr().out
    report = tmp_path / "bench.json"
    assert main(["bench", str(plan), "--profile", "1", "--shapes", "x:5x3x4x4", "--no-progress",
                 "--json", str(report)]) == 0
    settings = json.loads(report.read_text())["settings"]
    assert settings["shapes"]["x"] == [5, 3, 4, 4] and settings["profile"] == 1
    capsys.readouterr()
    assert main(["run", str(plan), "--profile", "2"]) != 0
    assert "the engine has 2 optimization profile(s)" in capsys.readouterr().err
    assert main(["bench", str(plan), "--shapes", "x:5x3x4x4", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "outside the engine's profile 0" in err and "--profile" in err and "Traceback" not in err
    bad = tmp_path / "bad.plan"
    assert main(["build", str(model), "-o", str(bad), "--no-progress", *trios[:6], "--min-shapes", "x:3x3x4x4"]) != 0
    assert "once per profile, or not at all; got --min-shapes 2, --opt-shapes 1" in capsys.readouterr().err
    assert not bad.exists()


def test_calibration_batches_may_lie_in_any_profile(rng):
    model = conv_model(6)
    batches = [{"x": fresh(rng, 2)}, {"x": fresh(rng, 5)}]  # profile 0's, then profile 1's
    engine = build(2, model, int8=True, calibration_data=batches, accuracy_check=False)
    assert engine.precision["int8"]["layers"] >= 2
    with pytest.raises(PlugrtError, match=r"calibration batch 0: .*outside.*profile"):
        build(2, model, int8=True, calibration_data=[{"x": fresh(rng, 12)}], accuracy_check=False)


def test_bench_replays_a_mix_of_shapes(tmp_path, capsys):
    """``bench --shapes 'A;B'``: each stream's queries cycle through the sets (with and
    without data transfers); inferences count each set's own batch."""
    from plugrt.bench import run_benchmark

    engine = build(2)
    result = run_benchmark(engine, mix=[{"x": (3, 3, 4, 4)}, {"x": (5, 3, 4, 4)}], profile=1, iterations=4)
    assert [s["x"] for s in result.mix] == [(3, 3, 4, 4), (5, 3, 4, 4)] and result.mix_batches == [3, 5]
    assert result.inferences_per_s == pytest.approx(4 * result.queries_per_s)
    quiet = run_benchmark(engine, mix=[{"x": (1, 3, 4, 4)}, {"x": (2, 3, 4, 4)}], iterations=3, duration=0,
                          data_transfers=False)
    assert quiet.queries == 3 and quiet.as_json()["settings"]["mix"] == [{"x": [1, 3, 4, 4]}, {"x": [2, 3, 4, 4]}]
    plan = tmp_path / "m.plan"
    engine.save(str(plan))
    report = tmp_path / "bench.json"
    assert main(["bench", str(plan), "--profile", "1", "--shapes", "x:3x3x4x4;x:4x3x4x4", "--no-progress",
                 "--json", str(report)]) == 0
    assert "shapes x:3x3x4x4 | x:4x3x4x4" in capsys.readouterr().out
    assert json.loads(report.read_text())["settings"]["mix"] == [{"x": [3, 3, 4, 4]}, {"x": [4, 3, 4, 4]}]


def test_batch_buckets_pad_a_request_and_cut_its_outputs(rng):
    """``batch_buckets``: batches 1 and 3 run as 2 and 4 (two shapes for four batch
    sizes), outputs cut back to the request's rows, each row onnxruntime's."""
    model = conv_model(11)
    engine = build(2, model)
    with engine.create_execution_context(profile=1, batch_buckets=[4, 5]) as context:
        for batch in (3, 4, 5, 3):
            x = fresh(rng, batch)
            y = context.execute({"x": x})["y"]
            assert y.shape == (batch, 5)
            np.testing.assert_allclose(y, expected(model, x), RTOL, ATOL)
        assert {key[1][1][0] for key in context._specs} == {4, 5}  # batch 3 ran as 4: no shape of its own
    with pytest.raises(PlugrtError, match=r"batch bucket 8: input 'x' takes batches \(dim 0\) \[3, 5\] in profile 1"):
        engine.create_execution_context(profile=1, batch_buckets=[4, 8])


def test_a_profile_beyond_the_dims_an_export_fixed_is_refused_naming_the_shapes(tmp_path, capsys):
    """A legacy export of nn.MultiheadAttention bakes the traced sequence length into a
    Reshape (x is [batch, seq, 4] with a dynamic seq, the Reshape's target says 3): the
    model runs only at seq 3, as in onnxruntime. A profile over other lengths is refused
    before any pass, naming the profile's shapes and the node; on the CLI without a traceback."""
    nodes = [helper.make_node("Reshape", ["x", "fixed"], ["r"], name="baked_reshape"),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "baked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([-1, 3, 2, 2], np.int64), "fixed")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 2, 4), (2, 3, 4), (4, 3, 4)))
    with pytest.raises(PlugrtError) as caught:
        Builder().build_engine(model, config)
    message = str(caught.value)
    assert "does not run at profile 0's min shapes (x[1,2,4])" in message and "'baked_reshape'" in message, message
    path = tmp_path / "baked.onnx"
    onnx.save(model, path)
    assert main(["build", str(path), "-o", str(tmp_path / "baked.plan"), "--min-shapes", "x:1x2x4",
                 "--opt-shapes", "x:2x3x4", "--max-shapes", "x:4x3x4"]) != 0
    err = capsys.readouterr().err
    assert "does not run at profile 0's min shapes" in err and "Traceback" not in err
    config = BuilderConfig(progress=False, tf32=False)  # (inside the traced size it builds and runs)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 3, 4), (2, 3, 4), (4, 3, 4)))
    x = np.random.default_rng(2).standard_normal((3, 3, 4)).astype(np.float32)
    got = Builder().build_engine(model, config).create_execution_context().execute({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(x.reshape(-1, 3, 2, 2), 0), rtol=1e-6)
