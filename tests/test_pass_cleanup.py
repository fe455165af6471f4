"""The cleanup passes: constant folding, no-op removal, layout pairs, common subexpressions,
dead code. Each rewrite is checked numerically (reference outputs before and after on
fresh random inputs) and by the node count going down; negative cases change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt import hookimpl
from plugrt.ir.graph import Node
from plugrt.onnx.importer import import_model
from plugrt.passes import eliminate_common_subexpressions, eliminate_dead_code, fold_constants, remove_noops
from plugrt.plugin import OpPlugin, TensorInfo
from plugrt.reference import ReferenceExecutor
from plugrt.registry import Registry
from plugrt_builtin_ops.shape import simplify_pairs
from plugrt.testing import check_pass, random_feeds

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs=("y",), consts=None, opset=17):
    """``inputs``: name -> shape (float32; a shape may hold symbol names); ``consts``: name -> array."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in (consts or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _node(op, inputs, outputs, name=None, **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=name or outputs[0], **attrs)


def _ops(graph):
    return [n.op_type for n in graph.nodes]


def _i64(*values):
    return np.array(values, dtype=np.int64)


def _weights(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------- fold_constants


def test_fold_constants_weight_transpose_and_shape_computation(rng):
    nodes = [
        _node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        _node("MatMul", ["x", "wt"], ["h"]),
        _node("Shape", ["h"], ["s"]),
        _node("Gather", ["s", "zero"], ["batch"], axis=0),
        _node("Unsqueeze", ["batch", "axes"], ["b1"]),
        _node("Concat", ["b1", "minus1"], ["target"], axis=0),
        _node("Reshape", ["h", "target"], ["y"]),
    ]
    consts = {"w": _weights(rng, 6, 4), "zero": np.array(0, np.int64), "axes": _i64(0), "minus1": _i64(-1)}
    before, after = check_pass(_model(nodes, {"x": [2, 3, 4]}, consts=consts), fold_constants.run)
    assert len(after.nodes) < len(before.nodes)
    assert _ops(after) == ["MatMul", "Reshape"]
    np.testing.assert_array_equal(after.values["wt"].const, consts["w"].T)
    np.testing.assert_array_equal(after.values["target"].const, _i64(2, -1))


def test_fold_constants_graph_output_becomes_an_initializer_of_the_same_name(rng, registry):
    nodes = [_node("Add", ["a", "b"], ["c"]), _node("Relu", ["x"], ["y"])]
    consts = {"a": _weights(rng, 3), "b": _weights(rng, 3)}
    before, after = check_pass(_model(nodes, {"x": [3]}, outputs=("y", "c"), consts=consts), fold_constants.run)
    assert _ops(after) == ["Relu"] and after.outputs == ["y", "c"]
    np.testing.assert_allclose(after.values["c"].const, consts["a"] + consts["b"])
    assert after.info("c").value is not None  # what the engine returns as a host value


def test_fold_constants_constant_nodes_and_chains(rng):
    value = numpy_helper.from_array(_weights(rng, 2, 3), "v")
    nodes = [_node("Constant", [], ["k"], value=value), _node("Neg", ["k"], ["nk"]), _node("Mul", ["x", "nk"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [2, 3]}), fold_constants.run)
    assert _ops(after) == ["Mul"]


def test_fold_constants_keeps_scalar_constants_scalar(rng):
    """As the TorchScript exporter writes x.view(N, heads, -1): scalar Constant indices into a
    dynamic shape, Unsqueeze, Concat. A folded 0-d constant must stay 0-d."""
    nodes = [_node("Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64))),
             _node("Constant", [], ["axes"], value=numpy_helper.from_array(_i64(0))),
             _node("Shape", ["x"], ["s"]), _node("Gather", ["s", "i0"], ["n"], axis=0),
             _node("Unsqueeze", ["n", "axes"], ["n1"]), _node("Concat", ["n1", "tail"], ["shape"], axis=0),
             _node("Reshape", ["x", "shape"], ["y"])]
    model = _model(nodes, {"x": ["N", 4, 3]}, consts={"tail": _i64(2, 6)})
    graph = import_model(model)
    before = len(graph.nodes)
    fold_constants.run(graph, Registry.load())
    assert graph.values["i0"].const.shape == () and len(graph.nodes) == before - 2
    from plugrt.ir.specialize import concretize

    concrete = concretize(graph, {"x": (5, 4, 3)}, Registry.load())
    assert concrete.info("y").shape == (5, 2, 6)


def test_fold_constants_keeps_a_constant_of_shape_beyond_the_limit():
    big = fold_constants.FOLDING_LIMIT * 2
    fill = numpy_helper.from_array(np.array([1.0], np.float32), "fill")
    nodes = [_node("ConstantOfShape", ["shape"], ["ones"], value=fill), _node("ReduceSum", ["ones"], ["total"]),
             _node("Add", ["x", "total"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [1]}, consts={"shape": _i64(big)}), fold_constants.run)
    assert _ops(after) == ["ConstantOfShape", "ReduceSum", "Add"]


def test_fold_constants_allows_outputs_as_large_as_the_inputs(monkeypatch, rng):
    monkeypatch.setattr(fold_constants, "FOLDING_LIMIT", 4)
    nodes = [_node("Transpose", ["w"], ["wt"], perm=[1, 0]), _node("MatMul", ["x", "wt"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [2, 6]}, consts={"w": _weights(rng, 5, 6)}), fold_constants.run)
    assert _ops(after) == ["MatMul"]
    nodes = [_node("Expand", ["w", "shape"], ["big"]), _node("Add", ["x", "big"], ["y"])]
    model = _model(nodes, {"x": [4, 6]}, consts={"w": _weights(rng, 1, 6), "shape": _i64(4, 6)})
    before, after = check_pass(model, fold_constants.run)
    assert _ops(after) == ["Expand", "Add"]  # 24 elements out of 8 in


class Noise(OpPlugin):
    """A random op (its output differs per call): never folded, its value never propagated."""

    domain = "test.random"
    op_type = "Noise"
    foldable = False
    calls = 0

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        Noise.calls += 1
        return [inputs[0] + np.float32(Noise.calls)]


class NoisePlugin:
    @hookimpl
    def plugrt_ops(self):
        return [Noise()]


@pytest.fixture(scope="module")
def noise_registry():
    registry = Registry.load()
    registry.register(NoisePlugin(), name="test-noise")
    return registry


def _noise_model(rng):
    nodes = [helper.make_node("Noise", ["w"], ["n"], domain="test.random", name="noise"),
             _node("Add", ["x", "n"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [3])],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[numpy_helper.from_array(_weights(rng, 3), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.random", 1)])


def test_non_foldable_random_op_is_neither_folded_nor_propagated(noise_registry, rng):
    graph = import_model(_noise_model(rng), registry=noise_registry)
    assert graph.info("n").value is None
    assert fold_constants.run(graph, noise_registry) == 0
    assert _ops(graph) == ["Noise", "Add"]


def test_no_builtin_op_is_random(registry):
    # There are no RandomNormal/RandomUniform/Bernoulli/Multinomial built-ins (yet), so
    # every built-in may fold but DequantizeLinear, which keeps an INT8 weight INT8 for the
    # quantize passes (they fold the DQs left over); a random op added later must set
    # foldable = False.
    assert {op.op_type for op in registry.ops() if not op.foldable} == {"DequantizeLinear"}
    assert not {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                "Multinomial"} & registry.op_types()


# ---------------------------------------------------------------------------------- remove_noops


def test_remove_noops_identity_dropout_reshape_cast_transpose():
    nodes = [
        _node("Identity", ["x"], ["a"]),
        _node("Dropout", ["a"], ["b", "mask"]),
        _node("Reshape", ["b", "same"], ["c"]),
        _node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
        _node("Transpose", ["d"], ["e"], perm=[0, 1, 2]),
        _node("Relu", ["e"], ["y"]),
    ]
    model = _model(nodes, {"x": [2, 3, 4]}, consts={"same": _i64(2, 3, -1)})
    before, after = check_pass(model, remove_noops.run)
    assert _ops(after) == ["Relu"] and after.nodes[0].inputs == ("x",)


def test_remove_noops_identity_to_graph_output_renames_the_producer():
    nodes = [_node("Relu", ["x"], ["r"]), _node("Identity", ["r"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [4]}), remove_noops.run)
    assert _ops(after) == ["Relu"] and after.nodes[0].outputs == ("y",)


def test_remove_noops_keeps_identity_from_graph_input_to_graph_output():
    nodes = [_node("Identity", ["x"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [4]}), remove_noops.run)
    assert _ops(after) == ["Identity"]


def test_remove_noops_keeps_dropout_whose_mask_is_used_and_real_reshapes():
    nodes = [_node("Dropout", ["x"], ["a", "mask"]), _node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             _node("Mul", ["a", "m"], ["p"]), _node("Reshape", ["p", "flat"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [2, 3]}, consts={"flat": _i64(-1)}), remove_noops.run)
    assert _ops(after) == _ops(before)


def test_forwards_hooks(registry):
    def forwards(op_type, inputs, attrs=None, n_outputs=1, opset=17):
        node = Node("n", op_type, "", tuple(f"i{k}" for k in range(len(inputs))),
                    tuple(f"o{k}" for k in range(n_outputs)), {}, opset)
        op = registry.op(node)
        full = {a.name: a.default for a in op.attributes}
        full.update(attrs or {})
        return op.forwards(node.replace(attrs=full), inputs)

    x = TensorInfo(np.float32, ("N", 3, 4))
    const = TensorInfo.of
    assert forwards("Identity", [x]) == 0
    assert forwards("Dropout", [x], n_outputs=2) == 0
    assert forwards("Dropout", [x, const(np.float32(0.5)), const(np.array(False))]) == 0
    assert forwards("Dropout", [x, const(np.float32(0.5)), TensorInfo(np.bool_, ())]) is None
    assert forwards("Reshape", [x, const(_i64(0, 3, -1))]) == 0
    assert forwards("Reshape", [x, const(_i64(0, 12))]) is None
    assert forwards("Reshape", [x, TensorInfo(np.int64, (3,))]) is None
    assert forwards("Flatten", [TensorInfo(np.float32, ("N", 3))]) == 0
    assert forwards("Squeeze", [TensorInfo(np.float32, (1, 3)), const(_i64(0))]) is None
    assert forwards("Squeeze", [x]) is None  # a symbolic dim may be 1 at run time
    assert forwards("Squeeze", [TensorInfo(np.float32, (2, 3))]) == 0
    assert forwards("Unsqueeze", [x, const(_i64(0))]) is None
    assert forwards("Expand", [x, const(_i64(1, 4))]) == 0
    assert forwards("Expand", [x, const(_i64(2, 1, 1, 1))]) is None
    assert forwards("Transpose", [x], {"perm": [0, 1, 2]}) == 0
    assert forwards("Transpose", [x]) is None
    assert forwards("Cast", [x], {"to": TensorProto.FLOAT}) == 0
    assert forwards("Cast", [x], {"to": TensorProto.FLOAT16}) is None
    assert forwards("CastLike", [x, TensorInfo(np.float32, ())]) == 0
    assert forwards("Concat", [x], {"axis": 0}) == 0
    assert forwards("Concat", [x, x], {"axis": 0}) is None
    assert forwards("Split", [x], {"axis": 1}) == 0
    full = [const(_i64(0)), const(_i64(2**62)), const(_i64(1))]
    assert forwards("Slice", [x] + full) == 0
    assert forwards("Slice", [x, const(_i64(1)), const(_i64(2**62)), const(_i64(1))]) is None
    assert forwards("Slice", [TensorInfo(np.float32, (1, 3)), const(_i64(0)), const(_i64(5)), const(_i64(0)),
                              const(_i64(-1))]) is None  # a reversal keeps the shape
    assert forwards("Tile", [x, const(_i64(1, 1, 1))]) == 0
    assert forwards("Tile", [x, const(_i64(1, 2, 1))]) is None
    assert forwards("Clip", [x]) == 0
    assert forwards("Clip", [x, const(np.float32(0))]) is None
    assert forwards("Clip", [x, None, const(np.float32(np.inf))]) == 0
    assert forwards("Clip", [x], opset=6) == 0
    assert forwards("Clip", [TensorInfo(np.float64, (3,))], opset=6) is None
    assert forwards("Relu", [x]) is None


# ---------------------------------------------------------------------------------- simplify_pairs


def test_simplify_pairs_inverse_transposes_vanish():
    nodes = [_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), _node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
             _node("Relu", ["u"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [2, 3, 4]}), simplify_pairs.run)
    assert _ops(after) == ["Relu"]


def test_simplify_pairs_inverse_transposes_vanish_on_symbolic_shapes():
    nodes = [_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]), _node("Transpose", ["t"], ["u"], perm=[2, 0, 1]),
             _node("Relu", ["u"], ["y"])]
    graph = import_model(_model(nodes, {"x": ["N", 3, 4]}))
    feeds = {"x": np.random.default_rng(1).standard_normal((5, 3, 4)).astype(np.float32)}
    before, after = check_pass(graph, simplify_pairs.run, feeds=feeds)
    assert _ops(after) == ["Relu"]


def test_simplify_pairs_merges_transposes_that_do_not_cancel():
    nodes = [_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]), _node("Transpose", ["t"], ["y"], perm=[0, 2, 1])]
    before, after = check_pass(_model(nodes, {"x": [2, 3, 4]}), simplify_pairs.run)
    assert _ops(after) == ["Transpose"]
    assert list(after.nodes[0].attrs["perm"]) == [1, 0, 2]
    assert after.nodes[0].origin == ("t", "y")


def test_simplify_pairs_reshape_chain_collapses_to_one_reshape():
    nodes = [_node("Flatten", ["x"], ["f"], axis=1), _node("Unsqueeze", ["f", "ax"], ["u"]),
             _node("Reshape", ["u", "s"], ["r"]), _node("Squeeze", ["r", "ax"], ["q"]), _node("Relu", ["q"], ["y"])]
    model = _model(nodes, {"x": [2, 3, 4]}, consts={"ax": _i64(0), "s": _i64(1, 4, 6)})
    before, after = check_pass(model, simplify_pairs.run)
    assert _ops(after) == ["Reshape", "Relu"]
    target = after.values[after.nodes[0].inputs[1]].const
    np.testing.assert_array_equal(target, _i64(4, 6))


def test_simplify_pairs_reshape_chain_back_to_the_input_shape_vanishes():
    nodes = [_node("Reshape", ["x", "s1"], ["r"]), _node("Reshape", ["r", "s2"], ["q"]), _node("Relu", ["q"], ["y"])]
    model = _model(nodes, {"x": [2, 3, 4]}, consts={"s1": _i64(6, 4), "s2": _i64(2, 3, 4)})
    before, after = check_pass(model, simplify_pairs.run)
    assert _ops(after) == ["Relu"]


def test_simplify_pairs_cast_round_trip():
    nodes = [_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE), _node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
             _node("Relu", ["f"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [5]}), simplify_pairs.run)
    assert _ops(after) == ["Relu"]


def test_simplify_pairs_keeps_lossy_cast_round_trip_and_shared_first_nodes():
    nodes = [_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16), _node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)]
    before, after = check_pass(_model(nodes, {"x": [5]}), simplify_pairs.run)
    assert _ops(after) == ["Cast", "Cast"]
    nodes = [_node("Transpose", ["x"], ["t"], perm=[1, 0]), _node("Transpose", ["t"], ["y"], perm=[1, 0]),
             _node("Relu", ["t"], ["z"])]
    before, after = check_pass(_model(nodes, {"x": [2, 3]}, outputs=("y", "z")), simplify_pairs.run)
    assert _ops(after) == _ops(before)


def test_represents():
    assert simplify_pairs.represents(np.dtype("int32"), np.dtype("float64"))
    assert not simplify_pairs.represents(np.dtype("int64"), np.dtype("float64"))  # NumPy calls it safe
    assert not simplify_pairs.represents(np.dtype("float32"), np.dtype("float16"))
    assert simplify_pairs.represents(np.dtype("bool"), np.dtype("float32"))


# ---------------------------------------------------------------------------------- CSE


def test_cse_merges_identical_nodes_and_extends_the_origin():
    nodes = [_node("Relu", ["x"], ["a"], name="r1"), _node("Relu", ["x"], ["b"], name="r2"),
             _node("Transpose", ["a"], ["ta"], perm=[1, 0]), _node("Transpose", ["b"], ["tb"], perm=[1, 0]),
             _node("Add", ["ta", "tb"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [2, 3]}), eliminate_common_subexpressions.run)
    assert _ops(after) == ["Relu", "Transpose", "Add"]
    assert after.nodes[0].origin == ("r1", "r2")
    assert after.nodes[2].inputs == ("ta", "ta")


def test_cse_merges_equal_initializers_and_then_their_readers(rng):
    w = _weights(rng, 3)
    nodes = [_node("Mul", ["x", "w1"], ["a"]), _node("Mul", ["x", "w2"], ["b"]), _node("Sub", ["a", "b"], ["y"])]
    before, after = check_pass(_model(nodes, {"x": [3]}, consts={"w1": w, "w2": w.copy()}),
                               eliminate_common_subexpressions.run)
    assert _ops(after) == ["Mul", "Sub"] and "w2" not in after.values


def test_cse_duplicate_graph_outputs():
    nodes = [_node("Relu", ["x"], ["a"]), _node("Relu", ["x"], ["b"])]
    before, after = check_pass(_model(nodes, {"x": [3]}, outputs=("a", "b")), eliminate_common_subexpressions.run)
    assert _ops(after) == ["Relu", "Relu"]  # two bindings: both stay
    nodes = [_node("Relu", ["x"], ["a"]), _node("Relu", ["x"], ["y"]), _node("Neg", ["a"], ["z"])]
    before, after = check_pass(_model(nodes, {"x": [3]}, outputs=("y", "z")), eliminate_common_subexpressions.run)
    assert _ops(after) == ["Relu", "Neg"]


def test_cse_keeps_nodes_differing_in_one_attribute(rng):
    nodes = [_node("Transpose", ["x"], ["a"], perm=[0, 2, 1]), _node("Transpose", ["x"], ["b"], perm=[2, 1, 0]),
             _node("Flatten", ["a"], ["fa"], axis=1), _node("Flatten", ["b"], ["fb"], axis=2)]
    model = _model(nodes, {"x": [2, 2, 2]}, outputs=("fa", "fb"))
    before, after = check_pass(model, eliminate_common_subexpressions.run)
    assert _ops(after) == _ops(before)


def test_cse_leaves_random_ops_alone(noise_registry, rng):
    model = _noise_model(rng)
    model.graph.node.insert(1, helper.make_node("Noise", ["w"], ["n2"], domain="test.random", name="noise2"))
    model.graph.node[2].input[0] = "n2"
    graph = import_model(model, registry=noise_registry)
    assert eliminate_common_subexpressions.run(graph, noise_registry) == 0


# ---------------------------------------------------------------------------------- DCE


def test_dead_code_removes_unread_nodes_and_initializers(rng):
    nodes = [_node("Relu", ["x"], ["y"]), _node("Mul", ["x", "w"], ["m"]), _node("Neg", ["m"], ["unused"])]
    before, after = check_pass(_model(nodes, {"x": [3]}, consts={"w": _weights(rng, 3), "spare": _weights(rng, 2)}),
                               eliminate_dead_code.run)
    assert _ops(after) == ["Relu"]
    assert "w" not in after.values and "spare" not in after.values and "m" not in after.values


def test_dead_code_keeps_constant_graph_outputs(rng):
    before, after = check_pass(_model([_node("Relu", ["x"], ["y"])], {"x": [3]}, outputs=("y", "c"),
                                      consts={"c": _weights(rng, 2)}), eliminate_dead_code.run)
    assert "c" in after.values and eliminate_dead_code.run(after, None) == 0


# ---------------------------------------------------------------------------------- together


def test_cleanup_pipeline_on_a_small_graph(registry, rng):
    nodes = [
        _node("Identity", ["x"], ["xi"]),
        _node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        _node("MatMul", ["xi", "wt"], ["h"]),
        _node("Transpose", ["h"], ["t1"], perm=[1, 0]),
        _node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
        _node("Relu", ["t2"], ["r1"]),
        _node("Relu", ["t2"], ["r2"]),
        _node("Add", ["r1", "r2"], ["y"]),
        _node("Sigmoid", ["h"], ["dead"]),
    ]
    graph = import_model(_model(nodes, {"x": [2, 4]}, consts={"w": _weights(rng, 5, 4)}))
    feeds = random_feeds(graph)
    want = ReferenceExecutor(graph, registry).run(feeds)
    for module in (fold_constants, remove_noops, simplify_pairs, eliminate_common_subexpressions,
                   eliminate_dead_code):
        module.run(graph, registry)
    assert _ops(graph) == ["MatMul", "Relu", "Add"]
    np.testing.assert_allclose(ReferenceExecutor(graph, registry).run(feeds)["y"], want["y"], rtol=1e-6)


def test_remove_noops_chain_ending_at_a_graph_output():
    nodes = [_node("Relu", ["x"], ["r"]), _node("Identity", ["r"], ["a"]), _node("Dropout", ["a"], ["b"]),
             _node("Identity", ["b"], ["y"]), _node("Neg", ["b"], ["z"])]
    before, after = check_pass(_model(nodes, {"x": [4]}, outputs=("y", "z")), remove_noops.run)
    assert _ops(after) == ["Relu", "Neg"]
    assert after.nodes[0].outputs == ("y",) and after.nodes[1].inputs == ("y",)


def test_simplify_pairs_identity_between_bindings_leaves_one_reshape():
    nodes = [_node("Reshape", ["x", "s1"], ["r"]), _node("Reshape", ["r", "s2"], ["y"])]
    model = _model(nodes, {"x": [2, 3, 4]}, consts={"s1": _i64(6, 4), "s2": _i64(2, 3, 4)})
    before, after = check_pass(model, simplify_pairs.run)
    assert _ops(after) == ["Reshape"] and after.nodes[0].origin == ("r", "y")
