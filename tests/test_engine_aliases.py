"""Layout layers cost nothing: Reshape, Flatten, Squeeze, Unsqueeze and Identity run as
aliases (no kernel, no copy) between compute layers, next to engine inputs, engine outputs
and weights, at several shapes, through a plan file (:mod:`plugrt.engine.aliases`)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.cli import main
from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile
from plugrt.engine import aliases as alias_rules
from plugrt.engine.memory import liveness
from plugrt.engine.specialization import _address
from plugrt.errors import PlanError, PluginError
from plugrt.ir.specialize import concretize
from plugrt.layer_profile import profile_layers
from plugrt.plugin import TensorInfo
from test_plan_validation import edited

LAYOUT_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
C = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)


def _i64(*values):
    return np.array(values, np.int64)


def chain_model():
    """x[N,2,6]: a Reshape of the input, a Relu, a chain Unsqueeze -> Identity -> Squeeze ->
    Reshape, Exp * c, a Flatten, a Sub reading the chain's middle late; outputs: a Reshape
    of the Sub (yo), another (y2), a Flatten of the input (z)."""
    nodes = [
        helper.make_node("Reshape", ["x", "s12"], ["xr"], name="reshape_input"),
        helper.make_node("Relu", ["xr"], ["h"], name="relu"),
        helper.make_node("Unsqueeze", ["h", "ax1"], ["u"], name="unsqueeze"),
        helper.make_node("Identity", ["u"], ["i"], name="identity"),
        helper.make_node("Squeeze", ["i", "ax1"], ["s"], name="squeeze"),
        helper.make_node("Reshape", ["s", "s34"], ["r"], name="reshape_mid"),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
        helper.make_node("Mul", ["e", "c"], ["m"], name="mul"),
        helper.make_node("Flatten", ["m"], ["fm"], axis=1, name="flatten"),
        helper.make_node("Sub", ["fm", "s"], ["y"], name="sub"),
        helper.make_node("Reshape", ["y", "s26"], ["yo"], name="reshape_out"),
        helper.make_node("Reshape", ["y", "flat"], ["y2"], name="reshape_out2"),
        helper.make_node("Flatten", ["x"], ["z"], axis=1, name="flatten_input"),
    ]
    inits = [numpy_helper.from_array(_i64(0, 12), "s12"), numpy_helper.from_array(_i64(1), "ax1"),
             numpy_helper.from_array(_i64(0, 3, 4), "s34"), numpy_helper.from_array(_i64(0, 2, 6), "s26"),
             numpy_helper.from_array(_i64(-1), "flat"), numpy_helper.from_array(C, "c")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("yo", "y2", "z")]
    graph = helper.make_graph(nodes, "aliases", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6])],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _config(low=1, opt=2, high=3, disabled=("simplify_pairs", "remove_noops", "sink_reshapes")):
    config = BuilderConfig(progress=False)
    config.disabled_passes = set(disabled)  # keep the chain as the model has it
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (low, 2, 6), (opt, 2, 6), (high, 2, 6)))
    return config


@pytest.fixture(scope="module")
def engine():
    return Builder().build_engine(chain_model(), _config())


def _onnxruntime(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _check(engine, model, rng, batches=(2,), context=None):
    context = context or engine.create_execution_context()
    for n in batches:
        x = rng.standard_normal((n, 2, 6)).astype(np.float32)
        got = context.execute({"x": x})
        for name, want in _onnxruntime(model, {"x": x}).items():
            assert got[name].shape == want.shape, name
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    return context


def _layers(engine):
    return {layer["name"]: layer for layer in engine.inspect()["layers"]}


def test_layout_layers_run_as_aliases_and_launch_nothing(engine, rng):
    layers = _layers(engine)
    aliases = {name: layer["alias"] for name, layer in layers.items() if layer["alias"] is not None}
    assert aliases == {"reshape_input": "x", "unsqueeze": "h", "identity": "u", "squeeze": "i",
                       "reshape_mid": "s", "flatten": "m", "reshape_out": "y"}
    assert all(layers[name]["tactic"] is None and layers[name]["op"] in LAYOUT_OPS for name in aliases)
    # engine outputs that cannot take their root's buffer over copy: one over the input,
    # one over a buffer another output took already
    assert layers["flatten_input"]["tactic"] == "copy" and layers["reshape_out2"]["tactic"] == "copy"
    context = _check(engine, chain_model(), rng)
    spec = context.current
    launched = [name for name, _, _ in spec.layer_launches]
    assert not set(launched) & set(aliases)
    assert len(spec.launches) == sum(end - start for _, start, end in spec.layer_launches)
    assert len(launched) == len(layers) - len(aliases)
    # no arena bytes of their own, and the same addresses as their owners
    assert not set(engine.offsets) & {"xr", "u", "i", "s", "r", "fm", "y"}

    def address(name):
        return _address(spec._tensor(context, name))

    assert address("xr") == _address(spec.io["x"])  # an input binding's bytes
    assert address("u") == address("i") == address("s") == address("r") == address("h")
    assert address("fm") == address("m")
    assert address("y") == _address(spec.io["yo"])  # the Sub writes into the output binding
    assert address("y2") == _address(spec.io["y2"]) != address("y")


def test_two_shapes_in_one_context_and_the_plan_round_trip(engine, rng, tmp_path):
    context = _check(engine, chain_model(), rng, batches=(1, 3, 2))
    plan = tmp_path / "aliases.plan"
    engine.save(str(plan))
    loaded = Engine.load(str(plan))
    assert [layer.alias for layer in loaded.layers] == [layer.alias for layer in engine.layers]
    assert loaded.offsets == engine.offsets and loaded.arena_bytes == engine.arena_bytes
    other = _check(loaded, chain_model(), rng, batches=(3, 1))
    x = rng.standard_normal((3, 2, 6)).astype(np.float32)
    first, again = context.execute({"x": x}), other.execute({"x": x})
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])


def test_inspect_and_the_profile_show_aliases(engine, tmp_path, capsys):
    plan = tmp_path / "aliases.plan"
    engine.save(str(plan))
    assert main(["inspect", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "7 of them aliases" in out and "alias of h" in out
    assert main(["inspect", str(plan), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sum(layer["alias"] is not None for layer in report["layers"]) == 7
    x = np.ones((2, 2, 6), np.float32)
    rows = profile_layers(engine, {"x": x}, runs=1)
    kernels = [layer["name"] for layer in report["layers"] if layer["alias"] is None]
    assert [row.name for row in rows] == kernels and len(kernels) == len(report["layers"]) - 7
    assert all(row.kernels >= 1 for row in rows)


@pytest.mark.skipif(simulated(), reason="CUDA graphs and in-place bindings need a GPU")
def test_bindings_in_place_and_graph_replays_move_the_aliases_too(engine, rng):
    """The caller's input and output buffers bound in place, a CUDA graph patched run to
    run: the Relu reads the caller's input through the Reshape, the Sub writes the
    caller's yo through the Reshape, the copies read them."""
    from numba import cuda

    with engine.create_execution_context() as context:
        for _ in range(4):
            x = rng.standard_normal((2, 2, 6)).astype(np.float32)
            feed = cuda.to_device(x)
            outs = {"yo": cuda.device_array((2, 2, 6), np.float32), "y2": cuda.device_array((24,), np.float32),
                    "z": cuda.device_array((2, 12), np.float32)}
            context.execute_async({"x": feed}, outputs=outs)
            context.stream.synchronize()
            for name, want in _onnxruntime(chain_model(), {"x": x}).items():
                np.testing.assert_allclose(outs[name].copy_to_host(), want, rtol=1e-5, atol=1e-6, err_msg=name)
        spec = context.current
        assert spec.cuda_graph is not None and spec.in_place == {"yo", "y2", "z"}
        assert spec.bound["x"] == feed.__cuda_array_interface__["data"][0]
        assert spec.bound["yo"] == outs["yo"].__cuda_array_interface__["data"][0]


def test_memory_plan_keeps_a_root_alive_for_its_aliases(engine, registry):
    graph = concretize(engine.graph, {"x": (3, 2, 6)}, registry)
    nodes = [layer.node_index for layer in engine.layers]
    shared = alias_rules.storage(graph, {layer.node_index: layer.alias for layer in engine.layers
                                         if layer.alias is not None}, nodes)
    assert shared["s"] == "h" and shared["xr"] == "x" and shared["y"] == "yo" and "y2" not in shared
    sizes, lifetimes = liveness(graph, nodes, shared)
    position = {graph.nodes[index].name: k + 1 for k, index in enumerate(nodes)}
    assert "s" not in sizes and "y" not in sizes
    assert lifetimes["h"] == (position["relu"], position["sub"])  # the Sub reads s, a view of h
    assert lifetimes["yo"][0] == position["sub"]  # the Sub writes the output binding


def test_alias_of_a_weight_and_an_output_over_a_weight(rng):
    """A weight too large for inference to compute (> 32768 elements) reshaped on the device:
    an alias of the weight for the MatMul; a copy for the engine output."""
    w = rng.standard_normal((64, 520)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["w", "shape"], ["wr"], name="reshape_weight"),
             helper.make_node("MatMul", ["x", "wr"], ["y"], name="matmul"),
             helper.make_node("Flatten", ["w"], ["wo"], axis=0, name="flatten_weight")]
    graph = helper.make_graph(nodes, "weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 520])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "wo")],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(_i64(520, 64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False)
    config.disabled_passes = {"fold_constants"}
    engine = Builder().build_engine(model, config)
    layers = _layers(engine)
    assert layers["reshape_weight"]["alias"] == "w" and layers["flatten_weight"]["tactic"] == "copy"
    x = rng.standard_normal((1, 520)).astype(np.float32)
    context = engine.create_execution_context()
    got = context.execute({"x": x})
    np.testing.assert_allclose(got["y"], x @ w.reshape(520, 64), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got["wo"], w.reshape(1, -1))
    assert _address(context.current._tensor(context, "wr")) == _address(context.weights["w"])
    loaded = Engine.deserialize(engine.serialize())
    np.testing.assert_array_equal(loaded.create_execution_context().execute({"x": x})["y"], got["y"])


def test_default_passes_leave_aliases_too(rng):
    """With every pass on (the Identity goes as a no-op) the layout layers left still run
    as aliases."""
    model = chain_model()
    engine = Builder().build_engine(model, _config(disabled=()))
    layers = _layers(engine)
    kept = [layer for layer in layers.values() if layer["op"] in LAYOUT_OPS]
    assert kept and all(layer["alias"] is not None or layer["name"] in {"reshape_out2", "flatten_input"}
                        for layer in kept)
    _check(engine, model, rng, batches=(1, 3))


# ---------------------------------------------------------------------- plans that disagree


def _layer(header, name):
    nodes = header["graph"]["nodes"]
    return next(layer for layer in header["layers"] if nodes[layer["node_index"]]["name"] == name)


def test_a_plan_aliasing_what_may_not_be_aliased_is_refused(engine):
    plan = engine.serialize()

    def alias_copy(header):  # an engine output over an engine input
        layer = _layer(header, "flatten_input")
        layer.update(alias=0, tactic={"name": "alias", "params": {}}, workspace_bytes=0, time_ms=None,
                     runner_up=None)

    with pytest.raises(PlanError, match=r"alias.*cannot take over"):
        Engine.deserialize(edited(plan, alias_copy))

    def alias_relu(header):
        _layer(header, "relu").update(alias=0, tactic={"name": "alias", "params": {}}, workspace_bytes=0, time_ms=None,
                                      runner_up=None)  # a GPU build timed it: an alias records no timing

    with pytest.raises(PlanError, match=r"recorded as an alias of input 0, but its plugin .* runs it as no alias"):
        Engine.deserialize(edited(plan, alias_relu))

    def alias_with_tactic(header):
        _layer(header, "unsqueeze")["tactic"] = {"name": "copy", "params": {}}

    with pytest.raises(PlanError, match=r"tactic must be .*alias"):
        Engine.deserialize(edited(plan, alias_with_tactic))


def test_a_plan_that_copies_instead_still_loads(monkeypatch, rng):
    """A plan built before aliases (every layout layer a copy kernel) loads and runs."""
    from plugrt.engine import builder

    monkeypatch.setattr(builder, "choose_all", lambda graphs, registry, nodes: {})
    old = Builder().build_engine(chain_model(), _config())
    assert all(layer.alias is None for layer in old.layers)
    monkeypatch.undo()
    loaded = Engine.deserialize(old.serialize())
    assert _layers(loaded)["unsqueeze"]["tactic"] == "copy"
    _check(loaded, chain_model(), rng, batches=(2, 1))


# ---------------------------------------------------------------------- the plugin hook


def test_the_layout_ops_say_they_alias(registry):
    from plugrt.ir.graph import Node

    x = TensorInfo(np.dtype(np.float32), (2, 3))
    for op_type in LAYOUT_OPS:
        node = Node("n", op_type, "", ("x",), ("y",), opset=17)
        assert registry.op(node).aliases(node, [x]) == 0
    for op_type in ("Relu", "Transpose", "Expand"):
        node = Node("n", op_type, "", ("x",), ("y",), {"perm": None} if op_type == "Transpose" else {}, opset=17)
        assert registry.op(node).aliases(node, [x]) is None


class _Lying:
    def __init__(self, answer):
        self.answer = answer

    def op(self, node):
        answer = self.answer

        class Op:
            def aliases(self, node, inputs):
                return answer

        return Op()


@pytest.mark.parametrize("answer, message", [(3, "not the index of an input"), (True, "not the index"),
                                             (0, "hold 12 and 6 elements")])
def test_a_plugin_that_lies_about_aliasing_is_named(engine, registry, answer, message):
    graph = concretize(engine.graph, {"x": (1, 2, 6)}, registry)
    node = next(n for n in graph.nodes if n.name == "reshape_out")
    graph.values["y"].info = TensorInfo(np.dtype(np.float32), (1, 6))  # 6 elements where yo has 12
    with pytest.raises(PluginError, match=message):
        alias_rules.asked(graph, _Lying(answer), node)


@pytest.mark.parametrize("shape, perm, aliased", [
    ((2, 1, 1, 5), (0, 3, 1, 2), True),   # channels-last global pooling back to NCHW
    ((2, 1, 4, 5), (0, 2, 1, 3), True),   # a unit axis moved past another
    ((2, 2, 1, 5), (0, 3, 1, 2), False),  # 5 moves ahead of 2: a real transpose
    ((2, 3, 4, 5), (0, 1, 2, 3), True),   # (the identity: removed before, or an alias)
])
def test_a_transpose_moving_only_unit_axes_is_an_alias(rng, shape, perm, aliased):
    """Relu -> Transpose -> Relu over a dynamic batch: where the permutation moves only axes
    of size 1, the Transpose launches nothing, and the engine matches onnxruntime at every
    batch of the profile."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu_in"),
             helper.make_node("Transpose", ["h"], ["t"], perm=list(perm), name="transpose"),
             helper.make_node("Relu", ["t"], ["y"], name="relu_out")]
    graph = helper.make_graph(nodes, "transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["N", *shape[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False)
    config.disabled_passes = {"remove_noops"}
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, *shape[1:]), shape, (3, *shape[1:])))
    built = Builder().build_engine(model, config)
    layers = _layers(built)
    assert (layers["transpose"]["alias"] == "h") is aliased, layers["transpose"]
    context = built.create_execution_context()
    for n in (1, 3):
        x = rng.standard_normal((n, *shape[1:])).astype(np.float32)
        np.testing.assert_array_equal(context.execute({"x": x})["y"], _onnxruntime(model, {"x": x})["y"])
