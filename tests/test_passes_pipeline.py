"""The pass pipeline: order, plugin passes (priority, conflicts, disabling), validation
after every pass, and the log of node counts."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper

from plugrt import hookimpl
from plugrt.errors import PlugrtError
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize, pipeline
from plugrt.passes.pattern import Rule, capture, op, rewrite_matches
from plugrt.plugin import GraphPass, OpPlugin, TensorInfo
from plugrt.reference import ReferenceExecutor
from plugrt.registry import Registry


class Swish(OpPlugin):
    op_type = "Swish"
    domain = "com.example"

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        return [x / (1 + np.exp(-x))]


SWISH = op("Mul", capture("x"), op("Sigmoid", capture("x")), commutative=True)


def swish_pass(tag: str, calls: list):
    """A plugin pass as a third party writes one: a pattern rule rewriting to its own op."""
    rule = Rule("swish", SWISH, lambda graph, registry, match: match.fused(
        registry, "Swish", [match.values["x"]], opset=1, domain="com.example"))

    def run(graph, registry):
        calls.append(tag)
        return rewrite_matches(graph, registry, [rule])
    return run


def registry_with(*passes) -> Registry:
    registry = Registry.load()

    class Plugin:
        @hookimpl
        def plugrt_ops(self):
            return [Swish()]

        @hookimpl
        def plugrt_passes(self):
            return list(passes)

    registry.register(Plugin(), name="swish-plugin", distribution="plugrt-swish", version="1")
    return registry


def swish_model():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Mul", ["x", "s"], ["m"], name="mul"),
             helper.make_node("Identity", ["m"], ["i"], name="id"), helper.make_node("Neg", ["i"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "swish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def test_plugin_passes_run_by_priority_between_core_patterns_and_fusion(rng):
    calls: list = []
    registry = registry_with(GraphPass("late", swish_pass("late", calls), priority=200),
                             GraphPass("early", swish_pass("early", calls), priority=10))
    names = [entry.name for entry in pipeline(registry)]
    # the built-ins' recognizers are plugin passes too: priority, then plugin name, orders them all
    assert names.index("builtin-normalization:fuse_layernorm") < names.index("swish-plugin:early") \
        < names.index("builtin-activation:fuse_gelu") < names.index("swish-plugin:late") < names.index("fuse_epilogues")
    graph = import_model(swish_model(), registry=registry)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    want = ReferenceExecutor(graph, registry).run({"x": x})["y"]
    results = optimize(graph, registry, fusion=True)
    assert calls == ["early", "late"]
    by_name = {r.name: r for r in results}
    assert by_name["swish-plugin:early"].rewrites == 1 and by_name["swish-plugin:late"].rewrites == 0
    assert [n.op_type for n in graph.nodes] == ["Swish", "Neg"]  # the Identity went first
    np.testing.assert_allclose(ReferenceExecutor(graph, registry).run({"x": x})["y"], want, rtol=1e-6)


def test_disabling_a_plugin_pass_and_no_fusion(rng):
    calls: list = []
    registry = registry_with(GraphPass("swish", swish_pass("swish", calls)))
    graph = import_model(swish_model(), registry=registry)
    optimize(graph, registry, disabled={"swish-plugin:swish"})
    assert calls == [] and "Swish" not in [n.op_type for n in graph.nodes]
    graph = import_model(swish_model(), registry=registry)
    optimize(graph, registry, fusion=False)
    assert calls == [] and [n.op_type for n in graph.nodes] == ["Sigmoid", "Mul", "Neg"]
    graph = import_model(swish_model(), registry=registry)
    optimize(graph, registry, disabled={"swish", "fuse_gelu"})  # bare names of plugins' passes, each unique
    assert calls == [] and "Swish" not in [n.op_type for n in graph.nodes]
    with pytest.raises(PlugrtError, match="no such pass"):
        optimize(graph, registry, disabled={"swish-plugin:no_such_pass"})


def test_a_bare_pass_name_two_plugins_share_is_refused(rng):
    calls: list = []
    registry = registry_with(GraphPass("fuse_gelu", swish_pass("other", calls)))
    graph = import_model(swish_model(), registry=registry)
    with pytest.raises(PlugrtError, match="no such pass.*builtin-activation:fuse_gelu.*swish-plugin:fuse_gelu"):
        optimize(graph, registry, disabled={"fuse_gelu"})


def test_a_pass_that_breaks_the_graph_is_named():
    def breaks(graph, registry):
        graph.nodes = graph.nodes[1:]  # drops the producer of a value others read
        return 1

    registry = registry_with(GraphPass("breaker", breaks))
    graph = import_model(swish_model(), registry=registry)
    with pytest.raises(PlugrtError, match="swish-plugin:breaker.*invalid graph.*--disable-pass"):
        optimize(graph, registry)


def test_each_pass_is_logged_with_node_counts(caplog):
    registry = Registry.load()
    graph = import_model(swish_model(), registry=registry)
    with caplog.at_level(logging.INFO, logger="plugrt.passes"):
        optimize(graph, registry)
    lines = [r.getMessage() for r in caplog.records]
    assert any("remove_noops" in line and "4 ->    3 nodes" in line for line in lines), lines
    assert any("fuse_swish" in line and "3 ->    2 nodes" in line for line in lines), lines  # x * Sigmoid(x)
    assert any("fuse_pointwise" in line and "2 ->    1 nodes" in line for line in lines), lines
