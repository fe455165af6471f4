"""Nodes that are functions (``plugrt.onnx.functions``): a model's local functions (what
``torch.onnx.export(..., export_modules_as_functions=...)`` and onnxscript write) are
inlined, and standard ops ONNX defines as functions that no plugin provides, or that a
plugin declines (Attention at opset 23, what PyTorch's exporter writes for SDPA at that
opset, without the contrib attention plugin), are expanded into the ops they are made of;
built engines match onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt import hookimpl
from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.errors import UnsupportedError
from plugrt.onnx.importer import import_model, support_report
from plugrt.plugin import Attr, OpPlugin, TensorInfo
from plugrt.registry import Registry

FLOAT = TensorProto.FLOAT


def ort(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def matches_over_a_dynamic_batch(model, rng, max_batch: int = 4, registry=None) -> None:
    """Built over batches 1..``max_batch`` (opt 2) of the model's one input, run at 1 and 3
    on fresh random inputs, its first output against onnxruntime's."""
    value, output = model.graph.input[0], model.graph.output[0].name
    rest = tuple(d.dim_value for d in value.type.tensor_type.shape.dim[1:])
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape(value.name, (1, *rest), (2, *rest),
                                                                    (max_batch, *rest)))
    context = Builder(registry).build_engine(model, config).create_execution_context()
    for batch in (1, 3):
        x = rng.standard_normal((batch, *rest)).astype(np.float32)
        np.testing.assert_allclose(context.execute({value.name: x})[output], ort(model, {value.name: x})[0],
                                   rtol=1e-5, atol=1e-5)


def block_function() -> onnx.FunctionProto:
    """``Block(x, w) = x + LeakyRelu(MatMul(x, w), alpha=@slope)``, calling ``Scale`` (a
    second local function) on the result: an attribute reference and a nested call."""
    slope = helper.make_attribute_ref("slope", onnx.AttributeProto.FLOAT)
    leaky = helper.make_node("LeakyRelu", ["h"], ["a"])
    leaky.attribute.append(slope)
    leaky.attribute[0].name = "alpha"
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), leaky, helper.make_node("Add", ["x", "a"], ["s"]),
             helper.make_node("Scale", ["s"], ["y"], domain="my.blocks")]
    return helper.make_function("my.blocks", "Block", ["x", "w"], ["y"], nodes,
                                [helper.make_opsetid("", 17), helper.make_opsetid("my.blocks", 1)], ["slope"])


def scale_function() -> onnx.FunctionProto:
    half = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", FLOAT, [], [0.5]))
    return helper.make_function("my.blocks", "Scale", ["v"], ["y"], [half, helper.make_node("Mul", ["v", "c"], ["y"])],
                                [helper.make_opsetid("", 17)], [])


def with_local_functions(batch="batch") -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32) / 3, n) for n in ("w1", "w2"))
    nodes = [helper.make_node("Block", ["x", "w1"], ["b1"], domain="my.blocks", slope=0.1, name="block1"),
             helper.make_node("Block", ["b1", "w2"], ["y"], domain="my.blocks", slope=0.3, name="block2")]
    graph = helper.make_graph(nodes, "blocks", [helper.make_tensor_value_info("x", FLOAT, [batch, 6])],
                              [helper.make_tensor_value_info("y", FLOAT, [batch, 6])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.blocks", 1)],
                              functions=[block_function(), scale_function()])
    onnx.checker.check_model(model)
    return model


def attention_23(batch="batch") -> onnx.ModelProto:
    """Q, K and V projected from x, split into heads, and the standard ``Attention`` op
    (opset 23, causal), as ``torch.onnx.export(..., opset_version=23)`` writes SDPA."""
    rng = np.random.default_rng(6)
    proj = numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32) / 3, "proj")
    shape = numpy_helper.from_array(np.array([0, 0, 3, 2, 4], np.int64), "heads")
    nodes = [helper.make_node("MatMul", ["x", "proj"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "heads"], ["split"]),
             helper.make_node("Transpose", ["split"], ["t"], perm=[2, 0, 3, 1, 4]),
             helper.make_node("Split", ["t"], ["q5", "k5", "v5"], axis=0, num_outputs=3),
             *[helper.make_node("Squeeze", [f"{n}5", "zero"], [n]) for n in "qkv"],
             helper.make_node("Attention", ["q", "k", "v"], ["a"], is_causal=1, name="sdpa"),
             helper.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", FLOAT, [batch, 5, 8])],
                              [helper.make_tensor_value_info("y", FLOAT, [batch, 5, 2, 4])],
                              [proj, shape, numpy_helper.from_array(np.array([0], np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model)
    return model


def test_local_functions_are_inlined_with_their_attributes_and_nested_calls(rng):
    model = with_local_functions()
    before = model.SerializeToString()
    graph = import_model(model)
    assert model.SerializeToString() == before  # (the caller's model is left as it was)
    assert {node.op_type for node in graph.nodes} >= {"MatMul", "LeakyRelu", "Add", "Mul"}
    slopes = sorted(node.attrs["alpha"] for node in graph.nodes if node.op_type == "LeakyRelu")
    assert slopes == pytest.approx([0.1, 0.3])  # (each call's own attribute)
    matches_over_a_dynamic_batch(model, rng)


def without(plugin: str) -> Registry:
    """The installed plugins less ``plugin``."""
    return Registry.load(allow=[name for name in Registry.load().plugins if name != plugin])


def test_the_standard_attention_op_is_expanded_where_no_plugin_provides_it(rng):
    model, registry = attention_23(), without("contrib-attention")  # (which provides it)
    assert "Attention" not in {node.op_type for node in import_model(model, registry).nodes}
    matches_over_a_dynamic_batch(model, rng, max_batch=3, registry=registry)


class Hamming(OpPlugin):
    """HammingWindow (an ONNX function op) for the periodic window only."""

    op_type, since_opset = "HammingWindow", 17
    attributes = (Attr("periodic", "int", 1), Attr("output_datatype", "int", 1))

    def declines(self, node):
        return None if node.attrs["periodic"] else "symmetric windows"

    def infer(self, node, inputs):
        return [TensorInfo(np.dtype(np.float32), ("n",))]

    def reference(self, node, inputs):
        n = np.arange(int(inputs[0]))
        return [(25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / len(n))).astype(np.float32)]


class HammingPlugin:
    @hookimpl
    def plugrt_ops(self):
        return [Hamming()]


@pytest.mark.parametrize("periodic", [1, 0])
def test_a_plugin_declines_a_function_op_node_it_does_not_implement(periodic):
    """A plugin's ``declines`` leaves a node to the op's ONNX body (here: the symmetric
    window); a node it takes stays one node, its plugin's."""
    registry = Registry.load()
    registry.register(HammingPlugin(), name="test-hamming")
    node = helper.make_node("HammingWindow", ["size"], ["w"], periodic=periodic)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("w", FLOAT, ["n"])],
                              [numpy_helper.from_array(np.array(6, np.int64), "size")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = {node.op_type for node in import_model(model, registry, infer=False).nodes}
    assert ("HammingWindow" in ops) == bool(periodic), ops


def test_check_reports_expanded_nodes_as_supported():
    report = support_report(with_local_functions(2))
    assert report and all(entry["status"] == "supported" for entry in report), report


def test_a_call_to_a_function_the_model_does_not_define_is_reported_by_node():
    model = with_local_functions()
    del model.functions[1]  # (Block calls Scale, now missing)
    with pytest.raises(UnsupportedError) as caught:
        import_model(model)
    assert "op Scale, domain 'my.blocks'" in str(caught.value)


def branchy(batch="batch") -> onnx.ModelProto:
    """``If`` nodes as exporters write them: one on the rank of x's shape (Size of a Shape:
    known at any batch), its then-branch with an initializer of its own and a nested ``If``
    on a constant comparison; one on a dim of x that is static (dim 1)."""
    rng = np.random.default_rng(8)
    w = numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32), "w_then")
    inner_then = helper.make_graph([helper.make_node("Relu", ["m"], ["r"])], "inner_then", [],
                                   [helper.make_tensor_value_info("r", FLOAT, None)])
    inner_else = helper.make_graph([helper.make_node("Neg", ["m"], ["n"])], "inner_else", [],
                                   [helper.make_tensor_value_info("n", FLOAT, None)])
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w_then"], ["m"]),
                              helper.make_node("Less", ["two", "three"], ["small"]),
                              helper.make_node("If", ["small"], ["t"], then_branch=inner_then, else_branch=inner_else)],
                             "then", [], [helper.make_tensor_value_info("t", FLOAT, None)], [w])
    other = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", FLOAT, None)])
    wide = helper.make_graph([helper.make_node("Mul", ["y", "two_f"], ["z1"])], "wide", [],
                             [helper.make_tensor_value_info("z1", FLOAT, None)])
    narrow = helper.make_graph([helper.make_node("Add", ["y", "two_f"], ["z2"])], "narrow", [],
                               [helper.make_tensor_value_info("z2", FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["s"], ["rank"]),
             helper.make_node("Equal", ["rank", "two"], ["is2d"]),
             helper.make_node("If", ["is2d"], ["y"], then_branch=then, else_branch=other, name="on_rank"),
             helper.make_node("Shape", ["x"], ["s1"], start=1, end=2),
             helper.make_node("Greater", ["s1", "two"], ["wide1"]),
             helper.make_node("Squeeze", ["wide1"], ["is_wide"]),
             helper.make_node("If", ["is_wide"], ["z"], then_branch=wide, else_branch=narrow, name="on_dim")]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("two", 2), ("three", 3))]
    consts.append(numpy_helper.from_array(np.array(2.0, np.float32), "two_f"))
    graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", FLOAT, [batch, 3])],
                              [helper.make_tensor_value_info("z", FLOAT, [batch, 3])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_ifs_that_shapes_and_constants_decide_become_their_branch(rng):
    model = branchy()
    graph = import_model(model)
    assert "If" not in {node.op_type for node in graph.nodes}
    assert {"MatMul", "Relu", "Mul"} <= {node.op_type for node in graph.nodes}  # (then, inner then, wide)
    matches_over_a_dynamic_batch(model, rng)


def test_an_if_on_input_values_is_reported_by_node():
    model = branchy()
    node = model.graph.node[3]
    node.input[0] = "flag"
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    with pytest.raises(UnsupportedError) as caught:
        import_model(model)
    assert "node 'on_rank': op If" in str(caught.value) and "depends on input values" in str(caught.value)


@pytest.mark.parametrize("name", ["torch_sdpa_opset23", "torch_module_functions"])
def test_real_exports_with_functions_match_onnxruntime(name, rng):
    """Exported by PyTorch 2.13 (CPU): ``F.scaled_dot_product_attention(q, k, v,
    is_causal=True)`` through ``torch.onnx.export(..., dynamo=True, opset_version=23)``
    (an ``Attention`` node), and two pre-norm MLP blocks through ``torch.onnx.export(...,
    dynamo=False, export_modules_as_functions={Block})`` (two calls of a local function);
    both with a dynamic batch, built over batches 1..4 and run at 1 and 3."""
    import pathlib

    model = onnx.load(pathlib.Path(__file__).resolve().parent / "data" / "exports" / f"{name}.onnx")
    matches_over_a_dynamic_batch(model, rng)


def test_a_large_weight_does_not_stop_an_if_from_folding():
    """The nodes a condition depends on are imported with only the initializers they read
    (a large model's weights are not converted for it); the If still folds beside a large one."""
    model = branchy()
    big = numpy_helper.from_array(np.ones((3, 3, 8000), np.float32), "big")  # (72,000 elements)
    model.graph.initializer.append(big)
    model.graph.node.insert(0, helper.make_node("Shape", ["big"], ["big_shape"]))  # (read, so not dropped)
    assert "If" not in {node.op_type for node in import_model(model).nodes}
