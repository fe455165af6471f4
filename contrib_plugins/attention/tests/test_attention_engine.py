"""End to end: the example encoder layer (exported-transformer form) built into an engine
with the attention fused, against onnxruntime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

ort = pytest.importorskip("onnxruntime")
MAKE_MODELS = Path(__file__).resolve().parents[3] / "examples" / "make_models.py"
QUALIFIED = f"{DOMAIN}::{OP_TYPE}"


def make_encoder():
    if not MAKE_MODELS.exists():
        pytest.skip("examples/make_models.py is not here (the plugin is tested outside the plugrt repository)")
    spec = importlib.util.spec_from_file_location("plugrt_example_models", MAKE_MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.make_encoder()
    model.ir_version = 10  # onnxruntime reads it everywhere the tests run
    return model


def build(model, shape, name="tokens", **config):
    config = BuilderConfig(**config)
    config.add_optimization_profile(OptimizationProfile().set_shape(name, (1, 2, shape[2]), shape, shape))
    return Builder(default_registry()).build_engine(model, config)


def torch_exported_layer(hidden=16, heads=2, seed=0):
    """Self-attention as torch.onnx.export writes BertSelfAttention: per projection a
    Reshape whose target is computed from Shape(x) (so inference names the dims
    ``/Reshape_d0``...: different symbols for Q, K and V, equal only at concrete shapes),
    K's permute then transpose(-1, -2), a Div by sqrt(head size)."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op_type, inputs, name, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [name], name=f"/{name}", **attrs))
        return name

    def heads_target(tag, tail):
        shape = node("Shape", ["x"], f"{tag}/shape")
        dims = [node("Unsqueeze", [node("Gather", [shape, const(f"{tag}/i{i}", np.array(i, np.int64))],
                                        f"{tag}/d{i}"), const(f"{tag}/ax{i}", np.array([0], np.int64))],
                     f"{tag}/u{i}") for i in (0, 1)]
        return node("Concat", dims + [const(f"{tag}/tail", np.array(tail, np.int64))], f"{tag}/target", axis=0)

    def project(tag):
        w = const(f"{tag}/w", (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
        b = const(f"{tag}/b", (0.1 * rng.standard_normal(hidden)).astype(np.float32))
        y = node("Add", [node("MatMul", ["x", w], f"{tag}/matmul"), b], f"{tag}/add")
        return node("Transpose", [node("Reshape", [y, heads_target(tag, [heads, head])], f"{tag}/reshape")],
                    f"{tag}/permute", perm=[0, 2, 1, 3])

    q, k, v = project("query"), project("key"), project("value")
    kt = node("Transpose", [k], "key/transpose", perm=[0, 1, 3, 2])
    scores = node("Div", [node("MatMul", [q, kt], "scores"), const("root", np.array(np.sqrt(head), np.float32))],
                  "scaled")
    context = node("MatMul", [node("Softmax", [scores], "probs", axis=-1), v], "context")
    merged = node("Transpose", [context], "merge", perm=[0, 2, 1, 3])
    node("Reshape", [merged, heads_target("out", [hidden])], "y")
    graph = helper.make_graph(nodes, "bert_self_attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_encoder_engine_fuses_attention_and_matches_onnxruntime(rng):
    model = make_encoder()
    shape = (2, 6, 32)
    engine = build(model, shape, tf32=False)  # fp32 tactics: compared at fp32 tolerance
    layers = engine.inspect()["layers"]
    attention = [layer for layer in layers if layer["op"] == QUALIFIED]
    assert len(attention) == 1, [layer["op"] for layer in layers]
    assert attention[0]["distribution"] == "plugrt-contrib-attention"
    assert not any("Softmax" in layer["op"] for layer in layers)
    assert len(attention[0]["onnx_nodes"]) >= 4  # MatMul, Mul, Softmax, MatMul (and K's Transpose)

    x = rng.standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"tokens": x})[0]
    got = engine.create_execution_context().execute({"tokens": x})["encoded"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_torch_exported_attention_with_computed_reshapes(rng):
    """Q, K and V shapes are equal only at the profile's shapes: the pass checks them there."""
    model = torch_exported_layer()
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry)  # no profile: the symbolic dims alone prove nothing
    assert OP_TYPE not in [node.op_type for node in graph.nodes]
    shape = (2, 5, 16)
    engine = build(model, shape, name="x", tf32=False)  # fp32 tactics: compared at fp32 tolerance
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert QUALIFIED in ops and "Softmax" not in ops, ops
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = engine.create_execution_context().execute({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_disabling_the_pass_keeps_the_unfused_layers():
    engine = build(make_encoder(), (1, 3, 32), disabled_passes={"contrib-attention:fuse_attention"})
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert QUALIFIED not in ops


def test_a_plan_built_before_op_version_1_2_still_runs(rng):
    """examples/encoder.plan holds a MultiHeadAttention of op version 1.1 (no causal, layout,
    heads attributes): the op names 1.1 in ``loads_versions``, so the plan loads and its
    attention runs as it did."""
    from plugrt.engine import Engine
    from plugrt.engine.plan_file import read_plan

    plan = MAKE_MODELS.parent / "encoder.plan"
    if not plan.exists():
        pytest.skip("examples/encoder.plan is not here")
    header, _ = read_plan(str(plan))
    recorded = {layer["op_version"] for layer in header["layers"] if layer["plugin"] == "contrib-attention"}
    if recorded != {"1.1"}:
        pytest.skip(f"examples/encoder.plan was rebuilt (op version {sorted(recorded)})")
    engine = Engine.load(str(plan))
    assert QUALIFIED in [layer["op"] for layer in engine.inspect()["layers"]]
    x = rng.standard_normal((2, 8, 32)).astype(np.float32)
    want = ort.InferenceSession(make_encoder().SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"tokens": x})[0]
    np.testing.assert_allclose(engine.create_execution_context().execute({"tokens": x})["encoded"], want,
                               rtol=1e-4, atol=1e-5)
